//! The one extra line for models whose parameters are also used outside module ops
//! (LayerNorm gains, say): wrap the optimizer so that such gradients are averaged over ranks.
//! The wrapper is also where the global gradient norm is clipped, since only it sees every
//! gradient with its layout (each shard counted once, each replicated gradient once).

use crate::backend::rtp::Rtp;
use crate::backend::tensor::RtpTensor;
use crate::comm::collectives::read_host;
use crate::comm::collectives::{
    all_gather_host, all_reduce_ring, reduce_scatter_columns, sum_in_rank_order,
};
use crate::state::accounting::Held;
use crate::state::accounting::{Category, Phase};
use crate::state::sharding::Layout;
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Scalar, Tensor, TensorPrimitive};
use burn_rtp_kernels::RotationKernels;

/// Wraps any Burn optimizer for RTP: `RtpOptimizer::new(AdamConfig::new().init())`.
///
/// Gradients that come out of rotated module ops are already averaged and sharded. Gradients
/// of parameters used elsewhere (replicated parameters, or sharded ones that an op gathered)
/// are per-rank; this wrapper averages them over ranks, shards them like their parameter,
/// and then delegates. Forgetting it is reported as an error at the first update.
#[derive(Clone)]
pub struct RtpOptimizer<O> {
    inner: O,
    clip_grad_norm: Option<f32>,
    last_grad_norm: Option<GradNorm>,
}

/// The global gradient norm of one update, as [`RtpOptimizer::with_clip_grad_norm`] computed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradNorm {
    /// `sqrt(Σ g²)` over every parameter and every rank, before clipping; the same on every rank.
    pub norm: f32,
    /// This rank's share of `Σ g²`: its gradient shards, plus, on rank 0 only, the replicated
    /// gradients. Pass it to [`RtpDevice::check_finite`](crate::RtpDevice::check_finite) to
    /// learn which rank a non-finite norm came from.
    pub local_sum_of_squares: f32,
    /// The factor the gradients were multiplied by: `min(1, max / (norm + 1e-6))`.
    pub scale: f32,
}

impl<O> RtpOptimizer<O> {
    /// Wraps `inner`.
    pub fn new(inner: O) -> Self {
        Self {
            inner,
            clip_grad_norm: None,
            last_grad_norm: None,
        }
    }

    /// Scales all gradients by `min(1, max / (norm + 1e-6))` before each update, where `norm`
    /// is the global L2 norm over every parameter of every rank: PyTorch's `clip_grad_norm_`,
    /// and FSDP's. Sharded gradients count once (each rank its own shard), replicated ones
    /// once (on rank 0); the ranks' shares meet in one scalar all-reduce.
    ///
    /// When the norm is NaN or infinite the update is skipped (the module is returned as it
    /// was) and [`last_grad_norm`](Self::last_grad_norm) says so.
    ///
    /// # Panics
    /// If `max` is not a positive finite number.
    pub fn with_clip_grad_norm(mut self, max: f32) -> Self {
        assert!(
            max.is_finite() && max > 0.0,
            "RtpOptimizer::with_clip_grad_norm: the maximum norm must be positive and finite, not {max}"
        );
        self.clip_grad_norm = Some(max);
        self
    }

    /// The global gradient norm of the last update, when clipping is on.
    pub fn last_grad_norm(&self) -> Option<GradNorm> {
        self.last_grad_norm
    }

    /// The wrapped optimizer.
    pub fn inner(&self) -> &O {
        &self.inner
    }
}

/// Replaces each gradient in `grads` by `f(its parameter's layout, the gradient)`.
struct MapGradients<'a, I: RotationKernels, F> {
    grads: &'a mut GradientsParams,
    f: F,
    _inner: std::marker::PhantomData<I>,
}

pub(crate) fn primitive<I: RotationKernels, const D: usize>(t: Tensor<Rtp<I>, D>) -> RtpTensor<I> {
    match t.into_primitive() {
        TensorPrimitive::Float(t) => t,
        TensorPrimitive::QFloat(_) => panic!("RtpOptimizer: quantized gradients are not supported"),
    }
}

/// Averages a per-rank gradient over ranks and gives it its parameter's layout.
fn sync_gradient<I: RotationKernels>(param: &Layout, grad: RtpTensor<I>) -> RtpTensor<I> {
    if matches!(grad.layout, Layout::Sharded(_) | Layout::Replicated) {
        return grad;
    }
    let ctx = grad.ctx.clone();
    let mean = |t| I::float_mul_scalar(t, Scalar::Float(1.0 / ctx.comm.world_size as f64));
    // DDP's buckets summed this very gradient during the backward.
    if *param == Layout::Replicated {
        if let Some(summed) = grad.claim_reduced() {
            return RtpTensor::new(ctx.clone(), mean(summed), Layout::Replicated);
        }
    }
    match param {
        // Each rank needs only its shard of the sum: a reduce-scatter, half an all-reduce.
        Layout::Sharded(spec) => {
            let op = "optimizer.reduce_scatter_gradient";
            let own = reduce_scatter_columns(&ctx.comm, op, spec, grad.inner.clone());
            RtpTensor::new(ctx.clone(), mean(own), Layout::Sharded(spec.clone()))
        }
        _ => {
            let op = "optimizer.average_gradient";
            let summed = all_reduce_ring(&ctx.comm, op, grad.inner.clone());
            RtpTensor::new(ctx.clone(), mean(summed), Layout::Replicated)
        }
    }
}

impl<B, I, F> ModuleVisitor<B> for MapGradients<'_, I, F>
where
    I: RotationKernels,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    F: FnMut(&Layout, RtpTensor<I>) -> RtpTensor<I>,
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<Rtp<I>, D>(param.id) else {
            return;
        };
        let layout = primitive(param.val().inner()).layout.clone();
        let mapped = (self.f)(&layout, primitive(grad));
        self.grads.register::<Rtp<I>, D>(
            param.id,
            Tensor::from_primitive(TensorPrimitive::Float(mapped)),
        );
    }
}

/// Replaces each gradient in `grads` by `f(its parameter's layout, the gradient)`, in the
/// module's parameter order (the same on every rank, so collectives inside `f` match).
fn map_gradients<M, B, I>(
    module: &M,
    grads: &mut GradientsParams,
    f: impl FnMut(&Layout, RtpTensor<I>) -> RtpTensor<I>,
) where
    I: RotationKernels,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    M: AutodiffModule<B>,
{
    module.visit(&mut MapGradients {
        grads,
        f,
        _inner: std::marker::PhantomData,
    });
}

/// Averages the per-rank gradients in `grads` over ranks, in the module's parameter order.
///
/// Under DDP it first starts the last, partial gradient bucket, takes the sums the buckets
/// computed during the backward, and all-reduces the rest.
pub fn sync_gradients<M, B, I>(module: &M, grads: &mut GradientsParams)
where
    I: RotationKernels,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    M: AutodiffModule<B>,
{
    let ctx = module_ctx::<M, B, I>(module);
    if let Some(ctx) = &ctx {
        ctx.before_sync();
    }
    map_gradients::<M, B, I>(module, grads, sync_gradient);
    if let Some(ctx) = &ctx {
        ctx.after_sync();
    }
}

/// Adds up this rank's share of `Σ g²`: sharded gradients on every rank, replicated ones on
/// rank 0 only, so that the sum over ranks counts every element once.
struct SumOfSquares<'a, I: RotationKernels> {
    grads: &'a GradientsParams,
    rank: usize,
    sum: f64,
    _inner: std::marker::PhantomData<I>,
}

impl<B, I> ModuleVisitor<B> for SumOfSquares<'_, I>
where
    I: RotationKernels,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.get::<Rtp<I>, D>(param.id) else {
            return;
        };
        let grad = primitive(grad);
        if !matches!(grad.layout, Layout::Sharded(_)) && self.rank != 0 {
            return;
        }
        // g² is as large as the gradient: charge it while it lives.
        let squares = Held::<I>::new(
            &grad.ctx.comm.ledger,
            I::float_mul(grad.inner.clone(), grad.inner.clone()),
            Category::Local,
        );
        let sum = squares.consume(|sq| read_host::<I>(I::float_sum(sq)));
        self.sum += f64::from(sum.convert::<f32>().to_vec::<f32>().unwrap()[0]);
    }
}

/// Clips the synchronised gradients in `grads` to the global norm `max` (see
/// [`RtpOptimizer::with_clip_grad_norm`]) and returns the norm found.
fn clip_grad_norm<M, B, I>(module: &M, grads: &mut GradientsParams, max: f32) -> Option<GradNorm>
where
    I: RotationKernels,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    M: AutodiffModule<B>,
{
    let ctx = module_ctx::<M, B, I>(module)?;
    let mut squares = SumOfSquares::<I> {
        grads,
        rank: ctx.comm.rank,
        sum: 0.0,
        _inner: std::marker::PhantomData,
    };
    module.visit(&mut squares);
    let local = squares.sum as f32;
    let total = sum_in_rank_order(all_gather_host(
        &ctx.comm,
        "optimizer.clip_grad_norm",
        vec![local],
    ))[0];
    let norm = total.sqrt();
    let scale = (max / (norm + 1e-6)).min(1.0);
    if norm.is_finite() && scale < 1.0 {
        map_gradients::<M, B, I>(module, grads, |_, g| {
            let factor = Scalar::Float(f64::from(scale));
            let scaled = I::float_mul_scalar(g.inner.clone(), factor);
            RtpTensor::new(g.ctx.clone(), scaled, g.layout.clone())
        });
    }
    Some(GradNorm {
        norm,
        local_sum_of_squares: local,
        scale,
    })
}

/// Registers `module`'s sharded parameters, in its order, for FSDP's prefetch.
fn register_params<M, B, I>(ctx: &crate::backend::rank::RankCtx<I>, module: &M)
where
    I: RotationKernels,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    M: AutodiffModule<B>,
{
    if !ctx.wants_params() {
        return;
    }
    struct Sharded<I: RotationKernels>(Vec<crate::backend::strategy::Param<I>>);
    impl<B, I> ModuleVisitor<B> for Sharded<I>
    where
        I: RotationKernels,
        B: AutodiffBackend<InnerBackend = Rtp<I>>,
    {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = primitive(param.val().inner());
            if matches!(t.layout, Layout::Sharded(_)) {
                self.0.push(t.as_param());
            }
        }
    }
    let mut sharded = Sharded::<I>(Vec::new());
    module.visit(&mut sharded);
    ctx.register_params(sharded.0);
}

/// Runs the inner optimizer's `update`, which replaces every parameter: first the kept
/// gathers (of no further use) are dropped and the prefetch lets go of the parameters, so
/// that the update can write the new ones in place; then FSDP's prefetch registers them.
fn replace_params<M, B, I>(
    ctx: Option<&crate::backend::rank::RankCtx<I>>,
    module: M,
    update: impl FnOnce(M) -> M,
) -> M
where
    I: RotationKernels,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    M: AutodiffModule<B>,
{
    if let Some(ctx) = ctx {
        ctx.fallback.kept.lock().unwrap().clear();
        ctx.release_params();
    }
    let module = update(module);
    if let Some(ctx) = ctx {
        register_params::<M, B, I>(ctx, &module);
    }
    module
}

/// The rank context of a module's first float parameter (`None` for a module without one).
fn module_ctx<M, B, I>(module: &M) -> Option<std::sync::Arc<crate::backend::rank::RankCtx<I>>>
where
    I: RotationKernels,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    M: AutodiffModule<B>,
{
    struct First<I: RotationKernels>(Option<std::sync::Arc<crate::backend::rank::RankCtx<I>>>);
    impl<B, I> ModuleVisitor<B> for First<I>
    where
        I: RotationKernels,
        B: AutodiffBackend<InnerBackend = Rtp<I>>,
    {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.0.is_none() {
                self.0 = Some(primitive(param.val().inner()).ctx.clone());
            }
        }
    }
    let mut first = First::<I>(None);
    module.visit(&mut first);
    first.0
}

impl<M, B, I, O> Optimizer<M, B> for RtpOptimizer<O>
where
    I: RotationKernels,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    type Record = O::Record;

    fn step(&mut self, lr: LearningRate, module: M, mut grads: GradientsParams) -> M {
        let ctx = module_ctx::<M, B, I>(&module);
        // The ledger keeps the peaks of the compute and the update phases apart.
        let ledger = ctx.as_ref().map(|ctx| ctx.comm.ledger.clone());
        if let Some(l) = &ledger {
            l.end_phase(Phase::Compute);
        }
        sync_gradients::<M, B, I>(&module, &mut grads);
        if let Some(max) = self.clip_grad_norm {
            self.last_grad_norm = clip_grad_norm::<M, B, I>(&module, &mut grads, max);
            if self.last_grad_norm.is_some_and(|n| !n.norm.is_finite()) {
                return module;
            }
        }
        let inner = &mut self.inner;
        let module =
            replace_params::<M, B, I>(ctx.as_deref(), module, |m| inner.step(lr, m, grads));
        if let Some(l) = &ledger {
            l.end_phase(Phase::Update);
        }
        if let Some(ctx) = &ctx {
            ctx.linear.end_step();
        }
        module
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, mut grads: MultiGradientsParams) -> M {
        for (g, _) in grads.grads.iter_mut() {
            sync_gradients::<M, B, I>(&module, g);
        }
        assert!(
            self.clip_grad_norm.is_none(),
            "RtpOptimizer: global-norm clipping of multi-device gradients is not supported; use `step`"
        );
        let ctx = module_ctx::<M, B, I>(&module);
        let inner = &mut self.inner;
        replace_params::<M, B, I>(ctx.as_deref(), module, |m| inner.step_multi(lr, m, grads))
    }

    fn to_record(&self) -> Self::Record {
        self.inner.to_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self {
            inner: self.inner.load_record(record),
            ..self
        }
    }
}
