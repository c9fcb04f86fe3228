//! NdArray's GELU steps: [`super::simd`]'s loops over an f32 array's elements, written in
//! place when the array's buffer is not shared (the decorator hands its operands over, so it
//! usually is not). Anything else (f64, operands of different shapes) is handed back, and the
//! caller runs Burn's op.

use super::{math, simd};
use burn::backend::ndarray::NdArrayTensor;
use ndarray::Zip;

/// GELU of `x`, or `x` back if it does not hold f32.
pub(crate) fn gelu(x: NdArrayTensor) -> Result<NdArrayTensor, NdArrayTensor> {
    match x {
        NdArrayTensor::F32(a) => {
            // `as_slice_mut` makes the buffer unique first (a copy only where it is shared).
            let mut a = a.into_shared();
            match a.as_slice_mut() {
                Some(xs) => simd::gelu(xs),
                None => a.mapv_inplace(math::gelu),
            }
            Ok(a.into())
        }
        other => Err(other),
    }
}

/// `grad · gelu'(x)`, Burn's derivative, or both operands back if they are not two f32
/// arrays of one shape.
// The operands come back by value where the kernel does not run them, once per op;
// boxing them would allocate on that path for nothing.
#[allow(clippy::result_large_err)]
pub(crate) fn gelu_backward(
    x: NdArrayTensor,
    grad: NdArrayTensor,
) -> Result<NdArrayTensor, (NdArrayTensor, NdArrayTensor)> {
    match (x, grad) {
        (NdArrayTensor::F32(x), NdArrayTensor::F32(g)) if x.shape() == g.shape() => {
            let mut g = g.into_shared();
            let x = x.view();
            // Both in row-major order: one loop over two slices; else element by element.
            match (x.as_slice(), g.as_slice_mut()) {
                (Some(xs), Some(gs)) => simd::gelu_backward(xs, gs),
                _ => Zip::from(&mut g)
                    .and(x)
                    .for_each(|g, &x| *g *= math::gelu_derivative(x)),
            }
            Ok(g.into())
        }
        pair => Err(pair),
    }
}
