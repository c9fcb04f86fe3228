//! Every strategy trains exactly like single-device Burn: same seed, 30 steps, losses equal to
//! an independent `Autodiff<NdArray>` run from the same initial weights to 1e-4 relative.

mod common;

use burn::backend::NdArray;
use burn_rtp::RotationMode;
use burn_rtp_gpt::{train, Strategy};
use common::*;

fn check(strategy: Strategy, ranks: usize, rotation: RotationMode) {
    check_model(strategy, ranks, rotation, false);
}

fn check_model(strategy: Strategy, ranks: usize, rotation: RotationMode, tied: bool) {
    let dir = temp_dir(&format!("strategy-{strategy}-{ranks}-{rotation}-{tied}"));
    let mut cfg = tiny(strategy, ranks, 30);
    cfg.rotation = rotation;
    cfg.model.tie_embeddings = tied;
    let init = initial_weights(&cfg, &dir);
    cfg.init = Some(init.clone());
    let reference = reference_losses(&cfg, &init);
    let out = train::<NdArray>(&cfg, |_| Default::default(), None).expect("training runs");
    assert_eq!(out.report.losses.len(), 30);
    for (step, (got, want)) in out.report.losses.iter().zip(&reference).enumerate() {
        assert!(
            rel_close(*got, *want, 1e-4),
            "{strategy} on {ranks} ranks ({rotation}, tied {tied}), step {step}: loss {got} vs single-device {want}"
        );
    }
    // And training went somewhere: the loss fell.
    assert!(reference[29] < reference[0] - 0.1, "{reference:?}");
}

#[test]
fn single_matches_plain_burn() {
    check(Strategy::Ddp, 1, RotationMode::OutOfPlace);
}

#[test]
fn ddp_matches_single() {
    check(Strategy::Ddp, 3, RotationMode::OutOfPlace);
}

#[test]
fn fsdp_matches_single() {
    check(Strategy::Fsdp, 3, RotationMode::OutOfPlace);
}

#[test]
fn rtp_matches_single() {
    check(Strategy::Rtp, 3, RotationMode::OutOfPlace);
}

#[test]
fn rtp_in_place_matches_single() {
    check(Strategy::Rtp, 4, RotationMode::InPlace);
}

#[test]
fn tied_embeddings_match_single_under_every_strategy() {
    // The token embedding is both rotated (as the embedding) and gathered (as the head):
    // its two gradient contributions must be summed and reach its shard once.
    check_model(Strategy::Ddp, 1, RotationMode::OutOfPlace, true);
    check_model(Strategy::Rtp, 3, RotationMode::OutOfPlace, true);
    check_model(Strategy::Rtp, 4, RotationMode::InPlace, true);
    check_model(Strategy::Fsdp, 3, RotationMode::OutOfPlace, true);
    check_model(Strategy::Ddp, 2, RotationMode::OutOfPlace, true);
}
