//! What a rank measures and shows of its model: the validation loss and a text sample.

use super::TrainConfig;
use crate::data::{Corpus, Windows};
use crate::generate::{generate, Sampler};
use crate::model::Gpt;
use burn::tensor::ElementConversion;
use burn_rtp::RotationKernels;
use burn_rtp::{Rtp, RtpDevice};

/// Mean validation loss over `eval_batches` batches, split across ranks.
pub(super) fn evaluate<I: RotationKernels>(
    model: &Gpt<Rtp<I>>,
    corpus: &Corpus,
    cfg: &TrainConfig,
    device: &RtpDevice<I>,
) -> f32 {
    let world = device.world_size();
    let per = cfg.batch / world;
    let total = cfg.batch * cfg.eval_batches;
    let mut sum = 0.0;
    for b in 0..cfg.eval_batches {
        let first = b * cfg.batch + device.rank() * per;
        let (x, y) = Windows::val(corpus, first..first + per, total, cfg.model.seq)
            .tensors::<Rtp<I>>(device);
        sum += model.loss(x, y).into_scalar().elem::<f32>();
    }
    device.all_reduce_mean(sum / cfg.eval_batches as f32)
}

/// Generates `n` bytes after `prompt` through a KV cache (`crate::generate`), sampling at
/// temperature 0.8 with a seeded generator.
pub(super) fn sample<I: RotationKernels>(
    model: &Gpt<Rtp<I>>,
    device: &RtpDevice<I>,
    prompt: &str,
    n: usize,
    seq: usize,
    seed: u64,
) -> String {
    let mut sampler = Sampler::new(seed, 0.8);
    let bytes = generate(model, device, prompt.as_bytes(), n, seq, &mut sampler);
    String::from_utf8_lossy(&bytes).into_owned()
}
