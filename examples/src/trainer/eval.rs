//! What a rank measures and shows of its model: the validation loss and a text sample.

use super::TrainConfig;
use crate::data::{Corpus, Windows};
use crate::model::Gpt;
use burn::tensor::activation::softmax;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
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

/// Generates `n` bytes after `prompt`, sampling at temperature 0.8 with a seeded generator.
pub(super) fn sample<I: RotationKernels>(
    model: &Gpt<Rtp<I>>,
    device: &RtpDevice<I>,
    prompt: &str,
    n: usize,
    seq: usize,
    seed: u64,
) -> String {
    let mut bytes: Vec<u8> = prompt.bytes().collect();
    let mut state = seed | 1;
    for _ in 0..n {
        let start = bytes.len().saturating_sub(seq);
        let window: Vec<i64> = bytes[start..].iter().map(|&b| i64::from(b)).collect();
        let len = window.len();
        let tokens = Tensor::<Rtp<I>, 2, Int>::from_data(TensorData::new(window, [1, len]), device);
        let logits = model.logits(tokens);
        let vocab = logits.dims()[2];
        let last = logits.slice([0..1, len - 1..len]).reshape([vocab]);
        let probs = softmax(last / 0.8, 0)
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap();
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut u = (state >> 11) as f32 / (1u64 << 53) as f32;
        let mut choice = vocab - 1;
        for (i, p) in probs.iter().enumerate() {
            if u < *p {
                choice = i;
                break;
            }
            u -= p;
        }
        bytes.push(choice as u8);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}
