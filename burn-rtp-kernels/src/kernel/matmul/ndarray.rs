//! NdArray's batched matmul on views (see the module above).

use burn::backend::ndarray::NdArrayTensor;
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewD, ArrayViewMut2, ArrayViewMutD, Axis, IxDyn, LinalgScalar};

/// `lhs · rhs` for f32 or f64 operands of the same rank (at least 2) and the same batch
/// dimensions; anything else (broadcast batches, mixed types) is handed back and the caller
/// runs Burn's op.
// The operands come back by value where the kernel does not run them, once per op;
// boxing them would allocate on that path for nothing.
#[allow(clippy::result_large_err)]
pub(crate) fn matmul(
    lhs: NdArrayTensor,
    rhs: NdArrayTensor,
) -> Result<NdArrayTensor, (NdArrayTensor, NdArrayTensor)> {
    match (lhs, rhs) {
        (NdArrayTensor::F32(l), NdArrayTensor::F32(r)) if fits(l.shape(), r.shape()) => {
            Ok(product(l.view(), r.view()).into_shared().into())
        }
        (NdArrayTensor::F64(l), NdArrayTensor::F64(r)) if fits(l.shape(), r.shape()) => {
            Ok(product(l.view(), r.view()).into_shared().into())
        }
        pair => Err(pair),
    }
}

/// Whether `[.., m, k] · [.., k, n]` with equal batch dimensions.
fn fits(l: &[usize], r: &[usize]) -> bool {
    let d = l.len();
    d >= 2 && r.len() == d && l[..d - 2] == r[..d - 2] && l[d - 1] == r[d - 2]
}

/// The product, batch by batch, into a new row-major array.
fn product<E: LinalgScalar>(l: ArrayViewD<'_, E>, r: ArrayViewD<'_, E>) -> ndarray::ArrayD<E> {
    let d = l.ndim();
    let mut dims = l.shape().to_vec();
    dims[d - 1] = r.shape()[d - 1];
    let mut out = ndarray::ArrayD::<E>::zeros(IxDyn(&dims));
    batches(l, r, out.view_mut());
    out
}

/// Multiplies each batch's matrices, recursing over the batch axes.
fn batches<E: LinalgScalar>(
    l: ArrayViewD<'_, E>,
    r: ArrayViewD<'_, E>,
    mut out: ArrayViewMutD<'_, E>,
) {
    if l.ndim() == 2 {
        let l: ArrayView2<'_, E> = l.into_dimensionality().expect("two axes");
        let r: ArrayView2<'_, E> = r.into_dimensionality().expect("two axes");
        let mut o: ArrayViewMut2<'_, E> = out.into_dimensionality().expect("two axes");
        general_mat_mul(E::one(), &l, &r, E::zero(), &mut o);
        return;
    }
    for ((l, r), o) in l
        .axis_iter(Axis(0))
        .zip(r.axis_iter(Axis(0)))
        .zip(out.axis_iter_mut(Axis(0)))
    {
        batches(l, r, o);
    }
}
