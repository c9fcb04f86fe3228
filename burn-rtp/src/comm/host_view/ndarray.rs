//! burn-ndarray's tensors read in place: it keeps a tensor in a reference-counted buffer and
//! writes one in place only while no other handle shares it (copy-on-write).

use crate::comm::transport::HostBytes;
use burn::backend::ndarray::NdArrayTensor;
use burn::tensor::{DType, TensorMetadata};
use std::any::Any;
use std::sync::Arc;

/// A burn-ndarray float tensor in row-major order, held while its bytes are sent.
#[derive(Debug)]
struct NdArrayBytes(NdArrayTensor);

impl NdArrayBytes {
    /// Holds `tensor` if its bytes can be read in place.
    fn new(tensor: &NdArrayTensor) -> Option<Self> {
        // Borrowed storage (a loaded file's bytes) may copy itself when its handle is cloned,
        // a copy the ledger would not see: it is copied, and charged, as before.
        if tensor.is_borrowed() {
            return None;
        }
        let readable = match tensor {
            NdArrayTensor::F32(s) => s.view().to_slice().is_some(),
            NdArrayTensor::F64(s) => s.view().to_slice().is_some(),
            _ => false,
        };
        readable.then(|| Self(tensor.clone()))
    }
}

// SAFETY: the held handle keeps the buffer alive, and no handle writes a buffer another
// handle shares (ndarray's copy-on-write; burn-ndarray's in-place paths check `is_unique`), so
// `bytes` returns the same unwritten slice for as long as the value lives.
unsafe impl HostBytes for NdArrayBytes {
    fn bytes(&self) -> &[u8] {
        let row_major = "checked when the view was made, and a shared tensor is never written";
        match &self.0 {
            NdArrayTensor::F32(s) => bytemuck::cast_slice(s.view().to_slice().expect(row_major)),
            NdArrayTensor::F64(s) => bytemuck::cast_slice(s.view().to_slice().expect(row_major)),
            _ => unreachable!("only float tensors are viewed"),
        }
    }

    fn dtype(&self) -> DType {
        self.0.dtype()
    }

    fn shape(&self) -> Vec<usize> {
        self.0.shape().to_vec()
    }
}

/// The bytes of `t` read in place, if it is a row-major burn-ndarray tensor.
pub(super) fn view(t: &dyn Any) -> Option<Arc<dyn HostBytes>> {
    let t = t.downcast_ref::<NdArrayTensor>()?;
    Some(Arc::new(NdArrayBytes::new(t)?))
}

#[cfg(test)]
mod tests {
    use super::super::view;
    use super::*;
    use crate::state::accounting::Float;
    use burn::backend::NdArray;
    use burn::tensor::ops::FloatTensorOps;
    use burn::tensor::TensorData;

    type B = NdArray<f32>;

    fn tensor(values: Vec<f32>, shape: [usize; 2]) -> Float<B> {
        B::float_from_data(TensorData::new(values, shape), &Default::default())
    }

    #[test]
    fn a_view_reads_the_tensors_own_bytes_and_survives_writes_to_it() {
        // 96 elements: burn-ndarray's SIMD paths, which write in place when the buffer is not
        // shared, take tensors from 32 elements on.
        let values: Vec<f32> = (0..96).map(|i| i as f32 * 0.5 - 1.0).collect();
        let t = tensor(values.clone(), [8, 12]);
        let NdArrayTensor::F32(storage) = &t else {
            panic!("an f32 tensor")
        };
        let own = storage.view().as_ptr() as *const u8;
        let view = view::<B>(&t).expect("a row-major NdArray tensor is viewed");
        assert_eq!(view.dtype(), DType::F32);
        assert_eq!(view.shape(), vec![8, 12]);
        assert_eq!(
            view.bytes().as_ptr(),
            own,
            "the view is the tensor's buffer, not a copy"
        );
        assert_eq!(view.bytes(), bytemuck::cast_slice::<f32, u8>(&values));
        // An op that writes in place where the buffer is not shared must copy while the view
        // holds it: the view still reads the values it was made with.
        let written = B::float_add_scalar(t, burn::tensor::Scalar::Float(100.0));
        assert_eq!(view.bytes(), bytemuck::cast_slice::<f32, u8>(&values));
        let written = burn::tensor::try_read_sync(B::float_into_data(written))
            .unwrap()
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(written[95], values[95] + 100.0);
    }

    #[test]
    fn without_a_view_the_same_op_writes_in_place() {
        // The control for the test above: the in-place path it guards against is real.
        let t = tensor((0..96).map(|i| i as f32).collect(), [8, 12]);
        let NdArrayTensor::F32(storage) = &t else {
            panic!("an f32 tensor")
        };
        let own = storage.view().as_ptr();
        let written = B::float_add_scalar(t, burn::tensor::Scalar::Float(1.0));
        let NdArrayTensor::F32(storage) = &written else {
            panic!("an f32 tensor")
        };
        assert_eq!(
            storage.view().as_ptr(),
            own,
            "a unique buffer is written in place"
        );
    }

    #[test]
    fn a_transposed_tensor_is_not_viewed() {
        let t = tensor((0..6).map(|i| i as f32).collect(), [2, 3]);
        let transposed = B::float_swap_dims(t, 0, 1);
        assert!(
            view::<B>(&transposed).is_none(),
            "column-major elements must be copied in row-major order"
        );
    }
}
