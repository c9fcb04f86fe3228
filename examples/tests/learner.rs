//! burn-train's Learner, one per rank with `RtpOptimizer`, trains exactly as the hand-written
//! loop does: the same global loss at every step, at N = 2 and 3.

mod common;

use burn::backend::NdArray;
use burn_rtp_examples::learner::{train_with_learner, LearnerConfig};
use burn_rtp_examples::{train, StrategyName};
use common::*;

fn learner_equals_loop(ranks: usize) {
    let steps = 20;
    let loop_cfg = tiny(StrategyName::Rtp, ranks, steps);
    let by_loop = train::<NdArray>(&loop_cfg, |_| Default::default(), None)
        .unwrap()
        .report
        .losses;
    let dir = temp_dir(&format!("learner-{ranks}"));
    let learner_cfg = LearnerConfig {
        model: loop_cfg.model.clone(),
        ranks,
        batch: loop_cfg.batch,
        epochs: 2,
        steps_per_epoch: steps / 2,
        val_batches: 1,
        lr: loop_cfg.lr,
        seed: loop_cfg.seed,
        shard_threshold: loop_cfg.shard_threshold,
        dir: dir.clone(),
        verbose: false,
    };
    let by_learner = train_with_learner(&learner_cfg).unwrap();
    assert_eq!(by_learner.train_losses.len(), steps, "{by_learner:?}");
    assert_eq!(by_learner.val_losses.len(), 2, "{by_learner:?}");
    for (step, (l, h)) in by_learner.train_losses.iter().zip(&by_loop).enumerate() {
        assert!(
            rel_close(*l, *h, 1e-5),
            "N={ranks} step {}: Learner {l} vs loop {h}",
            step + 1
        );
    }
    // It learned: the last losses are well below the first.
    assert!(by_learner.train_losses[steps - 1] < by_learner.train_losses[0] - 0.5);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_learner_equals_the_hand_written_loop_at_2_ranks() {
    learner_equals_loop(2);
}

#[test]
fn the_learner_equals_the_hand_written_loop_at_3_ranks() {
    learner_equals_loop(3);
}
