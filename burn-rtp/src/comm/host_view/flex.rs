//! Flex's tensors read in place: a `FlexTensor` shares its bytes through an `Arc` and writes
//! them in place only while that `Arc` is unique (`try_storage_mut`; `storage_mut` copies a
//! shared buffer first), so the clone a view holds keeps them unwritten.

use crate::comm::transport::HostBytes;
use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use std::any::Any;
use std::sync::Arc;

/// A Flex float tensor whose elements are contiguous in row-major order, held while its bytes
/// are sent; `range` is where they lie in its buffer.
#[derive(Debug)]
struct FlexBytes {
    tensor: FlexTensor,
    range: std::ops::Range<usize>,
}

impl FlexBytes {
    /// Holds `tensor` if it is a float tensor whose bytes can be read in place.
    fn new(tensor: &FlexTensor) -> Option<Self> {
        let dtype = tensor.dtype();
        if !dtype.is_float() {
            return None;
        }
        let (start, end) = tensor.layout().contiguous_offsets()?;
        let size = dtype.size();
        let range = start * size..end * size;
        (range.end <= tensor.bytes().len()).then(|| Self {
            tensor: tensor.clone(),
            range,
        })
    }
}

// SAFETY: the held clone keeps the `Arc`'d buffer alive and its count above one, and Flex
// writes a buffer in place only while its `Arc` is unique (a shared one is copied first), so
// `bytes` returns the same unwritten slice for as long as the value lives.
unsafe impl HostBytes for FlexBytes {
    fn bytes(&self) -> &[u8] {
        &self.tensor.bytes()[self.range.clone()]
    }

    fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    fn shape(&self) -> Vec<usize> {
        self.tensor.layout().shape().to_vec()
    }
}

/// The bytes of `t` read in place, if it is a row-major Flex float tensor.
pub(super) fn view(t: &dyn Any) -> Option<Arc<dyn HostBytes>> {
    let t = t.downcast_ref::<FlexTensor>()?;
    Some(Arc::new(FlexBytes::new(t)?))
}

#[cfg(test)]
mod tests {
    use super::super::view;
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::ops::FloatTensorOps;
    use burn::tensor::{Scalar, Slice, TensorData};

    fn tensor(values: Vec<f32>, shape: [usize; 2]) -> FlexTensor {
        Flex::float_from_data(TensorData::new(values, shape), &Default::default())
    }

    #[test]
    fn a_view_reads_the_tensors_own_bytes_and_survives_writes_to_it() {
        let values: Vec<f32> = (0..96).map(|i| i as f32 * 0.5 - 1.0).collect();
        let t = tensor(values.clone(), [8, 12]);
        let own = t.bytes().as_ptr();
        let view = view::<Flex>(&t).expect("a row-major Flex tensor is viewed");
        assert_eq!(view.dtype(), DType::F32);
        assert_eq!(view.shape(), vec![8, 12]);
        assert_eq!(
            view.bytes().as_ptr(),
            own,
            "the view is the buffer, not a copy"
        );
        assert_eq!(view.bytes(), bytemuck::cast_slice::<f32, u8>(&values));
        // An op that would write a unique buffer in place must copy while the view holds it.
        let written = Flex::float_add_scalar(t, Scalar::Float(100.0));
        assert_eq!(view.bytes(), bytemuck::cast_slice::<f32, u8>(&values));
        assert_eq!(written.as_slice::<f32>().unwrap()[95], values[95] + 100.0);
    }

    #[test]
    fn without_a_view_the_same_op_writes_in_place() {
        // The control for the test above: the in-place path it guards against is real.
        let t = tensor((0..96).map(|i| i as f32).collect(), [8, 12]);
        let own = t.bytes().as_ptr();
        let written = Flex::float_add_scalar(t, Scalar::Float(1.0));
        assert_eq!(
            written.bytes().as_ptr(),
            own,
            "a unique buffer is written in place"
        );
    }

    #[test]
    fn a_row_window_is_viewed_where_it_lies_and_a_transpose_is_not() {
        let values: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let t = tensor(values.clone(), [4, 6]);
        let rows = Flex::float_slice(t.clone(), &[Slice::new(1, Some(3), 1), Slice::full()]);
        let window = view::<Flex>(&rows).expect("contiguous rows are viewed");
        assert_eq!(
            window.bytes(),
            bytemuck::cast_slice::<f32, u8>(&values[6..18])
        );
        assert_eq!(window.shape(), vec![2, 6]);
        let transposed = Flex::float_swap_dims(t, 0, 1);
        assert!(
            view::<Flex>(&transposed).is_none(),
            "column-major elements are copied"
        );
    }
}
