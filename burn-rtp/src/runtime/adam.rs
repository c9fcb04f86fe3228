//! Adam that updates each parameter (shard) in one pass: [`FusedAdam`], built by
//! [`RtpOptimizer::adam`].
//!
//! Burn's `Adam` runs about a dozen whole-tensor ops per parameter; on config A they and the
//! copies they cause were about 5% of a single rank's step. This optimizer keeps Burn's
//! state and arithmetic, and hands each parameter's update to the inner backend's
//! [`RotationKernels::fused_adam`], which runs it in one pass where it has a kernel
//! (NdArray) and otherwise hands it back for Burn's `Adam`. Its state is Burn's `AdamState`,
//! so its records are Burn's Adam's: a checkpoint written by one loads into the other.

use crate::backend::rtp::Rtp;
use crate::backend::tensor::RtpTensor;
use crate::runtime::optim::{primitive, RtpOptimizer};
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::optim::{
    Adam, AdamConfig, AdamState, AdaptiveMomentumState, LearningRate, SimpleOptimizer,
};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_rtp_kernels::{AdamStep, RotationKernels};

/// Burn's Adam, each parameter's step in one pass where the inner backend has a kernel for it
/// (see the module docs). Made by [`RtpOptimizer::adam`].
#[derive(Clone)]
pub struct FusedAdam {
    /// Burn's Adam of the same configuration: for AMSGrad, for backends without the kernel,
    /// and where the world turned the fused optimizer off.
    burn: Adam,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: Option<f32>,
    amsgrad: bool,
}

/// The fields of an `AdamConfig` (private in burn-optim; read through its serialisation).
#[derive(serde::Deserialize)]
struct AdamFields {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    amsgrad: bool,
    weight_decay: Option<WeightDecayFields>,
    grad_clipping: Option<GradientClippingConfig>,
}

#[derive(serde::Deserialize)]
struct WeightDecayFields {
    penalty: f32,
}

impl std::fmt::Debug for FusedAdam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusedAdam")
            .field("beta_1", &self.beta_1)
            .field("beta_2", &self.beta_2)
            .field("epsilon", &self.epsilon)
            .field("weight_decay", &self.weight_decay)
            .field("amsgrad", &self.amsgrad)
            .finish()
    }
}

fn fields(config: &AdamConfig) -> AdamFields {
    let value = serde_json::to_value(config).expect("an AdamConfig serialises");
    serde_json::from_value(value).expect("an AdamConfig has burn-optim 0.21's fields")
}

impl FusedAdam {
    /// Adam as `config` describes it (betas, epsilon, AMSGrad, weight decay).
    pub fn new(config: &AdamConfig) -> Self {
        let f = fields(config);
        Self {
            burn: config.build(),
            beta_1: f.beta_1,
            beta_2: f.beta_2,
            epsilon: f.epsilon,
            weight_decay: f.weight_decay.map(|w| w.penalty),
            amsgrad: f.amsgrad,
        }
    }
}

impl<M, B> RtpOptimizer<OptimizerAdaptor<FusedAdam, M, B>>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    FusedAdam: SimpleOptimizer<B::InnerBackend>,
{
    /// Burn's Adam as `config` describes it, each parameter's update in one pass
    /// ([`FusedAdam`]), wrapped like [`RtpOptimizer::new`] wraps any optimizer; the gradient
    /// clipping of `config` applies as in `AdamConfig::init`. Turn the one-pass step off with
    /// `RtpConfig::with_fused_optimizer(false)`.
    pub fn adam(config: &AdamConfig) -> Self {
        let mut optim = OptimizerAdaptor::from(FusedAdam::new(config));
        if let Some(clipping) = fields(config).grad_clipping {
            optim = optim.with_grad_clipping(clipping.init());
        }
        RtpOptimizer::new(optim)
    }
}

impl<I: RotationKernels> SimpleOptimizer<Rtp<I>> for FusedAdam {
    type State<const D: usize> = AdamState<Rtp<I>, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<Rtp<I>, D>,
        grad: Tensor<Rtp<I>, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<Rtp<I>, D>, Option<Self::State<D>>) {
        let param = primitive(tensor);
        if self.amsgrad || !param.ctx.comm.config.fused_optimizer {
            return self.burn.step(lr, wrap(param), grad, state);
        }
        let time = state.as_ref().map_or(0, |s| s.momentum.time) + 1;
        let step = AdamStep {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            lr: lr as f32,
            time: time as i32,
        };
        let grad = primitive(grad);
        let moments = state.map(|s| {
            (
                primitive(s.momentum.moment_1),
                primitive(s.momentum.moment_2),
            )
        });
        // One layout for all four (a parameter's gradient and moments have its layout; the
        // optimizer wrapper gave the gradient that layout): else Burn's Adam decides.
        let layout = param.layout.clone();
        let same = grad.layout == layout
            && moments
                .as_ref()
                .is_none_or(|(m1, m2)| m1.layout == layout && m2.layout == layout);
        if !same {
            return self
                .burn
                .step(lr, wrap(param), wrap(grad), rewrap(moments, time - 1));
        }
        let (p, p_rest) = param.take();
        let (g, g_rest) = grad.take();
        let (m, m_rests) = match moments {
            Some((m1, m2)) => {
                let ((a, a_rest), (b, b_rest)) = (m1.take(), m2.take());
                (Some((a, b)), Some((a_rest, b_rest)))
            }
            None => (None, None),
        };
        match I::fused_adam(p, g, m, &step) {
            Ok([p, m1, m2]) => {
                let param = p_rest.derive(p, layout.clone());
                let (m1, m2) = match m_rests {
                    Some((a, b)) => (a.derive(m1, layout.clone()), b.derive(m2, layout)),
                    None => {
                        let ctx = param.ctx.clone();
                        drop(g_rest);
                        (
                            RtpTensor::new(ctx.clone(), m1, layout.clone()),
                            RtpTensor::new(ctx, m2, layout),
                        )
                    }
                };
                let state = AdaptiveMomentumState::new(time, wrap(m1), wrap(m2));
                (wrap(param), Some(AdamState::new(state)))
            }
            Err((p, g, m)) => {
                let param = wrap(p_rest.derive(p, layout.clone()));
                let grad = wrap(g_rest.derive(g, layout.clone()));
                let moments = m.zip(m_rests).map(|((a, b), (a_rest, b_rest))| {
                    (
                        a_rest.derive(a, layout.clone()),
                        b_rest.derive(b, layout.clone()),
                    )
                });
                self.burn.step(lr, param, grad, rewrap(moments, time - 1))
            }
        }
    }

    fn to_device<const D: usize>(
        mut state: Self::State<D>,
        device: &burn::tensor::Device<Rtp<I>>,
    ) -> Self::State<D> {
        state.momentum = state.momentum.to_device(device);
        state
    }
}

fn wrap<I: RotationKernels, const D: usize>(t: RtpTensor<I>) -> Tensor<Rtp<I>, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Burn's state again, for Burn's Adam: the moments and the step count they are at.
fn rewrap<I: RotationKernels, const D: usize>(
    moments: Option<(RtpTensor<I>, RtpTensor<I>)>,
    time: usize,
) -> Option<AdamState<Rtp<I>, D>> {
    moments.map(|(m1, m2)| AdamState::new(AdaptiveMomentumState::new(time, wrap(m1), wrap(m2))))
}
