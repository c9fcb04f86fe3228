//! Quantized ops: quantized tensors are always local and pass through.
//!
//! Of the ops Burn's `QTensorOps` gives a default body, those a CPU inner backend implements
//! (NdArray and Flex: `quantize_dynamic`, `q_gather`, `q_argmax`, `q_argmin`) are forwarded.
//! The rest stay Burn's compositions on purpose: they dequantize through `dequantize` (the
//! inner backend's), run our float ops (the inner backend's, with our layout rules) and
//! quantize again, which is what the inner backends do themselves.

use crate::backend::device::current_device;
use crate::backend::device::RtpDevice;
use crate::backend::rtp::Rtp;
use crate::backend::tensor::RtpTensor;
use crate::state::sharding::Layout;
use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::*;
use burn::tensor::{FloatDType, IntDType, Shape, Slice, TensorData};
use burn_rtp_kernels::RotationKernels;

type Device<B> = <B as burn::tensor::backend::BackendTypes>::Device;

use super::full_inner;
use burn::tensor::quantization::{QuantScheme, QuantizationParametersPrimitive};

impl<B: RotationKernels> QTensorOps<Self> for Rtp<B> {
    async fn q_into_data(tensor: QuantizedTensor<Self>) -> Result<TensorData, ExecutionError> {
        B::q_into_data(tensor).await
    }

    fn q_device(_tensor: &QuantizedTensor<Self>) -> RtpDevice<B> {
        current_device::<B>()
    }

    fn quantize(
        tensor: FloatTensor<Self>,
        scheme: &QuantScheme,
        qparams: QuantizationParametersPrimitive<Self>,
    ) -> QuantizedTensor<Self> {
        let scales = full_inner(qparams.scales, "quantize");
        let tensor = full_inner(tensor, "quantize");
        B::quantize(
            tensor.get(),
            scheme,
            QuantizationParametersPrimitive {
                scales: scales.get(),
            },
        )
    }

    fn dequantize(tensor: QuantizedTensor<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        let ctx = current_device::<B>().ctx;
        RtpTensor::new(ctx, B::dequantize(tensor, dtype), Layout::Local)
    }

    fn q_from_data(data: TensorData, device: &Device<Self>) -> QuantizedTensor<Self> {
        B::q_from_data(data, &device.ctx.comm.inner)
    }
    fn q_to_device(tensor: QuantizedTensor<Self>, device: &Device<Self>) -> QuantizedTensor<Self> {
        B::q_to_device(tensor, &device.ctx.comm.inner)
    }
    fn q_reshape(tensor: QuantizedTensor<Self>, shape: Shape) -> QuantizedTensor<Self> {
        B::q_reshape(tensor, shape)
    }
    fn q_expand(tensor: QuantizedTensor<Self>, shape: Shape) -> QuantizedTensor<Self> {
        B::q_expand(tensor, shape)
    }
    fn q_swap_dims(
        tensor: QuantizedTensor<Self>,
        dim1: usize,
        dim2: usize,
    ) -> QuantizedTensor<Self> {
        B::q_swap_dims(tensor, dim1, dim2)
    }
    fn q_permute(tensor: QuantizedTensor<Self>, axes: &[usize]) -> QuantizedTensor<Self> {
        B::q_permute(tensor, axes)
    }
    fn q_flip(tensor: QuantizedTensor<Self>, axes: &[usize]) -> QuantizedTensor<Self> {
        B::q_flip(tensor, axes)
    }
    fn q_select(
        tensor: QuantizedTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> QuantizedTensor<Self> {
        B::q_select(tensor, dim, indices)
    }
    fn q_slice(tensor: QuantizedTensor<Self>, slices: &[Slice]) -> QuantizedTensor<Self> {
        B::q_slice(tensor, slices)
    }

    fn quantize_dynamic(tensor: FloatTensor<Self>, scheme: &QuantScheme) -> QuantizedTensor<Self> {
        full_inner(tensor, "quantize_dynamic").consume(|t| B::quantize_dynamic(t, scheme))
    }
    forward! {
        fn q_gather(dim: usize, tensor: QuantizedTensor<Self>, indices: IntTensor<Self>) -> QuantizedTensor<Self>;
        fn q_argmax(tensor: QuantizedTensor<Self>, dim: usize, out_dtype: IntDType) -> IntTensor<Self>;
        fn q_argmin(tensor: QuantizedTensor<Self>, dim: usize, out_dtype: IntDType) -> IntTensor<Self>;
    }
}
