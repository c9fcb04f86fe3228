//! `Y[r, start + c] = W_j[indices[r], c]`: one unit per output element of the window.

use crate::columns::Window;
use crate::kernel::writable;
use crate::switches::count_fused_launch;
use burn::tensor::TensorMetadata;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

/// Rows of `table` whose index is out of range read as zeros: a bad index never reads
/// outside the table.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn gather_window<F: Float, I: Numeric>(
    table: &Tensor<F>,
    indices: &Tensor<I>,
    out: &mut Tensor<F>,
    rows: usize,
    width: usize,
    n_embeddings: usize,
    out_row: usize,
    start: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    if ABSOLUTE_POS >= rows * width {
        terminate!();
    }
    let r = ABSOLUTE_POS / width;
    let c = ABSOLUTE_POS % width;
    let e = usize::cast_from(indices[r]);
    let mut v = F::new(0.0);
    if e < n_embeddings {
        v = table[e * width + c];
    }
    out[r * out_row + start + c] = v;
}

/// Gathers into `y`'s window (a private copy of `y` if its buffer is shared); returns it.
pub(crate) fn launch<R: CubeRuntime>(
    y: CubeTensor<R>,
    w_j: CubeTensor<R>,
    indices: CubeTensor<R>,
    window: Window,
) -> CubeTensor<R> {
    let y = writable(y);
    let (table, indices) = (into_contiguous(w_j), into_contiguous(indices));
    let rows = indices.shape().num_elements();
    let columns = y.shape()[y.shape().num_dims() - 1];
    let n_embeddings = table.shape()[0];
    let units = rows * window.len;
    if units == 0 {
        return y;
    }
    // Checked again here, in O(1), whatever the caller checked (see the GEMM's launch): the
    // window inside `y`'s columns, `y` holding every row, the table as wide as the window.
    let table_width = table.shape()[table.shape().num_dims() - 1];
    assert!(
        window.start + window.len <= columns
            && y.shape().num_elements() >= rows * columns
            && table_width == window.len,
        "burn-rtp-kernels: an embedding gather of {rows} rows into columns {}..{} of {:?} from a \
         table {:?}: a step was given a window its operands were not checked for",
        window.start,
        window.start + window.len,
        y.shape().to_vec(),
        table.shape().to_vec(),
    );
    let client = y.client.clone();
    let cube_dim = CubeDim::new(&client, units);
    let cube_count = calculate_cube_count_elemwise(&client, units, cube_dim);
    let dtypes = [y.dtype.into(), indices.dtype.into()];
    count_fused_launch();
    // SAFETY: units past `rows × width` stop; `r < rows` indexes `indices`; `e` is checked
    // against the table's rows; the assertion above checked `start + c < columns`, that `y`
    // holds `rows × columns` elements and that the table's rows are `width` wide.
    unsafe {
        gather_window::launch_unchecked::<R>(
            &client,
            cube_count,
            cube_dim,
            table.into_tensor_arg(),
            indices.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            rows,
            window.len,
            n_embeddings,
            columns,
            window.start,
            dtypes,
        )
    };
    y
}
