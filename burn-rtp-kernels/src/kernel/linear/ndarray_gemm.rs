//! The Linear steps on NdArray: matrixmultiply's GEMM (through `ndarray`, as burn-ndarray
//! multiplies) run on strided views of the operands where they lie, so nothing is copied.
//!
//! Why not Burn's ops, as [`crate::generic::linear`] does: burn-ndarray copies both operands of every
//! matmul (its reshape turns a view into a new array, element by element through a
//! dynamic-rank iterator when the operand is strided, as `Wᵀ` and `Xᵀ` are), and its
//! `float_slice` copies a window. A rotation runs N GEMMs per Linear where data parallelism
//! runs one, so the compositions copy X, `Xᵀ` and each window of dY N times per pass: 12% of
//! an RTP rank's time on config A at N = 4 (perf). The GEMM packs its operands whatever
//! their strides, so a window or a transpose read in place costs nothing extra.
//!
//! Rounding: an output element is the same dot product as in the compositions
//! (matrixmultiply's arithmetic per element depends on K and its blocks of K, not on M, N or
//! the strides), so the forward step equals [`crate::generic::linear::forward`] bit for bit. The
//! gradient steps add each product into their accumulator inside the GEMM (`beta = 1`):
//! that is the compositions' `acc + product` bit for bit while the summed dimension fits in
//! one of matrixmultiply's K blocks (256 for f32: windows of up to 256 columns for dX, samples
//! of up to 256 rows for dW), and past that the same sum rounded in another order.
//!
//! With f32 on a CPU with AVX2 and FMA, the forward and weight-gradient GEMMs run on
//! `packed_lhs.rs` instead, whose left operand (X, `Xᵀ`) a ring pass packs once for all its
//! steps ([`pack_x`]), with matrixmultiply's bits.
//!
//! Each function takes what it cannot run (another element type, an operand not in row-major
//! order) back as `Err`, and the caller runs the composition instead.

use super::packed_lhs::{self, PackedLhs};
use crate::columns::Window;
use crate::dispatch::{Checked, KernelPath, RotationKernels};
use crate::generic::linear as generic;
use crate::packing::{PackedX, XUse};
use crate::switches::{count_fused_launch, fused_kernels_enabled};
use crate::Float;
use burn::backend::ndarray::NdArrayTensor;
use ndarray::linalg::general_mat_mul;
use ndarray::{
    s, ArcArray, Array2, ArrayView2, ArrayViewD, ArrayViewMut2, Axis, Ix1, Ix3, IxDyn, LinalgScalar,
};

/// Where a packed operand's sum is cut: (first term, number of terms) per segment.
type Segments = Vec<(usize, usize)>;

/// The float elements NdArray's tensors hold, and the way to their arrays.
trait Elem: LinalgScalar + std::ops::AddAssign {
    /// A view of `t`'s elements, if `t` holds this element type.
    fn view(t: &NdArrayTensor) -> Option<ArrayViewD<'_, Self>>;
    /// `t`'s array (shared, not copied), or `t` back if it holds another element type.
    fn array(t: NdArrayTensor) -> Result<ArcArray<Self, IxDyn>, NdArrayTensor>;
    /// The tensor of an array.
    fn tensor(a: ArcArray<Self, IxDyn>) -> NdArrayTensor;
    /// `a` packed for the packed GEMM, cut at `segments`; `None` where that GEMM cannot run.
    fn pack(a: ArrayView2<'_, Self>, segments: &[(usize, usize)]) -> Option<PackedLhs> {
        let _ = (a, segments);
        None
    }
    /// `C (+)= A · B` on the packed GEMM, reusing `packed` where it was packed from `a` cut at
    /// `segments`; false where that GEMM cannot run (f64, a CPU without AVX2 and FMA), and
    /// the caller runs matrixmultiply.
    fn packed_mul(
        a: ArrayView2<'_, Self>,
        segments: &[(usize, usize)],
        packed: Option<&PackedLhs>,
        b: ArrayView2<'_, Self>,
        c: ArrayViewMut2<'_, Self>,
        accumulate: bool,
    ) -> bool {
        let _ = (a, segments, packed, b, c, accumulate);
        false
    }
}

/// Implements [`Elem`] for one element type and its `NdArrayTensor` variant, with any method
/// it overrides.
macro_rules! elem {
    ($ty:ty, $variant:ident $(, $extra:item)*) => {
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
            $($extra)*
        }
    };
}
elem!(
    f32,
    F32,
    fn pack(a: ArrayView2<'_, f32>, segments: &[(usize, usize)]) -> Option<PackedLhs> {
        packed_lhs::available().then(|| PackedLhs::pack(a, segments))
    },
    fn packed_mul(
        a: ArrayView2<'_, f32>,
        segments: &[(usize, usize)],
        packed: Option<&PackedLhs>,
        b: ArrayView2<'_, f32>,
        c: ArrayViewMut2<'_, f32>,
        accumulate: bool,
    ) -> bool {
        if !packed_lhs::available() {
            return false;
        }
        let lhs = match packed {
            Some(p) if p.packed_from(&a, segments) => packed_lhs::Lhs::Packed(p),
            // Packed block by block as the GEMM goes, as matrixmultiply does.
            _ => packed_lhs::Lhs::View(a, segments),
        };
        packed_lhs::gemm(lhs, b, c, accumulate);
        true
    }
);
// f64 keeps matrixmultiply: the packed GEMM is f32's.
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

/// The left operand that `use_` multiplies by, made of the input `x`, and where its sum is
/// cut: X (`[rows, d_in]`, one sum over `d_in`) for the forward; `Xᵀ` (`[d_in, rows]`) for the
/// weight gradient, its sum over the rows cut per sample of a `[batch, rows, d_in]` input (the
/// products are summed one sample at a time). `None` for an input not in row-major order, or
/// of another rank for the weight gradient.
fn lhs_of<E>(use_: XUse, x: ArrayViewD<'_, E>) -> Option<(ArrayView2<'_, E>, Segments)> {
    let ndim = x.ndim();
    let samples = if ndim == 3 { x.shape()[0] } else { 1 };
    let x = matrix(x)?;
    match use_ {
        XUse::Forward => Some((x, vec![(0, x.ncols())])),
        XUse::WeightGrad if ndim == 2 || ndim == 3 => {
            let rows = x.nrows() / samples.max(1);
            Some((
                x.reversed_axes(),
                (0..samples).map(|i| (i * rows, rows)).collect(),
            ))
        }
        XUse::WeightGrad => None,
    }
}

/// `x` packed once for every step of a pass that reads it as `use_`; `None` where the packed
/// GEMM cannot run.
pub(crate) fn pack_x(x: &NdArrayTensor, use_: XUse) -> Option<PackedX> {
    by_elem!(x, pack_x_in(x, use_), None)
}

fn pack_x_in<E: Elem>(x: &NdArrayTensor, use_: XUse) -> Option<PackedX> {
    let (a, segments) = lhs_of(use_, E::view(x)?)?;
    let lhs = E::pack(a, &segments)?;
    Some(PackedX {
        use_,
        bytes: lhs.bytes(),
        lhs: Box::new(lhs),
        _source: Box::new(x.clone()),
    })
}

/// The packing of `packed` if it serves `use_`.
fn packed_for(packed: Option<&PackedX>, use_: XUse) -> Option<&PackedLhs> {
    packed
        .filter(|p| p.use_ == use_)
        .and_then(|p| p.lhs.downcast_ref::<PackedLhs>())
}

/// `Y[.., win] = X · W_j (+ b_j)`, written into `y`'s window; `Err(y)` if it cannot run.
/// `packed` is X packed for the forward ([`pack_x`]), or `None` to pack it now.
pub(crate) fn forward(
    y: NdArrayTensor,
    x: &NdArrayTensor,
    w_j: &NdArrayTensor,
    b_j: Option<&NdArrayTensor>,
    window: Window,
    packed: Option<&PackedX>,
) -> Result<NdArrayTensor, NdArrayTensor> {
    by_elem!(x, forward_in(y, x, w_j, b_j, window, packed), Err(y))
}

fn forward_in<E: Elem>(
    y: NdArrayTensor,
    x: &NdArrayTensor,
    w_j: &NdArrayTensor,
    b_j: Option<&NdArrayTensor>,
    window: Window,
    packed: Option<&PackedX>,
) -> Result<NdArrayTensor, NdArrayTensor> {
    let (Some((x, segments)), Some(w)) = (
        E::view(x).and_then(|x| lhs_of(XUse::Forward, x)),
        E::view(w_j).and_then(matrix),
    ) else {
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
        let lhs = packed_for(packed, XUse::Forward);
        if !E::packed_mul(x, &segments, lhs, w, block.view_mut(), false) {
            general_mat_mul(E::one(), &x, &w, E::zero(), &mut block);
        }
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
/// (as [`super::weight_grad_summed`] sums them); `None` if it cannot run. `packed` is `Xᵀ`
/// packed for the weight gradient ([`pack_x`]), or `None` to pack it now.
pub(crate) fn weight_grad(
    x: &NdArrayTensor,
    dy: &NdArrayTensor,
    window: Window,
    packed: Option<&PackedX>,
) -> Option<NdArrayTensor> {
    by_elem!(x, weight_grad_in(x, dy, window, packed), None)
}

fn weight_grad_in<E: Elem>(
    x: &NdArrayTensor,
    dy: &NdArrayTensor,
    window: Window,
    packed: Option<&PackedX>,
) -> Option<NdArrayTensor> {
    let (x, dy) = (E::view(x)?, E::view(dy)?);
    if !x.is_standard_layout() || !dy.is_standard_layout() {
        return None;
    }
    let d_in = *x.shape().last()?;
    let mut sum = Array2::<E>::zeros((d_in, window.len));
    // Each product added to the running sum, from zero: matrixmultiply's `beta = 1` calls.
    let packed_sum = lhs_of(XUse::WeightGrad, x.clone()).and_then(|(xt, segments)| {
        let dy_rows = matrix(dy.clone()).filter(|d| d.nrows() == xt.ncols())?;
        let lhs = packed_for(packed, XUse::WeightGrad);
        let dy_win = columns(dy_rows, window);
        E::packed_mul(xt, &segments, lhs, dy_win, sum.view_mut(), true).then_some(())
    });
    if packed_sum.is_some() {
        return Some(E::tensor(sum.into_dyn().into_shared()));
    }
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
        fused_kernels_enabled().then(|| pack_x(x, use_)).flatten()
    }

    fn filled(
        shape: burn::tensor::Shape,
        value: f32,
        device: &burn::tensor::Device<Self>,
        dtype: burn::tensor::FloatDType,
    ) -> Float<Self> {
        use burn::tensor::ops::FloatTensorOps;
        crate::kernel::fill::ndarray(&shape, value, dtype)
            .unwrap_or_else(|| Self::float_full(shape, value.into(), device, dtype))
    }

    fn fused_matmul(lhs: Float<Self>, rhs: Float<Self>) -> Float<Self> {
        use burn::tensor::ops::FloatTensorOps;
        match fused_kernels_enabled() {
            true => crate::kernel::matmul::ndarray::matmul(lhs, rhs)
                .unwrap_or_else(|(lhs, rhs)| Self::float_matmul(lhs, rhs)),
            false => Self::float_matmul(lhs, rhs),
        }
    }

    fn fused_adam(
        param: Float<Self>,
        grad: Float<Self>,
        moments: Option<(Float<Self>, Float<Self>)>,
        step: &crate::AdamStep,
    ) -> Result<[Float<Self>; 3], crate::kernel::adam::ndarray::Operands> {
        let done = crate::kernel::adam::ndarray::adam(param, grad, moments, step);
        if done.is_ok() {
            count_fused_launch();
        }
        done
    }

    fn fused_gelu(x: Float<Self>) -> Float<Self> {
        use burn::tensor::ops::ActivationOps;
        crate::kernel::gelu::ndarray::gelu(x).unwrap_or_else(Self::gelu)
    }

    fn fused_gelu_backward(x: Float<Self>, grad: Float<Self>) -> Float<Self> {
        use burn::tensor::ops::ActivationOps;
        crate::kernel::gelu::ndarray::gelu_backward(x, grad)
            .unwrap_or_else(|(x, grad)| Self::gelu_backward(x, grad))
    }

    fn linear_step(
        y: Float<Self>,
        x: Float<Self>,
        w_j: Float<Self>,
        b_j: Option<Float<Self>>,
        window: Window,
        packed: Option<&PackedX>,
        _checked: Checked,
    ) -> Float<Self> {
        let y = match fused_kernels_enabled() {
            true => match forward(y, &x, &w_j, b_j.as_ref(), window, packed) {
                Ok(y) => {
                    count_fused_launch();
                    return y;
                }
                Err(y) => y,
            },
            false => y,
        };
        generic::forward::<Self>(y, x, w_j, b_j, window)
    }

    fn x_grad_step(
        acc: Option<Float<Self>>,
        w_j: Float<Self>,
        dy: Float<Self>,
        window: Window,
        _checked: Checked,
    ) -> Float<Self> {
        let acc = match fused_kernels_enabled() {
            true => match x_grad(acc, &w_j, &dy, window) {
                Ok(sum) => {
                    count_fused_launch();
                    return sum;
                }
                Err(acc) => acc,
            },
            false => acc,
        };
        generic::x_grad::<Self>(acc, w_j, dy, window)
    }

    fn weight_grad_step(
        x: Float<Self>,
        dy: Float<Self>,
        window: Window,
        with_bias: bool,
        packed: Option<&PackedX>,
        _checked: Checked,
    ) -> (Float<Self>, Option<Float<Self>>) {
        if fused_kernels_enabled() {
            if let Some(dw) = weight_grad(&x, &dy, window, packed) {
                count_fused_launch();
                // Burn's own sum over the window read in place: the composition's bits.
                let db = with_bias.then(|| {
                    let dy_j = column_view(dy, window).unwrap_or_else(|dy| {
                        crate::column_slice::<Self>(dy, window.start, window.len)
                    });
                    <Self as burn::tensor::ops::ModuleOps<Self>>::linear_bias_backward(dy_j)
                });
                return (dw, db);
            }
        }
        generic::weight_grad::<Self>(x, dy, window, with_bias)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass's packing is read, not redone: a clone of X (what each step gets) is the operand
    /// it was packed from, and a tensor holding the same values elsewhere is not.
    #[test]
    fn a_packing_serves_the_tensor_it_came_from() {
        if !packed_lhs::available() {
            return;
        }
        let tensor = || -> NdArrayTensor {
            let values = (0..24).map(|v| v as f32).collect();
            f32::tensor(ArcArray::from_shape_vec(IxDyn(&[2, 3, 4]), values).unwrap())
        };
        let x = tensor();
        for use_ in [XUse::Forward, XUse::WeightGrad] {
            let packed = pack_x(&x, use_).expect("f32 packs on this CPU");
            // Panels of 6 rows: X is [6, 4]; `Xᵀ` is [4, 6], padded to 6 rows.
            let floats = if use_ == XUse::Forward { 6 * 4 } else { 6 * 6 };
            assert_eq!(packed.bytes(), floats * 4);
            let step = x.clone();
            let (a, segments) = lhs_of(use_, f32::view(&step).unwrap()).unwrap();
            assert!(packed_for(Some(&packed), use_)
                .unwrap()
                .packed_from(&a, &segments));
            let other = if use_ == XUse::Forward {
                XUse::WeightGrad
            } else {
                XUse::Forward
            };
            assert!(packed_for(Some(&packed), other).is_none());
            let elsewhere = tensor();
            let (b, segments) = lhs_of(use_, f32::view(&elsewhere).unwrap()).unwrap();
            assert!(!packed_for(Some(&packed), packed.use_)
                .expect("a packing of NdArray's")
                .packed_from(&b, &segments));
        }
    }
}
