//! The Linear steps on NdArray: matrixmultiply's GEMM (through `ndarray`, as burn-ndarray
//! multiplies) run on strided views of the operands where they lie, so nothing is copied.
//!
//! Why not Burn's ops, as [`super::generic`] does: burn-ndarray copies both operands of every
//! matmul (its reshape turns a view into a new array, element by element through a
//! dynamic-rank iterator when the operand is strided, as `Wᵀ` and `Xᵀ` are), and its
//! `float_slice` copies a window. A rotation runs N GEMMs per Linear where data parallelism
//! runs one, so the compositions copy X, `Xᵀ` and each window of dY N times per pass: 12% of
//! an RTP rank's time on config A at N = 4 (perf). The GEMM packs its operands whatever
//! their strides, so a window or a transpose read in place costs nothing extra.
//!
//! Rounding: an output element is the same dot product as in the compositions
//! (matrixmultiply's arithmetic per element depends on K and its blocks of K, not on M, N or
//! the strides), so the forward step equals [`super::generic::forward`] bit for bit. The
//! gradient steps add each product into their accumulator inside the GEMM (`beta = 1`):
//! that is the compositions' `acc + product` bit for bit while the summed dimension fits in
//! one of matrixmultiply's K blocks (256 for f32: windows of up to 256 columns for dX, samples
//! of up to 256 rows for dW), and past that the same sum rounded in another order.
//!
//! Each function takes what it cannot run (another element type, an operand not in row-major
//! order) back as `Err`, and the caller runs the composition instead.

use crate::kernel::columns::Window;
use burn::backend::ndarray::NdArrayTensor;
use ndarray::linalg::general_mat_mul;
use ndarray::{s, ArcArray, Array2, ArrayView2, ArrayViewD, Axis, Ix1, Ix3, IxDyn, LinalgScalar};

/// The float elements NdArray's tensors hold, and the way to their arrays.
trait Elem: LinalgScalar + std::ops::AddAssign {
    /// A view of `t`'s elements, if `t` holds this element type.
    fn view(t: &NdArrayTensor) -> Option<ArrayViewD<'_, Self>>;
    /// `t`'s array (shared, not copied), or `t` back if it holds another element type.
    fn array(t: NdArrayTensor) -> Result<ArcArray<Self, IxDyn>, NdArrayTensor>;
    /// The tensor of an array.
    fn tensor(a: ArcArray<Self, IxDyn>) -> NdArrayTensor;
}

/// Implements [`Elem`] for one element type and its `NdArrayTensor` variant.
macro_rules! elem {
    ($ty:ty, $variant:ident) => {
        impl Elem for $ty {
            fn view(t: &NdArrayTensor) -> Option<ArrayViewD<'_, Self>> {
                match t {
                    NdArrayTensor::$variant(s) => Some(s.view()),
                    _ => None,
                }
            }
            fn array(t: NdArrayTensor) -> Result<ArcArray<Self, IxDyn>, NdArrayTensor> {
                match t {
                    NdArrayTensor::$variant(s) => Ok(s.into_shared()),
                    t => Err(t),
                }
            }
            fn tensor(a: ArcArray<Self, IxDyn>) -> NdArrayTensor {
                a.into()
            }
        }
    };
}
elem!(f32, F32);
elem!(f64, F64);

/// Runs `$f::<E>` for the element type of `$t` (f32 or f64); any other gives `$none`.
macro_rules! by_elem {
    ($t:expr, $f:ident ( $($arg:expr),* ), $none:expr) => {
        match $t {
            NdArrayTensor::F32(_) => $f::<f32>($($arg),*),
            NdArrayTensor::F64(_) => $f::<f64>($($arg),*),
            _ => $none,
        }
    };
}

/// `a` as `[rows, columns]` (every leading dimension folded into the rows), if it is in
/// row-major order; the view shares `a`'s elements.
fn matrix<'a, E>(a: ArrayViewD<'a, E>) -> Option<ArrayView2<'a, E>> {
    let columns = *a.shape().last()?;
    let rows = a.len().checked_div(columns).unwrap_or(0);
    if !a.is_standard_layout() {
        return None;
    }
    a.into_shape_with_order((rows, columns)).ok()
}

/// Columns `window` of a `[rows, columns]` view.
fn columns<'a, E>(m: ArrayView2<'a, E>, window: Window) -> ArrayView2<'a, E> {
    m.slice_move(s![.., window.start..window.start + window.len])
}

/// `Y[.., win] = X · W_j (+ b_j)`, written into `y`'s window; `Err(y)` if it cannot run.
pub(crate) fn forward(
    y: NdArrayTensor,
    x: &NdArrayTensor,
    w_j: &NdArrayTensor,
    b_j: Option<&NdArrayTensor>,
    window: Window,
) -> Result<NdArrayTensor, NdArrayTensor> {
    by_elem!(x, forward_in(y, x, w_j, b_j, window), Err(y))
}

fn forward_in<E: Elem>(
    y: NdArrayTensor,
    x: &NdArrayTensor,
    w_j: &NdArrayTensor,
    b_j: Option<&NdArrayTensor>,
    window: Window,
) -> Result<NdArrayTensor, NdArrayTensor> {
    let (Some(x), Some(w)) = (E::view(x).and_then(matrix), E::view(w_j).and_then(matrix)) else {
        return Err(y);
    };
    let b = match b_j.map(|b| E::view(b).and_then(|v| v.into_dimensionality::<Ix1>().ok())) {
        Some(None) => return Err(y),
        b => b.flatten(),
    };
    let mut out = E::array(y)?;
    if !out.is_standard_layout() {
        return Err(E::tensor(out));
    }
    let columns_of_y = *out
        .shape()
        .last()
        .expect("the entry point checked y's shape");
    let rows = out.len() / columns_of_y.max(1);
    {
        // Writing makes the array unique first (a copy only if another handle shares it).
        let mut y2 = out
            .view_mut()
            .into_shape_with_order((rows, columns_of_y))
            .expect("row-major, checked above");
        let mut block = y2.slice_mut(s![.., window.start..window.start + window.len]);
        general_mat_mul(E::one(), &x, &w, E::zero(), &mut block);
        if let Some(b) = b {
            // Burn's linear adds the bias after the product: the same one addition here.
            block += &b;
        }
    }
    Ok(E::tensor(out))
}

/// `dX (+)= dY[.., win] · W_jᵀ`; `Err(acc)` if it cannot run.
pub(crate) fn x_grad(
    acc: Option<NdArrayTensor>,
    w_j: &NdArrayTensor,
    dy: &NdArrayTensor,
    window: Window,
) -> Result<NdArrayTensor, Option<NdArrayTensor>> {
    by_elem!(dy, x_grad_in(acc, w_j, dy, window), Err(acc))
}

fn x_grad_in<E: Elem>(
    acc: Option<NdArrayTensor>,
    w_j: &NdArrayTensor,
    dy: &NdArrayTensor,
    window: Window,
) -> Result<NdArrayTensor, Option<NdArrayTensor>> {
    let (Some(dy_view), Some(w)) = (E::view(dy), E::view(w_j).and_then(matrix)) else {
        return Err(acc);
    };
    let mut shape = dy_view.shape().to_vec();
    let Some(dy) = matrix(dy_view) else {
        return Err(acc);
    };
    let dy_win = columns(dy, window);
    let d_in = w.nrows();
    let rows = dy_win.nrows();
    let Some(acc) = acc else {
        let mut out = Array2::<E>::zeros((rows, d_in));
        general_mat_mul(E::one(), &dy_win, &w.t(), E::zero(), &mut out);
        *shape.last_mut().expect("dy has dimensions") = d_in;
        let out = out
            .into_shape_with_order(IxDyn(&shape))
            .expect("same number of elements");
        return Ok(E::tensor(out.into_shared()));
    };
    let mut sum = E::array(acc).map_err(Some)?;
    if !sum.is_standard_layout() || sum.len() != rows * d_in {
        return Err(Some(E::tensor(sum)));
    }
    {
        let mut sum2 = sum
            .view_mut()
            .into_shape_with_order((rows, d_in))
            .expect("row-major, checked above");
        general_mat_mul(E::one(), &dy_win, &w.t(), E::one(), &mut sum2);
    }
    Ok(E::tensor(sum))
}

/// `Xᵀ · dY[.., win]`, summed over the samples of a `[batch, rows, d]` input one at a time
/// (as [`super::weight_grad_summed`] sums them); `None` if it cannot run.
pub(crate) fn weight_grad(
    x: &NdArrayTensor,
    dy: &NdArrayTensor,
    window: Window,
) -> Option<NdArrayTensor> {
    by_elem!(x, weight_grad_in(x, dy, window), None)
}

fn weight_grad_in<E: Elem>(
    x: &NdArrayTensor,
    dy: &NdArrayTensor,
    window: Window,
) -> Option<NdArrayTensor> {
    let (x, dy) = (E::view(x)?, E::view(dy)?);
    if !x.is_standard_layout() || !dy.is_standard_layout() {
        return None;
    }
    let d_in = *x.shape().last()?;
    let mut sum = Array2::<E>::zeros((d_in, window.len));
    match x.ndim() {
        // One product, as Burn's `linear_weight_backward` makes it.
        2 => {
            let (x, dy) = (matrix(x)?, matrix(dy)?);
            general_mat_mul(E::one(), &x.t(), &columns(dy, window), E::zero(), &mut sum);
        }
        // From zero, one sample's product added at a time.
        3 => {
            let x = x.into_dimensionality::<Ix3>().ok()?;
            let dy = dy.into_dimensionality::<Ix3>().ok()?;
            for (x_i, dy_i) in x.axis_iter(Axis(0)).zip(dy.axis_iter(Axis(0))) {
                let dy_i = columns(dy_i, window);
                general_mat_mul(E::one(), &x_i.t(), &dy_i, E::one(), &mut sum);
            }
        }
        _ => return None,
    }
    Some(E::tensor(sum.into_dyn().into_shared()))
}

/// Columns `window` of `t` as a strided view that shares `t`'s elements (no copy), for Burn's
/// own ops to read; `Err(t)` for element types other than f32 and f64.
pub(crate) fn column_view(
    t: NdArrayTensor,
    window: Window,
) -> Result<NdArrayTensor, NdArrayTensor> {
    by_elem!(t, column_view_in(t, window), Err(t))
}

fn column_view_in<E: Elem>(
    t: NdArrayTensor,
    window: Window,
) -> Result<NdArrayTensor, NdArrayTensor> {
    let mut a = E::array(t)?;
    let last = Axis(a.ndim() - 1);
    a.slice_axis_inplace(last, (window.start..window.start + window.len).into());
    Ok(E::tensor(a))
}
