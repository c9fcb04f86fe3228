//! `G_j[indices[r], c] += dY[r, start + c]`: one unit per column, walking the rows in order.
//!
//! A row of the table that several tokens look up is summed by one unit, in token order, so
//! the result needs no float atomics (wgpu has none) and is the same on every run.

use crate::columns::Window;
use crate::switches::count_fused_launch;
use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::zeros_client;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

/// Tokens whose index is out of range are skipped: never a write outside the gradient.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn scatter_window<F: Float, I: Numeric>(
    grad: &Tensor<F>,
    indices: &Tensor<I>,
    out: &mut Tensor<F>,
    rows: usize,
    width: usize,
    n_embeddings: usize,
    grad_row: usize,
    start: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let c = ABSOLUTE_POS;
    if c >= width {
        terminate!();
    }
    for r in 0..rows {
        let e = usize::cast_from(indices[r]);
        if e < n_embeddings {
            out[e * width + c] += grad[r * grad_row + start + c];
        }
    }
}

/// A new `[n_embeddings, w]` gradient of the window's columns.
pub(crate) fn launch<R: CubeRuntime>(
    n_embeddings: usize,
    dy: CubeTensor<R>,
    indices: CubeTensor<R>,
    window: Window,
) -> CubeTensor<R> {
    let (dy, indices) = (into_contiguous(dy), into_contiguous(indices));
    let rows = indices.shape().num_elements();
    let columns = dy.shape()[dy.shape().num_dims() - 1];
    let client = dy.client.clone();
    let out = zeros_client(
        client.clone(),
        dy.device.clone(),
        Shape::new([n_embeddings, window.len]),
        dy.dtype,
    );
    if window.len == 0 || rows == 0 {
        return out;
    }
    // Checked again here, in O(1), whatever the caller checked (see the GEMM's launch).
    assert!(
        window.start + window.len <= columns && dy.shape().num_elements() >= rows * columns,
        "burn-rtp-kernels: an embedding scatter of {rows} rows from columns {}..{} of {:?}: a \
         step was given a window its operands were not checked for",
        window.start,
        window.start + window.len,
        dy.shape().to_vec(),
    );
    let cube_dim = CubeDim::new(&client, window.len);
    let cube_count = calculate_cube_count_elemwise(&client, window.len, cube_dim);
    let dtypes = [dy.dtype.into(), indices.dtype.into()];
    count_fused_launch();
    // SAFETY: `c < width` and `e < n_embeddings` bound every write; `r < rows` indexes
    // `indices`; the assertion above checked `start + c < columns` and that `dy` holds
    // `rows × columns` elements.
    unsafe {
        scatter_window::launch_unchecked::<R>(
            &client,
            cube_count,
            cube_dim,
            dy.into_tensor_arg(),
            indices.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            rows,
            window.len,
            n_embeddings,
            columns,
            window.start,
            dtypes,
        )
    };
    out
}
