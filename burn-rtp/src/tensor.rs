//! The float tensor primitive: a local tensor, a replicated parameter, or this rank's shard.

use crate::accounting::{Category, Charge};
use crate::sharding::ShardSpec;
use crate::world::RankCtx;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, TensorMetadata};
use std::sync::Arc;

/// The inner backend's float tensor.
pub(crate) type Float<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

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

    /// Identity of this tensor and its clones (their shared charge), for pairing calls that
    /// Burn makes with the same tensor; it never keeps the tensor alive.
    pub(crate) fn identity(&self) -> std::sync::Weak<Charge> {
        Arc::downgrade(&self.charge)
    }

    /// Takes the inner tensor out of its wrapper for an op, keeping it charged.
    pub(crate) fn held(self) -> Held<B> {
        Held {
            tensor: self.inner,
            charge: self.charge,
        }
    }
}

/// An inner tensor outside any wrapper (taken out for an op, gathered, or assembled), still
/// charged to its rank: the ledger must see every buffer an op keeps alive, not only those
/// wrapped in an [`RtpTensor`]. The charge ends when the `Held` drops.
pub(crate) struct Held<B: Backend> {
    tensor: Float<B>,
    charge: Arc<Charge>,
}

impl<B: Backend> std::ops::Deref for Held<B> {
    type Target = Float<B>;

    fn deref(&self) -> &Float<B> {
        &self.tensor
    }
}

impl<B: Backend> Held<B> {
    /// Charges a freshly computed inner tensor to `cat` on `ctx`'s ledger.
    pub(crate) fn new(ctx: &RankCtx<B>, tensor: Float<B>, cat: Category) -> Self {
        let charge = ctx.ledger.charge(cat, bytes_of(&tensor));
        Self { tensor, charge }
    }

    /// A handle to the tensor for an op that reads it; the charge stays with `self`.
    pub(crate) fn get(&self) -> Float<B> {
        self.tensor.clone()
    }

    /// Gives the tensor to `f`, which consumes it, and releases the charge only once `f`
    /// returned (and charged its result), so the input and the output are never both unseen.
    pub(crate) fn consume<R>(self, f: impl FnOnce(Float<B>) -> R) -> R {
        let Held { tensor, charge } = self;
        let out = f(tensor);
        drop(charge);
        out
    }

    /// Ends the charge and returns the tensor, for a result that leaves the decorator (host
    /// data read out of it): from here on it is not the rank's device memory to count.
    pub(crate) fn release(self) -> Float<B> {
        self.tensor
    }

    /// Wraps the tensor as a local tensor of `ctx`, keeping a local charge as it is.
    pub(crate) fn into_local(self, ctx: Arc<RankCtx<B>>) -> RtpTensor<B> {
        if self.charge.category() == Category::Local {
            return RtpTensor {
                inner: self.tensor,
                layout: Layout::Local,
                ctx,
                charge: self.charge,
            };
        }
        self.consume(|t| RtpTensor::new(ctx, t, Layout::Local))
    }
}
