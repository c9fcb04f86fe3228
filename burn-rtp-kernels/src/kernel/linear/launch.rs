//! Launches of [`gemm_window`] for the three Linear steps, on any cubecl runtime.
//!
//! Shapes and windows are checked by the caller ([`super`]) before anything here runs; these
//! functions only turn tensors into operands (offset and strides) and pick the launch grid.

use super::gemm::{gemm_window, StridedLaunch, Tiling};
use crate::columns::Window;
use crate::kernel::writable;
use crate::switches::count_fused_launch;
use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use std::sync::atomic::{AtomicU8, Ordering};

/// The launch shape on devices with subgroup (plane) operations, i.e. GPUs: 16 × 16 units of
/// 8 × 8 outputs (a 128 × 128 block per cube, 64 accumulators per unit).
const GPU_TILING: Tiling = Tiling {
    units_m: 16,
    units_n: 16,
    tm: 8,
    tn: 8,
    depth: 16,
};

/// The launch shape on devices without them, i.e. CPU rasterisers such as Mesa's lavapipe
/// (cubecl-wgpu turns plane operations off for CPU adapters): 8 × 8 units of 16 × 16 outputs.
/// There a load is a loop over the SIMD lanes and registers spill to the L1 cache cheaply, so
/// the larger register tile (8 vector loads per 256 multiply-adds, against 4 per 64) wins; on
/// a GPU its 256 accumulators would spill.
const CPU_TILING: Tiling = Tiling {
    units_m: 8,
    units_n: 8,
    tm: 16,
    tn: 16,
    depth: 16,
};

/// Which register tiling the fused GEMM launches with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmTiling {
    /// Chosen per launch (the default): [`GemmTiling::Cpu`] on devices without plane
    /// operations when A, B and C are all read and written in vectors of 4, else
    /// [`GemmTiling::Gpu`].
    Auto,
    /// 16 × 16 units of 8 × 8 outputs per cube: GPUs.
    Gpu,
    /// 8 × 8 units of 16 × 16 outputs per cube: CPU rasterisers such as Mesa's lavapipe.
    Cpu,
}

/// The process-wide choice: 0 auto, 1 GPU, 2 CPU.
static TILING: AtomicU8 = AtomicU8::new(0);

/// Forces one tiling for every fused GEMM launched from now on in this process, or gives the
/// choice back to the launch ([`GemmTiling::Auto`]). Every tiling computes the same results;
/// this exists to test and measure each on any device.
pub fn set_gemm_tiling(tiling: GemmTiling) {
    let code = match tiling {
        GemmTiling::Auto => 0,
        GemmTiling::Gpu => 1,
        GemmTiling::Cpu => 2,
    };
    TILING.store(code, Ordering::Relaxed);
}

/// The tiling of one launch on the device of `client`, whose operands load in vectors of
/// `na`, `nb` and `nc` elements.
///
/// Without plane operations (cubecl-wgpu turns them off for CPU adapters) the wide tile wins
/// when every operand moves in vectors. With a scalar fallback its staging and stores are four
/// times the code, and lavapipe then spends seconds compiling each variant (its coroutine
/// lowering of the barriers grows with the blocks and the live accumulators), so the launch
/// takes the small tile.
fn tiling<R: CubeRuntime>(
    client: &ComputeClient<R>,
    (na, nb, nc): (usize, usize, usize),
) -> Tiling {
    match TILING.load(Ordering::Relaxed) {
        1 => return GPU_TILING,
        2 => return CPU_TILING,
        _ => {}
    }
    let planes = client
        .properties()
        .features
        .plane
        .contains(cubecl::ir::features::Plane::Ops);
    if !planes && na == 4 && nb == 4 && nc == 4 {
        CPU_TILING
    } else {
        GPU_TILING
    }
}

/// A 2-D operand: the tensor, and where its `[rows, cols]` matrix lies in its buffer.
struct Operand<R: CubeRuntime> {
    tensor: CubeTensor<R>,
    offset: usize,
    rows: usize,
    cols: usize,
}

impl<R: CubeRuntime> Operand<R> {
    /// All leading dimensions of a contiguous tensor folded into rows: `[.., d]` as
    /// `[rows, d]`, columns `window` of it.
    fn folded(tensor: CubeTensor<R>, window: Window) -> Self {
        let tensor = into_contiguous(tensor);
        let strides = tensor.meta.strides().to_vec();
        let last = strides.len() - 1;
        let row = if last == 0 { 0 } else { strides[last - 1] };
        Operand {
            offset: window.start * strides[last],
            rows: row,
            cols: strides[last],
            tensor,
        }
    }

    /// Whether a `rows × cols` matrix at this operand's offset and strides lies inside its
    /// tensor's elements: the last element it reaches is in the buffer (strides are not
    /// negative, so every other one is too).
    fn holds(&self, rows: usize, cols: usize) -> bool {
        rows == 0
            || cols == 0
            || self.offset + (rows - 1) * self.rows + (cols - 1) * self.cols
                < self.tensor.shape().num_elements()
    }

    /// The same matrix read transposed.
    fn transposed(self) -> Self {
        Operand {
            rows: self.cols,
            cols: self.rows,
            ..self
        }
    }

    /// Whether the matrix's elements are adjacent along its columns (unit stride between
    /// columns); else along its rows. Every operand is a contiguous tensor read straight or
    /// transposed, so one of the two holds.
    fn along_cols(&self) -> bool {
        self.cols == 1
    }

    /// The vector size the kernel may load this `rows × cols` matrix with: 4 when its
    /// elements are adjacent along one dimension and that extent, the offset and the other
    /// stride are all multiples of 4, so that every vector of 4 lies wholly inside or outside
    /// the matrix; else 1.
    fn vector_size(&self, rows: usize, cols: usize, max: usize) -> usize {
        let fits = |extent: usize, other_stride: usize, other_extent: usize| {
            extent.is_multiple_of(4)
                && self.offset.is_multiple_of(4)
                && (other_stride.is_multiple_of(4) || other_extent <= 1)
        };
        let whole = if self.along_cols() {
            fits(cols, self.rows, rows)
        } else {
            self.rows == 1 && fits(rows, self.cols, cols)
        };
        if max >= 4 && whole {
            4
        } else {
            1
        }
    }

    fn at(&self) -> StridedLaunch<R> {
        StridedLaunch::new(self.offset, self.rows, self.cols)
    }
}

/// Rows of a tensor with all leading dimensions folded.
fn rows_of<R: CubeRuntime>(t: &CubeTensor<R>) -> usize {
    let dims = t.shape().to_vec();
    dims[..dims.len() - 1].iter().product()
}

/// One launch of [`gemm_window`] over an `m × n` output.
#[allow(clippy::too_many_arguments)]
fn launch<R: CubeRuntime>(
    a: &Operand<R>,
    b: &Operand<R>,
    c: &Operand<R>,
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
    bias: Option<CubeTensor<R>>,
    sums: Option<&CubeTensor<R>>,
) {
    // The kernel trusts its operands. The entry points checked them, but a step can be called
    // with any `Window` by code holding a `Checked` (a backend's own `RotationKernels` impl
    // receives one), so the launch checks again what the kernel relies on, in O(1): no
    // window, however made, reaches memory outside the operands.
    let in_bounds = a.holds(m, k)
        && b.holds(k, n)
        && c.holds(m, n)
        && bias.as_ref().is_none_or(|t| t.shape().num_elements() >= n)
        && sums.is_none_or(|t| t.shape().num_elements() >= n);
    assert!(
        in_bounds,
        "burn-rtp-kernels: a fused GEMM of [{m}, {k}] by [{k}, {n}] was launched on operands \
         that do not hold it (A {:?} from element {}, B {:?} from {}, C {:?} from {}): a step \
         was given a window its operands were not checked for",
        a.tensor.shape().to_vec(),
        a.offset,
        b.tensor.shape().to_vec(),
        b.offset,
        c.tensor.shape().to_vec(),
        c.offset,
    );
    let client = c.tensor.client.clone();
    // Which way each operand's elements are adjacent decides how units share out its loads
    // (every operand is a contiguous tensor, read straight or transposed).
    let (a_along_k, b_along_n) = (a.along_cols(), b.along_cols());
    debug_assert!(
        a_along_k || a.rows == 1,
        "A is adjacent along neither dimension"
    );
    debug_assert!(
        b_along_n || b.rows == 1,
        "B is adjacent along neither dimension"
    );
    let max_vector = client.properties().hardware.max_vector_size;
    let (na, nb) = (
        a.vector_size(m, k, max_vector),
        b.vector_size(k, n, max_vector),
    );
    // C (and the bias, contiguous along N like C's rows) in vectors when C's rows allow.
    let nc = if c.along_cols() {
        c.vector_size(m, n, max_vector)
    } else {
        1
    };
    let tiling = tiling(&client, (na, nb, nc));
    debug_assert!(tiling.is_valid(), "{tiling:?}");
    // With no rows of C the column sums still need the first block row of cubes.
    let block_rows = m
        .div_ceil(tiling.block_m())
        .max(usize::from(sums.is_some()));
    if n == 0 || block_rows == 0 {
        return;
    }
    let cube_count = CubeCount::Static(n.div_ceil(tiling.block_n()) as u32, block_rows as u32, 1);
    let cube_dim = CubeDim::new_2d(tiling.units_n as u32, tiling.units_m as u32);
    let with_bias = bias.is_some();
    let col_sums = sums.is_some();
    // Unused tensor slots are bound to an operand the kernel never reads (comptime-off).
    let bias = bias.unwrap_or_else(|| a.tensor.clone());
    let sums = sums.cloned().unwrap_or_else(|| c.tensor.clone());
    count_fused_launch();
    // SAFETY: every index the kernel forms is guarded by `r < m`, `col < n`, `kk < k`, and
    // the assertion above checked that each operand's `m × k`, `k × n` or `m × n` matrix at
    // its offset and strides lies inside its buffer, and the bias and sums hold `n`.
    unsafe {
        gemm_window::launch_unchecked::<R>(
            &client,
            cube_count,
            cube_dim,
            na,
            nb,
            nc,
            a.tensor.clone().into_tensor_arg(),
            b.tensor.clone().into_tensor_arg(),
            c.tensor.clone().into_tensor_arg(),
            bias.into_tensor_arg(),
            sums.into_tensor_arg(),
            a.at(),
            b.at(),
            c.at(),
            m,
            n,
            k,
            tiling,
            a_along_k,
            b_along_n,
            accumulate,
            with_bias,
            col_sums,
            c.tensor.dtype.into(),
        );
    }
}

/// `Y[.., win] = X · W_j (+ b_j)`, written into `y`'s window; returns `y`.
pub(crate) fn forward<R: CubeRuntime>(
    y: CubeTensor<R>,
    x: CubeTensor<R>,
    w_j: CubeTensor<R>,
    b_j: Option<CubeTensor<R>>,
    window: Window,
) -> CubeTensor<R> {
    let (m, k, n) = (rows_of(&x), w_j.shape()[0], window.len);
    let x = Operand::folded(x, Window::all(k));
    let w = Operand::folded(w_j, Window::all(n));
    let y = Operand::folded(writable(y), window);
    let b_j = b_j.map(into_contiguous);
    launch(&x, &w, &y, (m, n, k), false, b_j, None);
    y.tensor
}

/// `dX (+)= dY[.., win] · W_jᵀ`: into `acc` when given (accumulated), else a new tensor
/// shaped like `dy` with `d_in` columns.
pub(crate) fn x_grad<R: CubeRuntime>(
    acc: Option<CubeTensor<R>>,
    w_j: CubeTensor<R>,
    dy: CubeTensor<R>,
    window: Window,
) -> CubeTensor<R> {
    let (m, k, n) = (rows_of(&dy), window.len, w_j.shape()[0]);
    let accumulate = acc.is_some();
    let out = acc.map(writable).unwrap_or_else(|| {
        let mut dims = dy.shape().to_vec();
        *dims.last_mut().expect("dy has dimensions") = n;
        empty_device_contiguous_dtype(
            dy.client.clone(),
            dy.device.clone(),
            Shape::from(dims),
            dy.dtype,
        )
    });
    let w_t = Operand::folded(w_j, Window::all(k)).transposed();
    let dy = Operand::folded(dy, window);
    let dx = Operand::folded(out, Window::all(n));
    launch(&dy, &w_t, &dx, (m, n, k), accumulate, None, None);
    dx.tensor
}

/// `(Xᵀ · dY[.., win], Σ_rows dY[.., win])` in one launch (the sum only `with_bias`).
pub(crate) fn weight_grad<R: CubeRuntime>(
    x: CubeTensor<R>,
    dy: CubeTensor<R>,
    window: Window,
    with_bias: bool,
) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    let d_in = x.shape()[x.shape().num_dims() - 1];
    let (m, k, n) = (d_in, rows_of(&x), window.len);
    let (client, device, dtype) = (dy.client.clone(), dy.device.clone(), dy.dtype);
    let out =
        empty_device_contiguous_dtype(client.clone(), device.clone(), Shape::new([m, n]), dtype);
    // Zeros: with no rows at all the sums are never written.
    let sums = with_bias.then(|| zeros_client(client, device, Shape::new([n]), dtype));
    let x_t = Operand::folded(x, Window::all(d_in)).transposed();
    let dy = Operand::folded(dy, window);
    let g = Operand::folded(out, Window::all(n));
    launch(&x_t, &dy, &g, (m, n, k), false, None, sums.as_ref());
    (g.tensor, sums)
}
