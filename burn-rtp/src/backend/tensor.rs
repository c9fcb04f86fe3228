//! The float tensor primitive: a local tensor, a replicated parameter, or this rank's shard.

use crate::backend::pairing::{Identity, Operand, Placed};
use crate::backend::rank::RankCtx;
use crate::state::accounting::{bytes_of, Category, Charge, Held};
use crate::state::sharding::Layout;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, TensorMetadata};
use std::sync::Arc;

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
            self.ctx.comm.rank,
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

impl<B: Backend> RtpTensor<B> {
    /// Wraps a freshly computed inner tensor, charging it by layout.
    pub(crate) fn new(
        ctx: Arc<RankCtx<B>>,
        inner: B::FloatTensorPrimitive,
        layout: Layout,
    ) -> Self {
        if matches!(layout, Layout::Local) {
            ctx.release_inputs();
        }
        let charge = ctx.comm.ledger.charge(layout.category(), bytes_of(&inner));
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
        self.take().1.derive(inner, layout)
    }

    /// Takes the inner tensor out for an op that consumes it, so that a backend which writes
    /// in place when it holds the only handle (burn-ndarray) can: an op given a clone while
    /// this tensor still held its own would copy every element first. The rest wraps the op's
    /// result ([`Taken::derive`]).
    pub(crate) fn take(self) -> (B::FloatTensorPrimitive, Taken<B>) {
        let Self {
            inner, ctx, charge, ..
        } = self;
        (inner, Taken { ctx, charge })
    }

    /// `inner`, a view of this tensor's elements in another shape (a reshape), under the same
    /// charge: the same identity, and bytes counted once.
    pub(crate) fn view(self, inner: B::FloatTensorPrimitive, layout: Layout) -> Self {
        debug_assert_eq!(
            bytes_of(&inner),
            self.charge.bytes(),
            "a view changed the size"
        );
        Self {
            inner,
            layout,
            ctx: self.ctx,
            charge: self.charge,
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
        self.ctx.comm.rank
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

    /// Hands this gradient of a replicated weight to the rank's strategy (DDP's buckets sum
    /// it ahead of the step; see `backend::strategy::ddp`).
    pub(crate) fn offer_gradient(&self) {
        self.ctx.on_gradient(&self.charge, &self.inner);
    }

    /// The reduced sum of this very gradient, if the strategy computed it ahead.
    pub(crate) fn claim_reduced(&self) -> Option<B::FloatTensorPrimitive> {
        self.ctx.claim_reduced(&self.charge)
    }

    /// This parameter as the optimizer registers it (see `backend::strategy::fsdp`).
    pub(crate) fn as_param(&self) -> crate::backend::strategy::Param<B> {
        (self.charge.clone(), self.inner.clone(), self.layout.clone())
    }

    /// The whole of this sharded parameter for a module op under FSDP, gathered ahead where
    /// the last step's order says so.
    pub(crate) fn gather_param(&self, op: &'static str) -> Held<B> {
        self.ctx
            .gather_param(&self.charge, &self.inner, &self.layout, op)
    }

    /// Takes the inner tensor out of its wrapper for an op, keeping it charged.
    pub(crate) fn held(self) -> Held<B> {
        Held::from_parts(self.inner, self.charge)
    }
}

/// A tensor whose inner tensor an op took ([`RtpTensor::take`]): its rank and its charge.
pub(crate) struct Taken<B: Backend> {
    ctx: Arc<RankCtx<B>>,
    charge: Arc<Charge>,
}

impl<B: Backend> Taken<B> {
    /// Wraps the result of the op, reusing the charge when the inner backend could have
    /// reused the buffer (sole owner, same size, same category).
    pub(crate) fn derive(self, inner: B::FloatTensorPrimitive, layout: Layout) -> RtpTensor<B> {
        let reusable = Arc::strong_count(&self.charge) == 1
            && self.charge.bytes() == bytes_of(&inner)
            && self.charge.category() == layout.category();
        if reusable {
            RtpTensor {
                inner,
                layout,
                ctx: self.ctx,
                charge: self.charge,
            }
        } else {
            RtpTensor::new(self.ctx, inner, layout)
        }
    }
}

impl<B: Backend> RtpTensor<B> {
    /// Splits into the charged inner tensor and its layout, to be kept without the rank.
    pub(crate) fn into_placed(self) -> Placed<B> {
        (Held::from_parts(self.inner, self.charge), self.layout)
    }

    /// Rewraps what [`RtpTensor::into_placed`] split, with its charge as it was.
    pub(crate) fn from_placed(ctx: Arc<RankCtx<B>>, (held, layout): Placed<B>) -> Self {
        let (inner, charge) = held.into_parts();
        Self {
            inner,
            layout,
            ctx,
            charge,
        }
    }
}

impl<B: Backend> Operand<B> for RtpTensor<B> {
    fn identity(&self) -> Identity {
        RtpTensor::identity(self)
    }

    fn dims(&self) -> Vec<usize> {
        RtpTensor::dims(self)
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn keep(&self) -> Held<B> {
        self.clone().held()
    }
}

impl<B: Backend> Held<B> {
    /// Wraps the tensor as a local tensor of `ctx`, keeping a local charge as it is.
    pub(crate) fn into_local(self, ctx: Arc<RankCtx<B>>) -> RtpTensor<B> {
        if self.category() == Category::Local {
            let (inner, charge) = self.into_parts();
            return RtpTensor {
                inner,
                layout: Layout::Local,
                ctx,
                charge,
            };
        }
        self.consume(|t| RtpTensor::new(ctx, t, Layout::Local))
    }
}
