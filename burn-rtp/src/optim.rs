//! The one extra line for models whose parameters are also used outside module ops
//! (LayerNorm gains, say): wrap the optimizer so that such gradients are averaged over ranks.

use crate::backend::Rtp;
use crate::collectives::{all_reduce_ring, reduce_scatter_columns};
use crate::tensor::{Layout, RtpTensor};
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Scalar, Tensor, TensorPrimitive};

/// Wraps any Burn optimizer for RTP: `RtpOptimizer::new(AdamConfig::new().init())`.
///
/// Gradients that come out of rotated module ops are already averaged and sharded. Gradients
/// of parameters used elsewhere (replicated parameters, or sharded ones that an op gathered)
/// are per-rank; this wrapper averages them over ranks, shards them like their parameter,
/// and then delegates. Forgetting it is reported as an error at the first update.
#[derive(Clone)]
pub struct RtpOptimizer<O> {
    inner: O,
}

impl<O> RtpOptimizer<O> {
    /// Wraps `inner`.
    pub fn new(inner: O) -> Self {
        Self { inner }
    }

    /// The wrapped optimizer.
    pub fn inner(&self) -> &O {
        &self.inner
    }
}

struct GradientSync<'a, I: Backend> {
    grads: &'a mut GradientsParams,
    _inner: std::marker::PhantomData<I>,
}

fn primitive<I: Backend, const D: usize>(t: Tensor<Rtp<I>, D>) -> RtpTensor<I> {
    match t.into_primitive() {
        TensorPrimitive::Float(t) => t,
        TensorPrimitive::QFloat(_) => panic!("RtpOptimizer: quantized gradients are not supported"),
    }
}

/// Averages a per-rank gradient over ranks and gives it its parameter's layout.
fn sync_gradient<I: Backend>(param: &Layout, grad: RtpTensor<I>) -> RtpTensor<I> {
    if matches!(grad.layout, Layout::Sharded(_) | Layout::Replicated) {
        return grad;
    }
    let ctx = grad.ctx.clone();
    let mean = |t| I::float_mul_scalar(t, Scalar::Float(1.0 / ctx.world_size as f64));
    match param {
        // Each rank needs only its shard of the sum: a reduce-scatter, half an all-reduce.
        Layout::Sharded(spec) => {
            let op = "optimizer.reduce_scatter_gradient";
            let own = reduce_scatter_columns(&ctx, op, spec, grad.inner.clone());
            RtpTensor::new(ctx.clone(), mean(own), Layout::Sharded(spec.clone()))
        }
        _ => {
            let op = "optimizer.average_gradient";
            let summed = all_reduce_ring(&ctx, op, grad.inner.clone());
            RtpTensor::new(ctx.clone(), mean(summed), Layout::Replicated)
        }
    }
}

impl<B, I> ModuleVisitor<B> for GradientSync<'_, I>
where
    I: Backend,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<Rtp<I>, D>(param.id) else {
            return;
        };
        let layout = primitive(param.val().inner()).layout.clone();
        let synced = sync_gradient(&layout, primitive(grad));
        self.grads.register::<Rtp<I>, D>(
            param.id,
            Tensor::from_primitive(TensorPrimitive::Float(synced)),
        );
    }
}

/// Averages the per-rank gradients in `grads` over ranks, in the module's parameter order.
pub fn sync_gradients<M, B, I>(module: &M, grads: &mut GradientsParams)
where
    I: Backend,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    M: AutodiffModule<B>,
{
    let mut visitor = GradientSync::<I> {
        grads,
        _inner: std::marker::PhantomData,
    };
    module.visit(&mut visitor);
}

impl<M, B, I, O> Optimizer<M, B> for RtpOptimizer<O>
where
    I: Backend,
    B: AutodiffBackend<InnerBackend = Rtp<I>>,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    type Record = O::Record;

    fn step(&mut self, lr: LearningRate, module: M, mut grads: GradientsParams) -> M {
        sync_gradients::<M, B, I>(&module, &mut grads);
        self.inner.step(lr, module, grads)
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, mut grads: MultiGradientsParams) -> M {
        for (g, _) in grads.grads.iter_mut() {
            sync_gradients::<M, B, I>(&module, g);
        }
        self.inner.step_multi(lr, module, grads)
    }

    fn to_record(&self) -> Self::Record {
        self.inner.to_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self {
            inner: self.inner.load_record(record),
        }
    }
}
