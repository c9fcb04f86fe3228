//! NdArray's Adam step: one `Zip` over the parameter, the gradient and both moments, writing
//! the parameter and the moments in place (their buffers are copied first only where another
//! tensor shares them).

use super::AdamStep;
use burn::backend::ndarray::NdArrayTensor;
use ndarray::Zip;

/// The operands of a step, handed back where this kernel does not run them.
pub(crate) type Operands = (
    NdArrayTensor,
    NdArrayTensor,
    Option<(NdArrayTensor, NdArrayTensor)>,
);

/// `(param, moment 1, moment 2)` after `step`, or the operands back unless all are f32 of one
/// shape.
// The operands come back by value where the kernel does not run them, once per op;
// boxing them would allocate on that path for nothing.
#[allow(clippy::result_large_err)]
pub(crate) fn adam(
    param: NdArrayTensor,
    grad: NdArrayTensor,
    moments: Option<(NdArrayTensor, NdArrayTensor)>,
    step: &AdamStep,
) -> Result<[NdArrayTensor; 3], Operands> {
    let corrections = step.corrections();
    match (param, grad, moments) {
        (NdArrayTensor::F32(p), NdArrayTensor::F32(g), None) if p.shape() == g.shape() => {
            let mut p = p.into_shared();
            let mut m1 = ndarray::ArrayD::<f32>::zeros(p.raw_dim());
            let mut m2 = ndarray::ArrayD::<f32>::zeros(p.raw_dim());
            Zip::from(&mut p)
                .and(g.view())
                .and(&mut m1)
                .and(&mut m2)
                .for_each(|p, &g, m1, m2| {
                    (*p, *m1, *m2) = step.element(*p, g, None, corrections);
                });
            Ok([p.into(), m1.into_shared().into(), m2.into_shared().into()])
        }
        (
            NdArrayTensor::F32(p),
            NdArrayTensor::F32(g),
            Some((NdArrayTensor::F32(m1), NdArrayTensor::F32(m2))),
        ) if p.shape() == g.shape() && p.shape() == m1.shape() && p.shape() == m2.shape() => {
            let (mut p, mut m1, mut m2) = (p.into_shared(), m1.into_shared(), m2.into_shared());
            Zip::from(&mut p)
                .and(g.view())
                .and(&mut m1)
                .and(&mut m2)
                .for_each(|p, &g, m1, m2| {
                    (*p, *m1, *m2) = step.element(*p, g, Some((*m1, *m2)), corrections);
                });
            Ok([p.into(), m1.into(), m2.into()])
        }
        (param, grad, moments) => Err((param, grad, moments)),
    }
}
