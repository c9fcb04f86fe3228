//! RTP on `Autodiff<Rtp<Flex>>` (Burn 0.21's pure-Rust CPU backend) equals single-device
//! `Autodiff<Flex>` training step by step, to the equivalence suite's tolerance, at N = 1, 2,
//! 3, 4 and 8 and in both rotation modes, for the MLP and the language model (d_model 36,
//! d_ff 100, vocab 67: dimensions that N does not divide). DDP and FSDP match it too, and
//! the three strategies agree with each other. Run with `--features flex`.
#![cfg(feature = "flex")]

mod common;

use burn::backend::{Autodiff, Flex};
use burn_rtp::{RotationMode, Routing, RtpConfig, Strategy};
use common::*;

type Reference = Autodiff<Flex>;

/// Trains `which` under `config` on `Rtp<Flex>` and compares every rank with single-device
/// `Autodiff<Flex>`; returns the ranks' runs.
fn matches_single_flex(which: Which, config: RtpConfig) -> Vec<RankRun> {
    let label = format!(
        "Flex {which:?} N={} {} {}",
        config.world_size, config.strategy, config.rotation
    );
    let (weights, (ref_losses, ref_params)) = match which {
        Which::Mlp => {
            let w = mlp_weights(SEED);
            let r = reference_mlp_on::<Reference>(&w, 1);
            (w, r)
        }
        Which::Lm => {
            let w = lm_weights(SEED);
            let r = reference_lm_on::<Reference>(&w);
            (w, r)
        }
    };
    let runs = rtp_run_on::<Flex>(which, config, &weights).expect("RTP run on Flex");
    if let Err(e) = compare(which, &ref_losses, &ref_params, &runs, &label) {
        panic!("{e}");
    }
    runs
}

macro_rules! cases {
    ($($name:ident: $which:expr, $n:expr, $mode:expr;)*) => {
        $(#[test]
        fn $name() {
            // The weights rotating in each mode (`Auto`, the default, routes the MLP).
            let config = RtpConfig::new($n)
                .with_shard_threshold(0)
                .with_rotation($mode)
                .with_routing(Routing::Weights);
            matches_single_flex($which, config);
        })*
    };
}

cases! {
    mlp_n1_out_of_place: Which::Mlp, 1, RotationMode::OutOfPlace;
    mlp_n2_out_of_place: Which::Mlp, 2, RotationMode::OutOfPlace;
    mlp_n3_out_of_place: Which::Mlp, 3, RotationMode::OutOfPlace;
    mlp_n4_out_of_place: Which::Mlp, 4, RotationMode::OutOfPlace;
    mlp_n8_out_of_place: Which::Mlp, 8, RotationMode::OutOfPlace;
    mlp_n3_in_place: Which::Mlp, 3, RotationMode::InPlace;
    lm_n1_out_of_place: Which::Lm, 1, RotationMode::OutOfPlace;
    lm_n2_out_of_place: Which::Lm, 2, RotationMode::OutOfPlace;
    lm_n3_out_of_place: Which::Lm, 3, RotationMode::OutOfPlace;
    lm_n4_out_of_place: Which::Lm, 4, RotationMode::OutOfPlace;
    lm_n8_out_of_place: Which::Lm, 8, RotationMode::OutOfPlace;
    lm_n2_in_place: Which::Lm, 2, RotationMode::InPlace;
    lm_n4_in_place: Which::Lm, 4, RotationMode::InPlace;
}

/// RTP as configured by default (`Routing::Auto`) on Flex matches single-device Flex too.
#[test]
fn auto_matches_single_device() {
    for n in [3, 4] {
        for which in [Which::Mlp, Which::Lm] {
            matches_single_flex(which, RtpConfig::new(n).with_shard_threshold(0));
        }
    }
}

/// DDP and FSDP on Flex match single-device Flex, and the three strategies agree with each
/// other within the same tolerance (they sum the same products in different orders).
#[test]
fn strategies_match_single_device_and_each_other() {
    for n in [3, 4] {
        let runs: Vec<Vec<RankRun>> = [Strategy::Rtp, Strategy::Fsdp, Strategy::Ddp]
            .into_iter()
            .map(|s| {
                let config = RtpConfig::new(n).with_shard_threshold(0).with_strategy(s);
                matches_single_flex(Which::Lm, config)
            })
            .collect();
        // RTP's mean loss over ranks and its (gathered, so equal on every rank) parameters.
        let rtp = &runs[0];
        let losses: Vec<f32> = (0..STEPS)
            .map(|s| rtp.iter().map(|(l, _)| l[s]).sum::<f32>() / n as f32)
            .collect();
        let params = &rtp[0].1;
        for (i, other) in runs.iter().enumerate().skip(1) {
            let label = format!("Flex strategy {i} against RTP at N={n}");
            if let Err(e) = compare(Which::Lm, &losses, params, other, &label) {
                panic!("{e}");
            }
        }
    }
}

/// The inner backend really is Flex: a rank's tensors are Flex tensors, and the backend's name
/// says so.
#[test]
fn ranks_run_on_flex() {
    use burn::tensor::backend::Backend;
    let names = burn_rtp::launch(RtpConfig::new(2), |device| {
        burn_rtp::Rtp::<Flex>::name(&device)
    })
    .expect("launch");
    assert!(names.iter().all(|n| n == "rtp<flex>"), "{names:?}");
}
