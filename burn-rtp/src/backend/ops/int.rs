//! Int ops: int tensors pass through to the inner backend; only devices are translated.
//!
//! Methods Burn gives a default body are forwarded as well: a default would run as a
//! composition of Rtp's own ops (host-built data, host sorts) and never reach B's kernel.

use crate::backend::device::current_device;
use crate::backend::device::RtpDevice;
use crate::backend::rtp::Rtp;
use crate::backend::tensor::RtpTensor;
use crate::state::sharding::Layout;
use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::*;
use burn::tensor::{
    BoolDType, Distribution, FloatDType, IndexingUpdateOp, IntDType, Scalar, Shape, Slice,
    TensorData,
};
use burn_rtp_kernels::RotationKernels;
use std::ops::Range;

type Device<B> = <B as burn::tensor::backend::BackendTypes>::Device;

impl<B: RotationKernels> IntTensorOps<Self> for Rtp<B> {
    async fn int_into_data(tensor: IntTensor<Self>) -> Result<TensorData, ExecutionError> {
        B::int_into_data(tensor).await
    }

    fn int_device(_tensor: &IntTensor<Self>) -> RtpDevice<B> {
        current_device::<B>()
    }

    fn int_into_float(tensor: IntTensor<Self>, out_dtype: FloatDType) -> FloatTensor<Self> {
        let ctx = current_device::<B>().ctx;
        RtpTensor::new(ctx, B::int_into_float(tensor, out_dtype), Layout::Local)
    }

    fn int_empty(shape: Shape, device: &Device<Self>, dtype: IntDType) -> IntTensor<Self> {
        B::int_empty(shape, &device.ctx.comm.inner, dtype)
    }
    fn int_from_data(data: TensorData, device: &Device<Self>) -> IntTensor<Self> {
        B::int_from_data(data, &device.ctx.comm.inner)
    }
    fn int_to_device(tensor: IntTensor<Self>, device: &Device<Self>) -> IntTensor<Self> {
        B::int_to_device(tensor, &device.ctx.comm.inner)
    }
    fn int_reshape(tensor: IntTensor<Self>, shape: Shape) -> IntTensor<Self> {
        B::int_reshape(tensor, shape)
    }
    fn int_slice(tensor: IntTensor<Self>, slices: &[Slice]) -> IntTensor<Self> {
        B::int_slice(tensor, slices)
    }
    fn int_slice_assign(
        tensor: IntTensor<Self>,
        slices: &[Slice],
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        B::int_slice_assign(tensor, slices, value)
    }
    fn int_mask_where(
        tensor: IntTensor<Self>,
        mask: BoolTensor<Self>,
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        B::int_mask_where(tensor, mask, value)
    }
    fn int_mask_fill(
        tensor: IntTensor<Self>,
        mask: BoolTensor<Self>,
        value: Scalar,
    ) -> IntTensor<Self> {
        B::int_mask_fill(tensor, mask, value)
    }
    fn int_gather(
        dim: usize,
        tensor: IntTensor<Self>,
        indices: IntTensor<Self>,
    ) -> IntTensor<Self> {
        B::int_gather(dim, tensor, indices)
    }
    fn int_scatter_add(
        dim: usize,
        tensor: IntTensor<Self>,
        indices: IntTensor<Self>,
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        B::int_scatter_add(dim, tensor, indices, value)
    }
    fn int_select(
        tensor: IntTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> IntTensor<Self> {
        B::int_select(tensor, dim, indices)
    }
    fn int_select_add(
        tensor: IntTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        B::int_select_add(tensor, dim, indices, value)
    }
    fn int_equal(
        lhs: IntTensor<Self>,
        rhs: IntTensor<Self>,
        out_dtype: BoolDType,
    ) -> BoolTensor<Self> {
        B::int_equal(lhs, rhs, out_dtype)
    }
    fn int_equal_elem(lhs: IntTensor<Self>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Self> {
        B::int_equal_elem(lhs, rhs, out_dtype)
    }
    fn int_greater(
        lhs: IntTensor<Self>,
        rhs: IntTensor<Self>,
        out_dtype: BoolDType,
    ) -> BoolTensor<Self> {
        B::int_greater(lhs, rhs, out_dtype)
    }
    fn int_greater_elem(
        lhs: IntTensor<Self>,
        rhs: Scalar,
        out_dtype: BoolDType,
    ) -> BoolTensor<Self> {
        B::int_greater_elem(lhs, rhs, out_dtype)
    }
    fn int_greater_equal(
        lhs: IntTensor<Self>,
        rhs: IntTensor<Self>,
        out_dtype: BoolDType,
    ) -> BoolTensor<Self> {
        B::int_greater_equal(lhs, rhs, out_dtype)
    }
    fn int_greater_equal_elem(
        lhs: IntTensor<Self>,
        rhs: Scalar,
        out_dtype: BoolDType,
    ) -> BoolTensor<Self> {
        B::int_greater_equal_elem(lhs, rhs, out_dtype)
    }
    fn int_lower(
        lhs: IntTensor<Self>,
        rhs: IntTensor<Self>,
        out_dtype: BoolDType,
    ) -> BoolTensor<Self> {
        B::int_lower(lhs, rhs, out_dtype)
    }
    fn int_lower_elem(lhs: IntTensor<Self>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Self> {
        B::int_lower_elem(lhs, rhs, out_dtype)
    }
    fn int_lower_equal(
        lhs: IntTensor<Self>,
        rhs: IntTensor<Self>,
        out_dtype: BoolDType,
    ) -> BoolTensor<Self> {
        B::int_lower_equal(lhs, rhs, out_dtype)
    }
    fn int_lower_equal_elem(
        lhs: IntTensor<Self>,
        rhs: Scalar,
        out_dtype: BoolDType,
    ) -> BoolTensor<Self> {
        B::int_lower_equal_elem(lhs, rhs, out_dtype)
    }
    fn int_add(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::int_add(lhs, rhs)
    }
    fn int_add_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        B::int_add_scalar(lhs, rhs)
    }
    fn int_sub(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::int_sub(lhs, rhs)
    }
    fn int_sub_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        B::int_sub_scalar(lhs, rhs)
    }
    fn int_mul(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::int_mul(lhs, rhs)
    }
    fn int_mul_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        B::int_mul_scalar(lhs, rhs)
    }
    fn int_div(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::int_div(lhs, rhs)
    }
    fn int_div_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        B::int_div_scalar(lhs, rhs)
    }
    fn int_remainder(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::int_remainder(lhs, rhs)
    }
    fn int_remainder_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        B::int_remainder_scalar(lhs, rhs)
    }
    fn int_matmul(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::int_matmul(lhs, rhs)
    }
    fn int_sum(tensor: IntTensor<Self>) -> IntTensor<Self> {
        B::int_sum(tensor)
    }
    fn int_sum_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        B::int_sum_dim(tensor, dim)
    }
    fn int_prod(tensor: IntTensor<Self>) -> IntTensor<Self> {
        B::int_prod(tensor)
    }
    fn int_prod_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        B::int_prod_dim(tensor, dim)
    }
    fn int_mean_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        B::int_mean_dim(tensor, dim)
    }
    fn int_cumsum(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        B::int_cumsum(tensor, dim)
    }
    fn int_cumprod(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        B::int_cumprod(tensor, dim)
    }
    fn int_cummin(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        B::int_cummin(tensor, dim)
    }
    fn int_cummax(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        B::int_cummax(tensor, dim)
    }
    fn int_argmax(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        B::int_argmax(tensor, dim)
    }
    fn int_argtopk(tensor: IntTensor<Self>, dim: usize, k: usize) -> IntTensor<Self> {
        B::int_argtopk(tensor, dim, k)
    }
    fn int_argmin(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        B::int_argmin(tensor, dim)
    }
    fn int_abs(tensor: IntTensor<Self>) -> IntTensor<Self> {
        B::int_abs(tensor)
    }
    fn int_swap_dims(tensor: IntTensor<Self>, dim1: usize, dim2: usize) -> IntTensor<Self> {
        B::int_swap_dims(tensor, dim1, dim2)
    }
    fn int_permute(tensor: IntTensor<Self>, axes: &[usize]) -> IntTensor<Self> {
        B::int_permute(tensor, axes)
    }
    fn int_flip(tensor: IntTensor<Self>, axes: &[usize]) -> IntTensor<Self> {
        B::int_flip(tensor, axes)
    }
    fn int_random(
        shape: Shape,
        distribution: Distribution,
        device: &Device<Self>,
        dtype: IntDType,
    ) -> IntTensor<Self> {
        B::int_random(shape, distribution, &device.ctx.comm.inner, dtype)
    }
    fn int_expand(tensor: IntTensor<Self>, shape: Shape) -> IntTensor<Self> {
        B::int_expand(tensor, shape)
    }
    fn bitwise_and(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::bitwise_and(lhs, rhs)
    }
    fn bitwise_and_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        B::bitwise_and_scalar(lhs, rhs)
    }
    fn bitwise_or(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::bitwise_or(lhs, rhs)
    }
    fn bitwise_or_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        B::bitwise_or_scalar(lhs, rhs)
    }
    fn bitwise_xor(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::bitwise_xor(lhs, rhs)
    }
    fn bitwise_xor_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        B::bitwise_xor_scalar(lhs, rhs)
    }
    fn bitwise_not(tensor: IntTensor<Self>) -> IntTensor<Self> {
        B::bitwise_not(tensor)
    }
    fn bitwise_left_shift(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::bitwise_left_shift(lhs, rhs)
    }
    fn bitwise_left_shift_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        B::bitwise_left_shift_scalar(lhs, rhs)
    }
    fn bitwise_right_shift(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        B::bitwise_right_shift(lhs, rhs)
    }
    fn bitwise_right_shift_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        B::bitwise_right_shift_scalar(lhs, rhs)
    }
    fn int_cast(tensor: IntTensor<Self>, dtype: IntDType) -> IntTensor<Self> {
        B::int_cast(tensor, dtype)
    }
    fn int_unfold(
        tensor: IntTensor<Self>,
        dim: usize,
        size: usize,
        step: usize,
    ) -> IntTensor<Self> {
        B::int_unfold(tensor, dim, size, step)
    }

    // Trait methods with a default body in Burn; see the module doc for why they are forwarded.
    fn int_zeros(shape: Shape, device: &Device<Self>, dtype: IntDType) -> IntTensor<Self> {
        B::int_zeros(shape, &device.ctx.comm.inner, dtype)
    }
    fn int_ones(shape: Shape, device: &Device<Self>, dtype: IntDType) -> IntTensor<Self> {
        B::int_ones(shape, &device.ctx.comm.inner, dtype)
    }
    fn int_full(
        shape: Shape,
        fill_value: Scalar,
        device: &Device<Self>,
        dtype: IntDType,
    ) -> IntTensor<Self> {
        B::int_full(shape, fill_value, &device.ctx.comm.inner, dtype)
    }
    fn int_arange_step(
        range: Range<i64>,
        step: usize,
        device: &Device<Self>,
        dtype: IntDType,
    ) -> IntTensor<Self> {
        B::int_arange_step(range, step, &device.ctx.comm.inner, dtype)
    }
    fn int_arange(range: Range<i64>, device: &Device<Self>, dtype: IntDType) -> IntTensor<Self> {
        B::int_arange(range, &device.ctx.comm.inner, dtype)
    }

    forward! {
        fn int_scatter_nd(
            data: IntTensor<Self>,
            indices: IntTensor<Self>,
            values: IntTensor<Self>,
            reduction: IndexingUpdateOp,
        ) -> IntTensor<Self>;
        fn int_gather_nd(data: IntTensor<Self>, indices: IntTensor<Self>) -> IntTensor<Self>;
        fn int_repeat_dim(tensor: IntTensor<Self>, dim: usize, times: usize) -> IntTensor<Self>;
        fn int_cat(tensors: Vec<IntTensor<Self>>, dim: usize) -> IntTensor<Self>;
        fn int_not_equal(
            lhs: IntTensor<Self>,
            rhs: IntTensor<Self>,
            out_dtype: BoolDType,
        ) -> BoolTensor<Self>;
        fn int_not_equal_elem(
            lhs: IntTensor<Self>,
            rhs: Scalar,
            out_dtype: BoolDType,
        ) -> BoolTensor<Self>;
        fn int_powi(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self>;
        fn int_powi_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self>;
        fn int_powi_scalar_impl(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self>;
        fn int_clamp_min(tensor: IntTensor<Self>, min: Scalar) -> IntTensor<Self>;
        fn int_clamp_max(tensor: IntTensor<Self>, max: Scalar) -> IntTensor<Self>;
        fn int_clamp(tensor: IntTensor<Self>, min: Scalar, max: Scalar) -> IntTensor<Self>;
        fn int_neg(tensor: IntTensor<Self>) -> IntTensor<Self>;
        fn int_mean(tensor: IntTensor<Self>) -> IntTensor<Self>;
        fn int_topk(tensor: IntTensor<Self>, dim: usize, k: usize) -> IntTensor<Self>;
        fn int_max(tensor: IntTensor<Self>) -> IntTensor<Self>;
        fn int_max_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self>;
        fn int_max_dim_with_indices(
            tensor: IntTensor<Self>,
            dim: usize,
        ) -> (IntTensor<Self>, IntTensor<Self>);
        fn int_max_abs(tensor: IntTensor<Self>) -> IntTensor<Self>;
        fn int_max_abs_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self>;
        fn int_min(tensor: IntTensor<Self>) -> IntTensor<Self>;
        fn int_min_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self>;
        fn int_min_dim_with_indices(
            tensor: IntTensor<Self>,
            dim: usize,
        ) -> (IntTensor<Self>, IntTensor<Self>);
        fn int_transpose(tensor: IntTensor<Self>) -> IntTensor<Self>;
        fn int_any(tensor: IntTensor<Self>, out_dtype: BoolDType) -> BoolTensor<Self>;
        fn int_any_dim(
            tensor: IntTensor<Self>,
            dim: usize,
            out_dtype: BoolDType,
        ) -> BoolTensor<Self>;
        fn int_all(tensor: IntTensor<Self>, out_dtype: BoolDType) -> BoolTensor<Self>;
        fn int_all_dim(
            tensor: IntTensor<Self>,
            dim: usize,
            out_dtype: BoolDType,
        ) -> BoolTensor<Self>;
        fn int_sign(tensor: IntTensor<Self>) -> IntTensor<Self>;
        fn int_sort(tensor: IntTensor<Self>, dim: usize, descending: bool) -> IntTensor<Self>;
        fn int_sort_with_indices(
            tensor: IntTensor<Self>,
            dim: usize,
            descending: bool,
        ) -> (IntTensor<Self>, IntTensor<Self>);
        fn int_argsort(tensor: IntTensor<Self>, dim: usize, descending: bool) -> IntTensor<Self>;
    }
}
