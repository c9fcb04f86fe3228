//! Bool ops: bool tensors pass through to the inner backend; only devices are translated.
//!
//! Methods Burn gives a default body are forwarded as well: a default would run as a
//! composition of Rtp's own ops (or a host read, for `bool_argwhere`) and never reach B's kernel.

use crate::backend::device::current_device;
use crate::backend::device::RtpDevice;
use crate::backend::rtp::Rtp;
use crate::backend::tensor::RtpTensor;
use crate::state::sharding::Layout;
use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::*;
use burn::tensor::{BoolDType, FloatDType, IntDType, Scalar, Shape, Slice, TensorData};
use burn_rtp_kernels::RotationKernels;
use std::future::Future;

type Device<B> = <B as burn::tensor::backend::BackendTypes>::Device;

impl<B: RotationKernels> BoolTensorOps<Self> for Rtp<B> {
    async fn bool_into_data(tensor: BoolTensor<Self>) -> Result<TensorData, ExecutionError> {
        B::bool_into_data(tensor).await
    }

    fn bool_device(_tensor: &BoolTensor<Self>) -> RtpDevice<B> {
        current_device::<B>()
    }

    fn bool_into_float(tensor: BoolTensor<Self>, out_dtype: FloatDType) -> FloatTensor<Self> {
        let ctx = current_device::<B>().ctx;
        RtpTensor::new(ctx, B::bool_into_float(tensor, out_dtype), Layout::Local)
    }

    fn bool_empty(shape: Shape, device: &Device<Self>, dtype: BoolDType) -> BoolTensor<Self> {
        B::bool_empty(shape, &device.ctx.comm.inner, dtype)
    }
    fn bool_zeros(shape: Shape, device: &Device<Self>, dtype: BoolDType) -> BoolTensor<Self> {
        B::bool_zeros(shape, &device.ctx.comm.inner, dtype)
    }
    fn bool_ones(shape: Shape, device: &Device<Self>, dtype: BoolDType) -> BoolTensor<Self> {
        B::bool_ones(shape, &device.ctx.comm.inner, dtype)
    }
    fn bool_from_data(data: TensorData, device: &Device<Self>) -> BoolTensor<Self> {
        B::bool_from_data(data, &device.ctx.comm.inner)
    }
    fn bool_into_int(tensor: BoolTensor<Self>, out_dtype: IntDType) -> IntTensor<Self> {
        B::bool_into_int(tensor, out_dtype)
    }
    fn bool_to_device(tensor: BoolTensor<Self>, device: &Device<Self>) -> BoolTensor<Self> {
        B::bool_to_device(tensor, &device.ctx.comm.inner)
    }
    fn bool_reshape(tensor: BoolTensor<Self>, shape: Shape) -> BoolTensor<Self> {
        B::bool_reshape(tensor, shape)
    }
    fn bool_slice(tensor: BoolTensor<Self>, slices: &[Slice]) -> BoolTensor<Self> {
        B::bool_slice(tensor, slices)
    }
    fn bool_slice_assign(
        tensor: BoolTensor<Self>,
        slices: &[Slice],
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        B::bool_slice_assign(tensor, slices, value)
    }
    fn bool_mask_where(
        tensor: BoolTensor<Self>,
        mask: BoolTensor<Self>,
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        B::bool_mask_where(tensor, mask, value)
    }
    fn bool_mask_fill(
        tensor: BoolTensor<Self>,
        mask: BoolTensor<Self>,
        value: Scalar,
    ) -> BoolTensor<Self> {
        B::bool_mask_fill(tensor, mask, value)
    }
    fn bool_gather(
        dim: usize,
        tensor: BoolTensor<Self>,
        indices: IntTensor<Self>,
    ) -> BoolTensor<Self> {
        B::bool_gather(dim, tensor, indices)
    }
    fn bool_scatter_or(
        dim: usize,
        tensor: BoolTensor<Self>,
        indices: IntTensor<Self>,
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        B::bool_scatter_or(dim, tensor, indices, value)
    }
    fn bool_select(
        tensor: BoolTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> BoolTensor<Self> {
        B::bool_select(tensor, dim, indices)
    }
    fn bool_select_or(
        tensor: BoolTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        B::bool_select_or(tensor, dim, indices, value)
    }
    fn bool_equal(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self> {
        B::bool_equal(lhs, rhs)
    }
    fn bool_equal_elem(lhs: BoolTensor<Self>, rhs: Scalar) -> BoolTensor<Self> {
        B::bool_equal_elem(lhs, rhs)
    }
    fn bool_not(tensor: BoolTensor<Self>) -> BoolTensor<Self> {
        B::bool_not(tensor)
    }
    fn bool_and(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self> {
        B::bool_and(lhs, rhs)
    }
    fn bool_or(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self> {
        B::bool_or(lhs, rhs)
    }
    fn bool_swap_dims(tensor: BoolTensor<Self>, dim1: usize, dim2: usize) -> BoolTensor<Self> {
        B::bool_swap_dims(tensor, dim1, dim2)
    }
    fn bool_permute(tensor: BoolTensor<Self>, axes: &[usize]) -> BoolTensor<Self> {
        B::bool_permute(tensor, axes)
    }
    fn bool_flip(tensor: BoolTensor<Self>, axes: &[usize]) -> BoolTensor<Self> {
        B::bool_flip(tensor, axes)
    }
    fn bool_expand(tensor: BoolTensor<Self>, shape: Shape) -> BoolTensor<Self> {
        B::bool_expand(tensor, shape)
    }
    fn bool_unfold(
        tensor: BoolTensor<Self>,
        dim: usize,
        size: usize,
        step: usize,
    ) -> BoolTensor<Self> {
        B::bool_unfold(tensor, dim, size, step)
    }

    // Trait methods with a default body in Burn; see the module doc for why they are forwarded.
    fn bool_argwhere(
        tensor: BoolTensor<Self>,
        out_dtype: IntDType,
    ) -> impl Future<Output = IntTensor<Self>> + 'static + Send {
        B::bool_argwhere(tensor, out_dtype)
    }

    forward! {
        fn bool_repeat_dim(tensor: BoolTensor<Self>, dim: usize, times: usize) -> BoolTensor<Self>;
        fn bool_cat(tensors: Vec<BoolTensor<Self>>, dim: usize) -> BoolTensor<Self>;
        fn bool_not_equal(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self>;
        fn bool_not_equal_elem(lhs: BoolTensor<Self>, rhs: Scalar) -> BoolTensor<Self>;
        fn bool_xor(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self>;
        fn bool_transpose(tensor: BoolTensor<Self>) -> BoolTensor<Self>;
        fn bool_any(tensor: BoolTensor<Self>) -> BoolTensor<Self>;
        fn bool_any_dim(tensor: BoolTensor<Self>, dim: usize) -> BoolTensor<Self>;
        fn bool_all(tensor: BoolTensor<Self>) -> BoolTensor<Self>;
        fn bool_all_dim(tensor: BoolTensor<Self>, dim: usize) -> BoolTensor<Self>;
    }
}
