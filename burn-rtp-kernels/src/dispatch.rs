//! Which implementation runs a rotation step: one small trait, implemented by every inner
//! backend `Rtp` accepts.
//!
//! Its methods take operands already checked by the entry points in [`crate::kernel`]. The
//! default methods are the generic compositions of Burn ops; cube backends (wgpu, CUDA)
//! override them with the fused `#[cube]` kernels.

use crate::kernel::columns::Window;
use crate::kernel::linear::{ndarray_gemm, PackedX, XUse};
use crate::kernel::{embedding, linear};
use crate::{Float, Int};
use burn::tensor::backend::Backend;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The implementation behind a backend's rotation steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPath {
    /// Compositions of the backend's own ops (one GEMM, then a window write or an add).
    Generic,
    /// The fused `#[cube]` kernels of this crate.
    Fused,
    /// NdArray: its own GEMM (matrixmultiply) on strided views of the windows, written in
    /// place, with no copy of any operand.
    Native,
}

impl KernelPath {
    /// Whether a Linear forward step writes into the output's window directly, with no
    /// temporary block (what the ledger charges during the step).
    pub fn linear_in_place(self) -> bool {
        self != KernelPath::Generic
    }

    /// Whether an embedding forward step does: only the fused kernels (NdArray's native
    /// steps are the Linear's).
    pub fn embedding_in_place(self) -> bool {
        self == KernelPath::Fused
    }
}

impl std::fmt::Display for KernelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KernelPath::Generic => "generic",
            KernelPath::Fused => "fused",
            KernelPath::Native => "native",
        })
    }
}

static FUSED_LAUNCHES: AtomicU64 = AtomicU64::new(0);
static FUSED_OFF: AtomicBool = AtomicBool::new(false);

/// Turns the fused kernels (and NdArray's native steps) off, or back on, for the whole
/// process: every backend then runs the generic compositions. It exists to measure one
/// against the other in one run (the trainer's `--kernels generic`); results agree either
/// way to rounding.
pub fn set_fused_kernels(on: bool) {
    FUSED_OFF.store(!on, Ordering::Relaxed);
}

/// Whether cube backends run the fused kernels and NdArray its native steps (the default).
pub fn fused_kernels_enabled() -> bool {
    !FUSED_OFF.load(Ordering::Relaxed)
}

/// Steps this process has run on its own kernels so far (fused `#[cube]` launches and
/// NdArray's native steps): tests read it to prove which path ran.
pub fn fused_launches() -> u64 {
    FUSED_LAUNCHES.load(Ordering::Relaxed)
}

/// Counts one step run on this crate's own kernels.
pub(crate) fn count_fused_launch() {
    FUSED_LAUNCHES.fetch_add(1, Ordering::Relaxed);
}

/// The per-step compute of a rotation, by backend. Callers use the checked entry points
/// ([`crate::forward_step`] and the others), which call these methods.
///
/// NdArray and the cube backends implement it here. Any other backend joins with an empty
/// `impl RotationKernels for MyBackend {}`, which runs the generic compositions.
pub trait RotationKernels: Backend {
    /// The implementation this backend's steps take.
    fn kernel_path() -> KernelPath {
        KernelPath::Generic
    }

    /// `x` packed once for the steps of a pass that read it as `use_` (see
    /// [`PackedX`]); `None` where the backend's steps do not pack X.
    fn pack_x(x: &Float<Self>, use_: XUse) -> Option<PackedX> {
        let _ = (x, use_);
        None
    }

    /// `Y[.., win] = X · W_j (+ b_j)` into `y`, reading `packed` where given.
    fn linear_step(
        y: Float<Self>,
        x: Float<Self>,
        w_j: Float<Self>,
        b_j: Option<Float<Self>>,
        window: Window,
        packed: Option<&PackedX>,
    ) -> Float<Self> {
        let _ = packed;
        linear::generic::forward::<Self>(y, x, w_j, b_j, window)
    }

    /// `dX (+)= dY[.., win] · W_jᵀ`.
    fn x_grad_step(
        acc: Option<Float<Self>>,
        w_j: Float<Self>,
        dy: Float<Self>,
        window: Window,
    ) -> Float<Self> {
        linear::generic::x_grad::<Self>(acc, w_j, dy, window)
    }

    /// `(Xᵀ · dY[.., win], Σ_rows dY[.., win])`, reading `packed` where given.
    fn weight_grad_step(
        x: Float<Self>,
        dy: Float<Self>,
        window: Window,
        with_bias: bool,
        packed: Option<&PackedX>,
    ) -> (Float<Self>, Option<Float<Self>>) {
        let _ = packed;
        linear::generic::weight_grad::<Self>(x, dy, window, with_bias)
    }

    /// `Y[.., win] = W_j[indices]` into `y`.
    fn embedding_step(
        y: Float<Self>,
        w_j: Float<Self>,
        indices: Int<Self>,
        window: Window,
    ) -> Float<Self> {
        embedding::generic::forward::<Self>(y, w_j, indices, window)
    }

    /// `G_j[indices[r]] += dY[r, win]` into a new `[n_embeddings, w]` tensor.
    fn embedding_grad_step(
        n_embeddings: usize,
        dy: Float<Self>,
        indices: Int<Self>,
        window: Window,
    ) -> Float<Self> {
        embedding::generic::grad::<Self>(n_embeddings, dy, indices, window)
    }
}

/// NdArray runs the Linear steps as matrixmultiply GEMMs on strided views
/// (`kernel/linear/ndarray_gemm.rs`), and the generic composition for what they cannot take
/// (element types other than f32 and f64, operands not in row-major order) and for the
/// embedding.
impl<E, I, Q> RotationKernels for burn::backend::NdArray<E, I, Q>
where
    E: burn::backend::ndarray::FloatNdArrayElement,
    I: burn::backend::ndarray::IntNdArrayElement,
    Q: burn::backend::ndarray::QuantElement,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<I>>,
{
    fn kernel_path() -> KernelPath {
        if fused_kernels_enabled() {
            KernelPath::Native
        } else {
            KernelPath::Generic
        }
    }

    fn pack_x(x: &Float<Self>, use_: XUse) -> Option<PackedX> {
        fused_kernels_enabled()
            .then(|| ndarray_gemm::pack_x(x, use_))
            .flatten()
    }

    fn linear_step(
        y: Float<Self>,
        x: Float<Self>,
        w_j: Float<Self>,
        b_j: Option<Float<Self>>,
        window: Window,
        packed: Option<&PackedX>,
    ) -> Float<Self> {
        let y = match fused_kernels_enabled() {
            true => match ndarray_gemm::forward(y, &x, &w_j, b_j.as_ref(), window, packed) {
                Ok(y) => {
                    count_fused_launch();
                    return y;
                }
                Err(y) => y,
            },
            false => y,
        };
        linear::generic::forward::<Self>(y, x, w_j, b_j, window)
    }

    fn x_grad_step(
        acc: Option<Float<Self>>,
        w_j: Float<Self>,
        dy: Float<Self>,
        window: Window,
    ) -> Float<Self> {
        let acc = match fused_kernels_enabled() {
            true => match ndarray_gemm::x_grad(acc, &w_j, &dy, window) {
                Ok(sum) => {
                    count_fused_launch();
                    return sum;
                }
                Err(acc) => acc,
            },
            false => acc,
        };
        linear::generic::x_grad::<Self>(acc, w_j, dy, window)
    }

    fn weight_grad_step(
        x: Float<Self>,
        dy: Float<Self>,
        window: Window,
        with_bias: bool,
        packed: Option<&PackedX>,
    ) -> (Float<Self>, Option<Float<Self>>) {
        if fused_kernels_enabled() {
            if let Some(dw) = ndarray_gemm::weight_grad(&x, &dy, window, packed) {
                count_fused_launch();
                // Burn's own sum over the window read in place: the composition's bits.
                let db = with_bias.then(|| {
                    let dy_j = ndarray_gemm::column_view(dy, window).unwrap_or_else(|dy| {
                        crate::column_slice::<Self>(dy, window.start, window.len)
                    });
                    <Self as burn::tensor::ops::ModuleOps<Self>>::linear_bias_backward(dy_j)
                });
                return (dw, db);
            }
        }
        linear::generic::weight_grad::<Self>(x, dy, window, with_bias)
    }
}

/// Burn's fusion backend records ops lazily; its steps stay compositions of its own ops,
/// which it fuses as it sees fit.
#[cfg(feature = "fusion")]
impl<B: burn_fusion::FusionBackend> RotationKernels for burn_fusion::Fusion<B> {}

#[cfg(feature = "cube")]
mod cube {
    use super::*;
    use crate::kernel::embedding::{gather, scatter};
    use crate::kernel::linear::launch;
    use burn::tensor::backend::DeviceOps;
    use burn_cubecl::cubecl::server::ComputeServer;
    use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

    /// Cube backends (wgpu, CUDA, ...) run the fused kernels.
    impl<R, F, I, BT> RotationKernels for CubeBackend<R, F, I, BT>
    where
        R: CubeRuntime,
        R::Server: ComputeServer,
        R::Device: DeviceOps,
        F: FloatElement,
        I: IntElement,
        BT: BoolElement,
    {
        fn kernel_path() -> KernelPath {
            if fused_kernels_enabled() {
                KernelPath::Fused
            } else {
                KernelPath::Generic
            }
        }

        fn linear_step(
            y: Float<Self>,
            x: Float<Self>,
            w_j: Float<Self>,
            b_j: Option<Float<Self>>,
            window: Window,
            _packed: Option<&PackedX>,
        ) -> Float<Self> {
            match fused_kernels_enabled() {
                true => launch::forward(y, x, w_j, b_j, window),
                false => linear::generic::forward::<Self>(y, x, w_j, b_j, window),
            }
        }

        fn x_grad_step(
            acc: Option<Float<Self>>,
            w_j: Float<Self>,
            dy: Float<Self>,
            window: Window,
        ) -> Float<Self> {
            match fused_kernels_enabled() {
                true => launch::x_grad(acc, w_j, dy, window),
                false => linear::generic::x_grad::<Self>(acc, w_j, dy, window),
            }
        }

        fn weight_grad_step(
            x: Float<Self>,
            dy: Float<Self>,
            window: Window,
            with_bias: bool,
            _packed: Option<&PackedX>,
        ) -> (Float<Self>, Option<Float<Self>>) {
            match fused_kernels_enabled() {
                true => launch::weight_grad(x, dy, window, with_bias),
                false => linear::generic::weight_grad::<Self>(x, dy, window, with_bias),
            }
        }

        fn embedding_step(
            y: Float<Self>,
            w_j: Float<Self>,
            indices: Int<Self>,
            window: Window,
        ) -> Float<Self> {
            match fused_kernels_enabled() {
                true => gather::launch(y, w_j, indices, window),
                false => embedding::generic::forward::<Self>(y, w_j, indices, window),
            }
        }

        fn embedding_grad_step(
            n_embeddings: usize,
            dy: Float<Self>,
            indices: Int<Self>,
            window: Window,
        ) -> Float<Self> {
            match fused_kernels_enabled() {
                true => scatter::launch(n_embeddings, dy, indices, window),
                false => embedding::generic::grad::<Self>(n_embeddings, dy, indices, window),
            }
        }
    }
}
