//! Every strategy on a cubecl backend (wgpu; on CPU machines, Mesa's lavapipe) trains like
//! single-device NdArray. Ranks are threads with their own GPU streams, so this also checks
//! that shards handed between ranks are synchronised.
//! Run with `cargo test -p burn-rtp-gpt --features wgpu --test wgpu`.
#![cfg(feature = "wgpu")]

mod common;

use burn::backend::Wgpu;
use burn_rtp::RotationMode;
use burn_rtp_gpt::{train, Strategy};
use common::*;

#[test]
fn every_strategy_on_wgpu_matches_single_device_ndarray() {
    let dir = temp_dir("wgpu");
    let init = initial_weights(&tiny(Strategy::Ddp, 1, 8), &dir);
    for (strategy, ranks, rotation) in [
        (Strategy::Ddp, 1, RotationMode::OutOfPlace),
        (Strategy::Rtp, 3, RotationMode::OutOfPlace),
        (Strategy::Rtp, 4, RotationMode::InPlace),
        (Strategy::Fsdp, 3, RotationMode::OutOfPlace),
        (Strategy::Ddp, 3, RotationMode::OutOfPlace),
    ] {
        let mut cfg = tiny(strategy, ranks, 8);
        cfg.rotation = rotation;
        cfg.init = Some(init.clone());
        let reference = reference_losses(&cfg, &init);
        let out = train::<Wgpu>(&cfg, |_| Default::default(), None).expect("training on wgpu runs");
        for (step, (got, want)) in out.report.losses.iter().zip(&reference).enumerate() {
            assert!(
                rel_close(*got, *want, 1e-4),
                "wgpu {strategy} on {ranks} ranks ({rotation}), step {step}: loss {got} vs NdArray single-device {want}"
            );
        }
    }
}
