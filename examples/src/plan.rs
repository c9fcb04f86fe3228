//! `gpt plan`: the memory planner of burn-rtp applied to the GPT, probed with the trainer's
//! own model, data and optimizer.

use crate::data::{Corpus, DataError, Windows};
use crate::model::{Gpt, GptConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn_rtp::RotationKernels;
use burn_rtp::{PlanConfig, Planner, Rtp, RtpDevice, RtpOptimizer};

type Ad<I> = burn::backend::Autodiff<Rtp<I>>;

/// Probes the GPT of `model` for the planner: on one in-process rank, two Adam steps (through
/// [`RtpOptimizer`], which marks the phases the planner tells apart) at each probe batch.
pub fn probe_gpt<I: RotationKernels>(
    model: &GptConfig,
    config: PlanConfig,
) -> Result<Planner, String> {
    model.validate()?;
    let corpus = Corpus::load(None, model.seq).map_err(|e: DataError| e.to_string())?;
    Planner::probe::<I, Ad<I>, _, _>(config, |device: &RtpDevice<I>, batch| {
        let mut gpt: Gpt<Ad<I>> = model.init(device);
        let mut optim = RtpOptimizer::new(AdamConfig::new().init::<Ad<I>, Gpt<Ad<I>>>());
        for step in 0..2 {
            let (x, y) =
                Windows::train(&corpus, 42, step, 0..batch, model.seq).tensors::<Ad<I>>(device);
            let loss = gpt.loss(x, y);
            let grads = GradientsParams::from_grads(loss.backward(), &gpt);
            gpt = optim.step(1e-3, gpt, grads);
        }
        gpt
    })
    .map_err(|e| e.to_string())
}
