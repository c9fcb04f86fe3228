//! `relu` and `relu_backward` through the decorator: an MLP with ReLU trained under RTP (both
//! rotation modes), FSDP and DDP at N = 1, 2, 3, 4 and 8 equals single-device Burn with the
//! global batch split the way data parallelism rounds it (the mean of per-rank mean losses),
//! step by step, on dimensions that N does not divide (36 -> 100 -> 67).

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use burn_rtp::{launch, RotationMode, Rtp, RtpConfig, RtpOptimizer, Strategy};
use common::*;

type RefB = Autodiff<NdArray>;
type Dist = Autodiff<Rtp<NdArray>>;

/// The equivalence MLP with ReLU in place of GELU.
#[derive(Module, Debug)]
struct ReluMlp<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    act: Relu,
}

impl<B: Backend> ReluMlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            fc1: LinearConfig::new(D_MODEL, D_FF).init(device),
            fc2: LinearConfig::new(D_FF, VOCAB).init(device),
            act: Relu::new(),
        }
    }

    /// The mean cross-entropy over rows `r` of step `step`'s global batch.
    fn loss(&self, step: usize, r: std::ops::Range<usize>, d: &B::Device) -> Tensor<B, 1> {
        let (x, y) = mlp_batch::<B>(step, r, d);
        let logits = self.fc2.forward(self.act.forward(self.fc1.forward(x)));
        CrossEntropyLossConfig::new().init(d).forward(logits, y)
    }
}

/// Single-device training whose loss is the mean of the mean losses of `blocks` row blocks.
fn reference(weights: &[u8], blocks: usize) -> RankRun {
    let device = Default::default();
    let mut model = load_bytes(ReluMlp::<RefB>::new(&device), weights, &device);
    let mut optim = adam().init();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let sum = (0..blocks)
            .map(|b| model.loss(step, rows(b, blocks), &device))
            .reduce(|a, b| a + b)
            .expect("at least one block");
        let loss = if blocks == 1 {
            sum
        } else {
            sum / blocks as f32
        };
        losses.push(loss.clone().into_scalar().elem::<f32>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(LR, model, grads);
    }
    (losses, param_values(&model))
}

fn distributed(config: RtpConfig, weights: &[u8]) -> Vec<RankRun> {
    let world = config.world_size;
    launch(config, |device| {
        let mut model = load_bytes(ReluMlp::<Dist>::new(&device), weights, &device);
        let mut optim = RtpOptimizer::new(adam().init());
        let rows = rows(device.rank(), world);
        let mut losses = Vec::new();
        for step in 0..STEPS {
            let loss = model.loss(step, rows.clone(), &device);
            losses.push(loss.clone().into_scalar().elem::<f32>());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(LR, model, grads);
        }
        (losses, param_values(&model))
    })
    .expect("every rank trains")
}

#[test]
fn relu_mlp_matches_single_device_burn_under_every_strategy() {
    let weights = to_bytes(seeded(ReluMlp::<RefB>::new(&Default::default()), SEED));
    for n in [1, 2, 3, 4, 8] {
        let (ref_losses, ref_params) = reference(&weights, n);
        let configs = [
            ("rtp out-of-place", Strategy::Rtp, RotationMode::OutOfPlace),
            ("rtp in-place", Strategy::Rtp, RotationMode::InPlace),
            ("fsdp", Strategy::Fsdp, RotationMode::OutOfPlace),
            ("ddp", Strategy::Ddp, RotationMode::OutOfPlace),
        ];
        for (label, strategy, rotation) in configs {
            let config = RtpConfig::new(n)
                .with_strategy(strategy)
                .with_rotation(rotation);
            let runs = distributed(config, &weights);
            let label = format!("ReLU MLP, {label}, N={n}");
            if let Err(e) = compare(Which::Mlp, &ref_losses, &ref_params, &runs, &label) {
                panic!("{e}");
            }
        }
    }
}
