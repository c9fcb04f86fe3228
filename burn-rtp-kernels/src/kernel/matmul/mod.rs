//! Batched matmul on NdArray without copying strided operands.
//!
//! burn-ndarray's `float_matmul` first reshapes both operands to three dimensions, and its
//! reshape copies a strided view element by element: attention's products read `Kᵀ` and the
//! heads' views of Q, K and V, all strided, so on config A the copies took as long as the
//! products (5% of a single rank's step against 2% for the GEMMs). Here each batch's matrix
//! is multiplied where it lies, by the GEMM burn-ndarray itself uses (matrixmultiply through
//! `ndarray::linalg::general_mat_mul`), which packs its operands whatever their strides. An
//! output element is the same dot product in the same order, so the bits are Burn's.

pub(crate) mod ndarray;

#[cfg(test)]
mod tests {
    use burn::backend::ndarray::{NdArrayDevice, NdArrayTensor};
    use burn::backend::NdArray;
    use burn::tensor::ops::FloatTensorOps;
    use burn::tensor::TensorData;

    type N = NdArray<f32>;

    fn tensor(shape: &[usize], salt: f32) -> NdArrayTensor {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|i| ((i as f32 * 0.618_034 + salt).fract() - 0.5) * 3.0)
            .collect();
        N::float_from_data(TensorData::new(values, shape.to_vec()), &NdArrayDevice::Cpu)
    }

    fn bits(t: NdArrayTensor) -> (Vec<usize>, Vec<u32>) {
        let data = burn::tensor::try_read_sync(N::float_into_data(t))
            .expect("synchronous")
            .expect("readable");
        let shape = data.shape.to_vec();
        let values = data.to_vec::<f32>().unwrap();
        (shape, values.iter().map(|v| v.to_bits()).collect())
    }

    /// Burn's matmul and ours on the same operands: the same shape and bits.
    fn same(lhs: NdArrayTensor, rhs: NdArrayTensor) {
        let want = bits(N::float_matmul(lhs.clone(), rhs.clone()));
        let got = super::ndarray::matmul(lhs, rhs).unwrap_or_else(|_| panic!("not run"));
        assert_eq!(bits(got), want);
    }

    #[test]
    fn strided_batches_give_burns_bits() {
        // Attention's products: heads' views (swapped axes) and a transposed K, with sums of
        // more than one of matrixmultiply's K blocks (300 > 256).
        let q = N::float_swap_dims(tensor(&[2, 7, 3, 300], 0.1), 1, 2);
        let k = N::float_swap_dims(tensor(&[2, 5, 3, 300], 0.2), 1, 2);
        let kt = N::float_swap_dims(k, 2, 3);
        same(q.clone(), kt);
        let v = N::float_swap_dims(tensor(&[2, 5, 3, 9], 0.3), 1, 2);
        let scores = N::float_swap_dims(tensor(&[2, 3, 5, 7], 0.4), 2, 3);
        same(scores, v);
        same(
            tensor(&[4, 6, 11], 0.5),
            N::float_swap_dims(tensor(&[4, 13, 11], 0.6), 1, 2),
        );
        same(tensor(&[6, 11], 0.7), tensor(&[11, 13], 0.8));
    }

    #[test]
    fn broadcast_batches_are_handed_back() {
        let lhs = tensor(&[2, 3, 4], 0.1);
        let rhs = tensor(&[1, 4, 5], 0.2);
        assert!(super::ndarray::matmul(lhs, rhs).is_err());
    }
}
