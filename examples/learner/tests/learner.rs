//! burn-train's Learner, one per rank with `RtpOptimizer`, trains exactly as the hand-written
//! loop does: the same global loss at every step, at N = 2 and 3, on NdArray and on Flex.

#[path = "../../tests/common.rs"]
mod common;

use burn::backend::{Flex, NdArray};
use burn_rtp::checkpoint::{step_dir, Checkpoint};
use burn_rtp_gpt::{train, Strategy};
use burn_rtp_learner::{
    checkpoint_root, train_with_learner, InnerBackend, LearnerConfig, LearnerError,
};
use common::*;

fn learner_equals_loop(ranks: usize, backend: InnerBackend) {
    let steps = 20;
    let loop_cfg = tiny(Strategy::Rtp, ranks, steps);
    let by_loop = match backend {
        InnerBackend::Ndarray => train::<NdArray>(&loop_cfg, |_| Default::default(), None),
        InnerBackend::Flex => train::<Flex>(&loop_cfg, |_| Default::default(), None),
    }
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
        dir: dir.to_path_buf(),
        checkpoints: false,
        resume_epoch: None,
        verbose: false,
        backend,
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
}

#[test]
fn the_learner_equals_the_hand_written_loop_at_2_ranks() {
    learner_equals_loop(2, InnerBackend::Ndarray);
}

#[test]
fn the_learner_equals_the_hand_written_loop_on_flex() {
    learner_equals_loop(2, InnerBackend::Flex);
}

#[test]
fn the_learner_equals_the_hand_written_loop_at_3_ranks() {
    learner_equals_loop(3, InnerBackend::Ndarray);
}

/// The Learner's own checkpoints are sharded burn-rtp checkpoints, and resuming through the
/// Learner continues bit for bit: epochs 2 and 3 after resuming from epoch 1 give exactly the
/// losses of the uninterrupted run.
#[test]
fn the_learner_checkpoints_shards_and_resumes_bit_exactly() {
    let ranks = 3;
    let spe = 4;
    let loop_cfg = tiny(Strategy::Rtp, ranks, 3 * spe);
    let dir = temp_dir("learner-resume");
    let cfg = LearnerConfig {
        model: loop_cfg.model.clone(),
        ranks,
        batch: loop_cfg.batch,
        epochs: 3,
        steps_per_epoch: spe,
        val_batches: 1,
        lr: loop_cfg.lr,
        seed: loop_cfg.seed,
        shard_threshold: loop_cfg.shard_threshold,
        dir: dir.to_path_buf(),
        checkpoints: true,
        resume_epoch: None,
        verbose: false,
        backend: InnerBackend::Ndarray,
    };
    let straight = train_with_learner(&cfg).unwrap();
    assert_eq!(straight.train_losses.len(), 3 * spe);
    let root = checkpoint_root(&dir);
    // Newest two kept (steps 8 and 12), the oldest pruned; `latest` names step 12.
    let kept: Vec<bool> = [1, 2, 3]
        .map(|e| step_dir(&root, (e * spe) as u64).exists())
        .to_vec();
    assert_eq!(
        kept,
        [false, true, true],
        "kept checkpoints of epochs 1..=3"
    );
    let latest = Checkpoint::open(&root).unwrap();
    let manifest = latest.manifest();
    assert_eq!((manifest.step, manifest.world_size), (12, ranks));
    assert_eq!(
        manifest.extra_files.len(),
        ranks,
        "one scheduler record per rank"
    );
    // Each rank wrote shards: the shard maps name sharded shapes, and every rank's model file
    // is far smaller than the consolidated model.
    assert!(manifest.shard_maps.iter().all(|m| !m.sharded.is_empty()));
    let (whole, _) = latest.consolidated_records().unwrap();
    for f in manifest
        .files
        .iter()
        .filter(|f| f.name.ends_with(".model.mpk"))
    {
        assert!(
            f.bytes * 2 < whole.len() as u64,
            "{} has {} bytes, the whole model {}",
            f.name,
            f.bytes,
            whole.len()
        );
    }

    // Resume from epoch 2 (the oldest kept) in a fresh run.
    let resumed = train_with_learner(&LearnerConfig {
        resume_epoch: Some(2),
        ..cfg.clone()
    })
    .unwrap();
    assert_eq!(resumed.train_losses.len(), spe, "{resumed:?}");
    let expected = &straight.train_losses[2 * spe..];
    assert_eq!(
        resumed
            .train_losses
            .iter()
            .map(|l| l.to_bits())
            .collect::<Vec<_>>(),
        expected.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        "resumed {:?} vs straight {expected:?}",
        resumed.train_losses
    );

    // A pruned epoch is refused before any rank starts.
    let err = train_with_learner(&LearnerConfig {
        resume_epoch: Some(1),
        ..cfg
    })
    .unwrap_err();
    assert!(
        matches!(err, LearnerError::Resume { epoch: 1, .. }),
        "{err}"
    );
}
