//! Launches of [`gemm_window`] for the three Linear steps, on any cubecl runtime.
//!
//! Shapes and windows are checked by the caller ([`super`]) before anything here runs; these
//! functions only turn tensors into operands (offset and strides) and pick the launch grid.

use super::gemm::{gemm_window, StridedLaunch, DEPTH, UNITS};
use crate::dispatch::count_fused_launch;
use crate::kernel::columns::Window;
use crate::kernel::writable;
use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Outputs each unit computes along rows and columns: a 128 × 128 block per cube of 256
/// units. On lavapipe the step time fell with every doubling of the register tile (1 × 1:
/// 241 ms, 2 × 2: 116, 4 × 4: 56, 8 × 8: 29 for config A's forward step): shared-memory
/// loads, not arithmetic, bound it there.
const TM: usize = 8;
const TN: usize = 8;

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

    /// The same matrix read transposed.
    fn transposed(self) -> Self {
        Operand {
            rows: self.cols,
            cols: self.rows,
            ..self
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
    // With no rows of C the column sums still need the first block row of cubes.
    let block_rows = m.div_ceil(UNITS * TM).max(usize::from(sums.is_some()));
    if n == 0 || block_rows == 0 {
        return;
    }
    let client = c.tensor.client.clone();
    let cube_count = CubeCount::Static(n.div_ceil(UNITS * TN) as u32, block_rows as u32, 1);
    let cube_dim = CubeDim::new_2d(UNITS as u32, UNITS as u32);
    let with_bias = bias.is_some();
    let col_sums = sums.is_some();
    // Unused tensor slots are bound to an operand the kernel never reads (comptime-off).
    let bias = bias.unwrap_or_else(|| a.tensor.clone());
    let sums = sums.cloned().unwrap_or_else(|| c.tensor.clone());
    count_fused_launch();
    // SAFETY: every index the kernel forms is guarded by `r < m`, `col < n`, `kk < k`, and
    // the caller checked that each operand's `m × k`, `k × n` or `m × n` matrix at its offset
    // and strides lies inside its buffer.
    unsafe {
        gemm_window::launch_unchecked::<R>(
            &client,
            cube_count,
            cube_dim,
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
            UNITS,
            DEPTH,
            TM,
            TN,
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
