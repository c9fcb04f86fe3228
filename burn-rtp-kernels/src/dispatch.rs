//! The interface between a rotation step and the backend that runs it: one small trait,
//! implemented by every inner backend `Rtp` accepts, and the proof of checked operands its
//! steps take.
//!
//! The implementations live beside their kernels; the process-wide switch and the launch
//! counters live in [`crate::switches`].

use crate::columns::Window;
use crate::generic::embedding as embedding_generic;
use crate::generic::linear as linear_generic;
use crate::packing::{PackedX, XUse};
use crate::{Float, Int};
use burn::tensor::backend::Backend;

/// Proof that a step's operands were checked: their shapes agree, and the window lies
/// inside the tensor it reads or writes. Only this crate's checked entry points make one, so
/// no safe code reaches a kernel that trusts its operands without the check.
///
/// ```compile_fail
/// // Outside this crate a `Checked` cannot be made, so no step can be called directly:
/// let checked = burn_rtp_kernels::Checked(());
/// ```
#[derive(Debug)]
pub struct Checked(());

impl Checked {
    /// Made by an entry point right after its checks passed, for the one call that follows.
    pub(crate) fn after_checks() -> Self {
        Checked(())
    }
}

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

/// The per-step compute of a rotation, by backend.
///
/// Its methods launch kernels that trust their operands: the cube backends' `#[cube]`
/// kernels index without bounds checks. So each step method takes a [`Checked`], which only
/// this crate's entry points ([`crate::forward_step`] and the others) can make, once they
/// checked the operands' shapes against each other and the window against the tensor it
/// reads or writes. Safe code outside this crate can therefore implement the trait, but not
/// call its steps with operands nobody checked.
///
/// NdArray implements it beside its GEMM (`kernel/linear/ndarray_gemm.rs`), and the cube
/// backends beside their kernels (`kernel/cube.rs`). Any other backend joins with an empty
/// `impl RotationKernels for MyBackend {}`, which runs the generic compositions.
pub trait RotationKernels: Backend {
    /// A tensor of `shape` with every element `value`. Burn's default fills a `TensorData`
    /// element by element and then builds the tensor from it; NdArray fills its array in one
    /// pass. The decorator creates its zeros, ones, fills and outputs through it.
    fn filled(
        shape: burn::tensor::Shape,
        value: f32,
        device: &burn::tensor::Device<Self>,
        dtype: burn::tensor::FloatDType,
    ) -> Float<Self> {
        Self::float_full(shape, value.into(), device, dtype)
    }

    /// `lhs · rhs` (batched), as `Self`'s own `float_matmul` computes it, without copying
    /// strided operands where this crate has a kernel for `Self` (NdArray; see
    /// `kernel/matmul`). The decorator calls it for every matmul.
    fn fused_matmul(lhs: Float<Self>, rhs: Float<Self>) -> Float<Self> {
        Self::float_matmul(lhs, rhs)
    }

    /// One Adam step over a shard: `(param, moment 1, moment 2)` after `step`, from the
    /// parameter, its gradient and the moments (`None` on the first step), in one pass where
    /// this crate has a kernel for `Self` (NdArray; see `kernel/adam`), bit for bit as
    /// burn-optim's `Adam`. Elsewhere the operands come back and the caller runs Burn's Adam.
    #[allow(clippy::type_complexity)]
    fn fused_adam(
        param: Float<Self>,
        grad: Float<Self>,
        moments: Option<(Float<Self>, Float<Self>)>,
        step: &crate::AdamStep,
    ) -> Result<[Float<Self>; 3], (Float<Self>, Float<Self>, Option<(Float<Self>, Float<Self>)>)>
    {
        let _ = step;
        Err((param, grad, moments))
    }

    /// GELU, as `Self`'s own `ActivationOps::gelu` computes it, in one pass where this crate
    /// has a kernel for `Self` (NdArray; see `kernel/gelu`). The decorator calls it for
    /// every GELU unless `RtpConfig::with_fused_activations(false)`.
    fn fused_gelu(x: Float<Self>) -> Float<Self> {
        <Self as burn::tensor::ops::ActivationOps<Self>>::gelu(x)
    }

    /// GELU's backward, `grad · gelu'(x)`, as `Self`'s own `ActivationOps::gelu_backward`
    /// computes it, in one pass where this crate has a kernel for `Self`.
    fn fused_gelu_backward(x: Float<Self>, grad: Float<Self>) -> Float<Self> {
        <Self as burn::tensor::ops::ActivationOps<Self>>::gelu_backward(x, grad)
    }

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
        checked: Checked,
    ) -> Float<Self> {
        let _ = (packed, checked);
        linear_generic::forward::<Self>(y, x, w_j, b_j, window)
    }

    /// `dX (+)= dY[.., win] · W_jᵀ`.
    fn x_grad_step(
        acc: Option<Float<Self>>,
        w_j: Float<Self>,
        dy: Float<Self>,
        window: Window,
        checked: Checked,
    ) -> Float<Self> {
        let _ = checked;
        linear_generic::x_grad::<Self>(acc, w_j, dy, window)
    }

    /// `(Xᵀ · dY[.., win], Σ_rows dY[.., win])`, reading `packed` where given.
    fn weight_grad_step(
        x: Float<Self>,
        dy: Float<Self>,
        window: Window,
        with_bias: bool,
        packed: Option<&PackedX>,
        checked: Checked,
    ) -> (Float<Self>, Option<Float<Self>>) {
        let _ = (packed, checked);
        linear_generic::weight_grad::<Self>(x, dy, window, with_bias)
    }

    /// `Y[.., win] = W_j[indices]` into `y`.
    fn embedding_step(
        y: Float<Self>,
        w_j: Float<Self>,
        indices: Int<Self>,
        window: Window,
        checked: Checked,
    ) -> Float<Self> {
        let _ = checked;
        embedding_generic::forward::<Self>(y, w_j, indices, window)
    }

    /// `G_j[indices[r]] += dY[r, win]` into a new `[n_embeddings, w]` tensor.
    fn embedding_grad_step(
        n_embeddings: usize,
        dy: Float<Self>,
        indices: Int<Self>,
        window: Window,
        checked: Checked,
    ) -> Float<Self> {
        let _ = checked;
        embedding_generic::grad::<Self>(n_embeddings, dy, indices, window)
    }
}
