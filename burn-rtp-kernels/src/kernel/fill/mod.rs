//! Filled tensors on NdArray in one pass.
//!
//! Burn's default `float_zeros` and `float_ones` (which burn-ndarray keeps) fill a
//! `TensorData` element by element through a generic conversion, then build the array from
//! it: two passes, the first slow. On config A that was 3% of a single rank's step, most of
//! it the zeroed output of every Linear forward.

use burn::backend::ndarray::NdArrayTensor;
use burn::tensor::{FloatDType, Shape};
use ndarray::{ArcArray, IxDyn};

/// An f32 or f64 array of `shape` filled with `value`; `None` for other element types.
pub(crate) fn ndarray(shape: &Shape, value: f32, dtype: FloatDType) -> Option<NdArrayTensor> {
    let dims = IxDyn(shape.as_slice());
    match dtype {
        FloatDType::F32 => Some(ArcArray::from_elem(dims, value).into()),
        FloatDType::F64 => Some(ArcArray::from_elem(dims, value as f64).into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::ndarray::NdArrayDevice;
    use burn::backend::NdArray;
    use burn::tensor::ops::FloatTensorOps;
    use burn::tensor::{FloatDType, Shape};

    type N = NdArray<f32>;

    #[test]
    fn fills_are_burns() {
        let shape = Shape::new([3, 5, 7]);
        for value in [0.0f32, 1.0, -2.5] {
            let ours = super::ndarray(&shape, value, FloatDType::F32).expect("f32");
            let burn = N::float_full(
                shape.clone(),
                value.into(),
                &NdArrayDevice::Cpu,
                FloatDType::F32,
            );
            let read = |t| {
                burn::tensor::try_read_sync(N::float_into_data(t))
                    .expect("synchronous")
                    .expect("readable")
            };
            assert_eq!(read(ours), read(burn));
        }
    }
}
