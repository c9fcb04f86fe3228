//! The backend type: `Rtp<B>` decorates an inner backend `B`.

use crate::backend::device::RtpDevice;
use crate::backend::tensor::RtpTensor;
use burn::tensor::backend::{Backend, BackendTypes, DTypeUsageSet, ExecutionError};
use burn::tensor::DType;
use burn_rtp_kernels::RotationKernels;
use std::marker::PhantomData;

/// Rotated Tensor Parallelism over the inner backend `B`: use `Autodiff<Rtp<B>>` where you
/// used `Autodiff<B>`, and run the same training code on every rank of a world.
#[derive(Clone, Copy, Default, Debug)]
pub struct Rtp<B: Backend> {
    _inner: PhantomData<B>,
}

impl<B: Backend> BackendTypes for Rtp<B> {
    type Device = RtpDevice<B>;
    type FloatTensorPrimitive = RtpTensor<B>;
    type FloatElem = B::FloatElem;
    type IntTensorPrimitive = B::IntTensorPrimitive;
    type IntElem = B::IntElem;
    type BoolTensorPrimitive = B::BoolTensorPrimitive;
    type BoolElem = B::BoolElem;
    type QuantizedTensorPrimitive = B::QuantizedTensorPrimitive;
}

impl<B: RotationKernels> Backend for Rtp<B> {
    fn name(device: &Self::Device) -> String {
        format!("rtp<{}>", B::name(&device.ctx.comm.inner))
    }

    fn seed(device: &Self::Device, seed: u64) {
        // Parameters draw from `seed` alone (flyweight init is rank-independent); other random
        // tensors (dropout) draw from the inner backend, seeded per rank.
        device.ctx.set_seed(seed);
        let per_rank = seed ^ (device.ctx.comm.rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        B::seed(&device.ctx.comm.inner, per_rank)
    }

    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        B::sync(&device.ctx.comm.inner)
    }

    fn memory_persistent_allocations<
        Output: Send,
        Input: Send,
        Func: Fn(Input) -> Output + Send,
    >(
        device: &Self::Device,
        input: Input,
        func: Func,
    ) -> Output {
        // Tensors created in here are parameters: they are sharded at creation.
        let _persistent = device.ctx.enter_persistent();
        B::memory_persistent_allocations(&device.ctx.comm.inner, input, func)
    }

    fn memory_cleanup(device: &Self::Device) {
        B::memory_cleanup(&device.ctx.comm.inner)
    }

    fn dtype_usage(device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(&device.ctx.comm.inner, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        B::device_count(type_id)
    }
}
