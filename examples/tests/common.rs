//! A tiny configuration and an independent single-device reference trainer.
#![allow(dead_code)]

use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use burn_rtp_examples::data::{Corpus, Windows};
use burn_rtp_examples::{GptConfig, StrategyName, TrainConfig};

pub type Plain = Autodiff<NdArray>;

pub fn tiny(strategy: StrategyName, ranks: usize, steps: usize) -> TrainConfig {
    let mut cfg = TrainConfig::new(strategy, ranks);
    cfg.steps = steps;
    cfg.batch = 12;
    cfg.model = GptConfig::new(8, 20, 1, 2);
    // The tiny model's layers are all below the default threshold: shard them anyway, so
    // that the tests exercise rotation.
    cfg.shard_threshold = Some(0);
    cfg.lr = 3e-3;
    cfg.eval_every = 0;
    cfg.eval_batches = 1;
    cfg
}

pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-rtp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Trains the same model on plain `Autodiff<NdArray>` with the trainer's data order.
pub fn reference_losses(cfg: &TrainConfig, init: &std::path::Path) -> Vec<f64> {
    let device = Default::default();
    let corpus = Corpus::load(None, cfg.model.seq).unwrap();
    let mut model =
        burn_rtp_examples::checkpoint::load_consolidated::<Plain>(init, &cfg.model, &device)
            .unwrap();
    let mut optim = AdamConfig::new().init::<Plain, burn_rtp_examples::Gpt<Plain>>();
    let mut losses = Vec::new();
    for step in 0..cfg.steps {
        let (x, y) = Windows::train(&corpus, cfg.seed, step, 0..cfg.batch, cfg.model.seq)
            .tensors::<Plain>(&device);
        let loss = model.loss(x, y);
        losses.push(loss.clone().into_scalar().elem::<f64>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(cfg.lr, model, grads);
    }
    let _ = model.valid();
    losses
}

/// Validation loss of a single-device model, as the trainer computes it.
pub fn reference_val_loss(cfg: &TrainConfig, model: &burn_rtp_examples::Gpt<NdArray>) -> f64 {
    let device = Default::default();
    let corpus = Corpus::load(None, cfg.model.seq).unwrap();
    let total = cfg.batch * cfg.eval_batches;
    let mut sum = 0.0;
    for b in 0..cfg.eval_batches {
        let rows = b * cfg.batch..(b + 1) * cfg.batch;
        let (x, y) = Windows::val(&corpus, rows, total, cfg.model.seq).tensors::<NdArray>(&device);
        sum += model.loss(x, y).into_scalar().elem::<f64>();
    }
    sum / cfg.eval_batches as f64
}

/// A fresh single-device model saved as a full record, to start every strategy from.
pub fn initial_weights(cfg: &TrainConfig, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("init.bin");
    let device = Default::default();
    let model = cfg.model.init::<NdArray>(&device);
    burn_rtp_examples::checkpoint::save_full(model, &path).unwrap();
    path
}

pub fn rel_close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * a.abs().max(b.abs()).max(1e-6)
}
