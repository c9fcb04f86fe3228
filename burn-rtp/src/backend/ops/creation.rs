//! Where a tensor created on a rank lives: a parameter (created inside persistent
//! allocation) is sharded or replicated by the placement policy, a saved shard being loaded
//! becomes this rank's shard again, and anything else is local.

use super::Float;
use crate::backend::device::RtpDevice;
use crate::backend::tensor::RtpTensor;
use crate::error::{raise, RtpError};
use crate::state::shard_io::ShardIo;
use crate::state::sharding::{Layout, ShardSpec};
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, TensorData};

/// How a tensor created on `device` is placed: a parameter (inside persistent allocation) is
/// sharded or replicated by the placement policy; anything else is local.
pub(super) enum Creation {
    Local,
    Replicated,
    Sharded(ShardSpec),
}

pub(super) fn creation<B: Backend>(device: &RtpDevice<B>, shape: &Shape) -> Creation {
    let ctx = &device.ctx;
    if !ctx.persistent() {
        return Creation::Local;
    }
    match ctx.param_spec(shape) {
        Some(spec) => Creation::Sharded(spec),
        None => Creation::Replicated,
    }
}

/// Creates a tensor: `make(shape)` builds an inner tensor of the given (shard) shape.
pub(super) fn create<B: Backend>(
    device: &RtpDevice<B>,
    shape: Shape,
    make: impl FnOnce(Shape) -> Float<B>,
) -> RtpTensor<B> {
    let ctx = device.ctx.clone();
    match creation(device, &shape) {
        Creation::Local => RtpTensor::new(ctx, make(shape), Layout::Local),
        Creation::Replicated => RtpTensor::new(ctx, make(shape), Layout::Replicated),
        Creation::Sharded(spec) => {
            let inner = make(spec.shard_shape(ctx.comm.rank));
            RtpTensor::new(ctx, inner, Layout::Sharded(spec))
        }
    }
}

/// While loading shards, data shaped like a saved shard becomes this rank's shard again.
pub(super) fn load_saved_shard<B: Backend>(
    device: &RtpDevice<B>,
    data: &TensorData,
) -> Option<RtpTensor<B>> {
    let ctx = &device.ctx;
    let shape = data.shape.to_vec();
    let layout = ctx.shard_io.with(|io| {
        let ShardIo::Loading(map) = io else {
            return Ok(None);
        };
        if let Some(full) = map.full_of(&shape) {
            let spec = ShardSpec {
                full: Shape::from(full.clone()),
                world: ctx.comm.world_size,
            };
            if spec.shard_shape(ctx.comm.rank).to_vec() != shape {
                return Err(RtpError::ShardMap {
                    rank: ctx.comm.rank,
                    op: "load_shards".into(),
                    reason: format!(
                        "the checkpoint has a shard of shape {shape:?} of {full:?}, but this \
                         rank's shard of {full:?} in a world of {} is {:?}",
                        ctx.comm.world_size,
                        spec.shard_shape(ctx.comm.rank).to_vec()
                    ),
                });
            }
            Ok(Some(Layout::Sharded(spec)))
        } else if map.replicated.contains(&shape) {
            Ok(Some(Layout::Replicated))
        } else {
            Ok(None)
        }
    });
    let layout = layout.unwrap_or_else(|e| raise(e))?;
    let inner = B::float_from_data(data.clone(), &ctx.comm.inner);
    Some(RtpTensor::new(ctx.clone(), inner, layout))
}
