//! `gpt plan`: the memory planner of burn-rtp applied to the GPT, probed with the trainer's
//! own model, data and optimizer, without activation checkpointing and with it.

use crate::data::{Corpus, DataError, Windows};
use crate::model::{Gpt, GptConfig};
use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn_rtp::RotationKernels;
use burn_rtp::{PlanConfig, Planner, Rtp, RtpDevice, RtpOptimizer};

type Ad<I, C> = burn::backend::Autodiff<Rtp<I>, C>;

/// Probes the GPT of `model` for the planner: on one in-process rank, two Adam steps (through
/// [`RtpOptimizer`], which marks the phases the planner tells apart) at each probe batch, on
/// `Autodiff<Rtp<I>>` and again on `Autodiff<Rtp<I>, BalancedCheckpointing>`.
pub fn probe_gpt<I: RotationKernels>(
    model: &GptConfig,
    config: PlanConfig,
) -> Result<Planner, String> {
    model.validate()?;
    let corpus = Corpus::load(None, model.seq).map_err(|e: DataError| e.to_string())?;
    Planner::probe::<I, Ad<I, NoCheckpointing>, _, _>(config, |device, batch| {
        two_steps::<I, Ad<I, NoCheckpointing>>(model, &corpus, device, batch)
    })
    .map_err(|e| e.to_string())?
    .with_checkpointed_probe::<I, Ad<I, BalancedCheckpointing>, _, _>(|device, batch| {
        two_steps::<I, Ad<I, BalancedCheckpointing>>(model, &corpus, device, batch)
    })
    .map_err(|e| e.to_string())
}

/// The probe's work: the GPT built on `device` and trained two steps at `batch` sequences.
fn two_steps<I, B>(
    model: &GptConfig,
    corpus: &Corpus,
    device: &RtpDevice<I>,
    batch: usize,
) -> Gpt<B>
where
    I: RotationKernels,
    B: AutodiffBackend<Device = RtpDevice<I>, InnerBackend = Rtp<I>>,
{
    let mut gpt: Gpt<B> = model.init(device);
    // The trainer's optimizer (Burn's Adam, one pass per parameter), so the probe allocates
    // what a training step allocates.
    let mut optim = RtpOptimizer::<
        burn::optim::adaptor::OptimizerAdaptor<burn_rtp::FusedAdam, Gpt<B>, B>,
    >::adam(&AdamConfig::new());
    for step in 0..2 {
        let (x, y) = Windows::train(corpus, 42, step, 0..batch, model.seq).tensors::<B>(device);
        let loss = gpt.loss(x, y);
        let grads = GradientsParams::from_grads(loss.backward(), &gpt);
        gpt = optim.step(1e-3, gpt, grads);
    }
    gpt
}
