//! The float tensor primitive: a local tensor, a replicated parameter, or this rank's shard.

use crate::accounting::{Category, Charge};
use crate::sharding::ShardSpec;
use crate::world::RankCtx;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, TensorMetadata};
use std::sync::Arc;

/// Where the elements of a float tensor live.
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// This rank's own values (activations, data, temporaries).
    Local,
    /// A small parameter (or its state) held whole and identical on every rank.
    Replicated,
    /// One column range of a tensor whose full value is the same on every rank.
    Sharded(ShardSpec),
}

impl Layout {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Layout::Local => "local",
            Layout::Replicated => "replicated",
            Layout::Sharded(_) => "sharded",
        }
    }

    fn category(&self) -> Category {
        match self {
            Layout::Local => Category::Local,
            Layout::Replicated | Layout::Sharded(_) => Category::Sharded,
        }
    }
}

/// Float tensor of [`Rtp`](crate::Rtp): the inner tensor, its layout and its rank.
///
/// It reports the logical (full) shape, so module code and optimizers see ordinary tensors.
pub struct RtpTensor<B: Backend> {
    pub(crate) inner: B::FloatTensorPrimitive,
    pub(crate) layout: Layout,
    pub(crate) ctx: Arc<RankCtx<B>>,
    charge: Arc<Charge>,
}

impl<B: Backend> Clone for RtpTensor<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layout: self.layout.clone(),
            ctx: self.ctx.clone(),
            charge: self.charge.clone(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for RtpTensor<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RtpTensor({} {:?} on rank {}: {:?})",
            self.layout.name(),
            self.shape().to_vec(),
            self.ctx.rank,
            self.inner
        )
    }
}

impl<B: Backend> TensorMetadata for RtpTensor<B> {
    fn dtype(&self) -> DType {
        self.inner.dtype()
    }

    fn shape(&self) -> Shape {
        match &self.layout {
            Layout::Sharded(spec) => spec.full.clone(),
            _ => self.inner.shape(),
        }
    }
}

fn bytes_of<T: TensorMetadata>(t: &T) -> usize {
    t.shape().num_elements() * t.dtype().size()
}

impl<B: Backend> RtpTensor<B> {
    /// Wraps a freshly computed inner tensor, charging it by layout.
    pub(crate) fn new(
        ctx: Arc<RankCtx<B>>,
        inner: B::FloatTensorPrimitive,
        layout: Layout,
    ) -> Self {
        let charge = ctx.ledger.charge(layout.category(), bytes_of(&inner));
        Self {
            inner,
            layout,
            ctx,
            charge,
        }
    }

    /// Wraps the result of an op on `self`, reusing its charge when the inner backend could
    /// have reused the buffer (sole owner, same size, same category).
    pub(crate) fn derive(self, inner: B::FloatTensorPrimitive, layout: Layout) -> Self {
        let reusable = Arc::strong_count(&self.charge) == 1
            && self.charge.bytes() == bytes_of(&inner)
            && self.charge.category() == layout.category();
        if reusable {
            Self {
                inner,
                layout,
                ctx: self.ctx,
                charge: self.charge,
            }
        } else {
            Self::new(self.ctx, inner, layout)
        }
    }

    /// The logical shape as a plain vector, for messages.
    pub(crate) fn dims(&self) -> Vec<usize> {
        self.shape().to_vec()
    }

    /// The layout of this tensor.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The rank this tensor belongs to.
    pub fn rank(&self) -> usize {
        self.ctx.rank
    }

    /// Shape of the inner tensor: this rank's shard, for a sharded tensor.
    pub fn inner_shape(&self) -> Vec<usize> {
        self.inner.shape().to_vec()
    }

    /// The inner backend tensor (the shard, for a sharded tensor).
    pub fn inner(&self) -> &B::FloatTensorPrimitive {
        &self.inner
    }
}
