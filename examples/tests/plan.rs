//! `gpt plan`: the table and the recommendation for a budget that fits, a clear error and a
//! non-zero status for one that nothing fits, and a recommendation that training confirms.

mod common;

use burn::backend::NdArray;
use burn_rtp_gpt::{train, GptConfig, TrainConfig};
use common::*;
use std::process::Command;

#[test]
fn plan_prints_the_table_and_a_recommendation() {
    let gpt = gpt_binary();
    let out = Command::new(&gpt)
        .args(["plan", "--memory-budget", "64MiB"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in [1, 2, 4, 8, 16] {
        for s in ["ddp", "fsdp", "rtp (out-of-place)", "rtp (in-place)"] {
            assert!(
                stdout.lines().any(|l| {
                    let cols: Vec<&str> = l
                        .split("  ")
                        .map(str::trim)
                        .filter(|c| !c.is_empty())
                        .collect();
                    cols.first() == Some(&n.to_string().as_str()) && cols.get(1) == Some(&s)
                }),
                "no row for {s} at N={n}:\n{stdout}"
            );
        }
    }
    assert_eq!(stdout.matches("<- recommended").count(), 1, "{stdout}");
    assert!(stdout.contains("recommended: "), "{stdout}");

    let out = Command::new(&gpt)
        .args(["plan", "--memory-budget", "1MiB", "--d-model", "128"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("nothing fits in 1.00 MiB per rank up to 16 ranks")
            && stderr.contains("over the budget"),
        "{stderr}"
    );

    let out = Command::new(&gpt)
        .args(["plan", "--memory-budget", "lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--memory-budget"));
}

/// The recommendation holds: training the recommended strategy at the recommended N (with
/// activation checkpointing if it chose it) stays within the budget on the ledger; the
/// smaller worlds fit under neither setting, and checkpointing is chosen only where nothing
/// fits without it.
#[test]
fn the_recommendation_fits_when_trained() {
    use burn_rtp::ActivationCheckpointing::{Balanced, None as Plain};
    let model = GptConfig::new(16, 64, 2, 4);
    let per_rank = 4;
    let config = burn_rtp::PlanConfig::default()
        .with_shard_threshold(0)
        .with_batch(per_rank);
    let planner = burn_rtp_gpt::plan::probe_gpt::<NdArray>(&model, config).unwrap();
    assert!(planner.plans_checkpointing());
    let best = |ac, n: usize| {
        burn_rtp::plan::PLANNED
            .iter()
            .map(|&(s, r)| planner.predict_with(ac, s, r, n, per_rank).total)
            .min()
            .unwrap()
    };
    // Checkpointing saves memory on this model, at every world. Every Linear of the GPT
    // reads a recomputed input under it, so RTP's backward runs two passes per layer and
    // holds two bundles at a time instead of four.
    let rtp = |ac, n| {
        planner.predict_with(
            ac,
            burn_rtp::Strategy::Rtp,
            burn_rtp::RotationMode::OutOfPlace,
            n,
            per_rank,
        )
    };
    for n in [1, 2, 3, 4] {
        assert!(best(Balanced, n) < best(Plain, n), "N = {n}");
    }
    for n in [3, 4] {
        assert_eq!(
            2 * rtp(Balanced, n).in_flight,
            rtp(Plain, n).in_flight,
            "N = {n}"
        );
    }
    // A budget between the best plain plans at N = 2 and at N = 3: without checkpointing
    // N = 3 fits first; with it, as the planner sees it.
    let budget = (best(Plain, 2) + best(Plain, 3)) / 2;
    let pick = planner.recommend(budget, per_rank, 8).unwrap();
    let fits_at = |n: usize| best(Plain, n).min(best(Balanced, n)) <= budget;
    let smallest = (1..=8).find(|&n| fits_at(n)).unwrap();
    assert_eq!(pick.world, smallest, "{pick:?}");
    assert!(pick.total <= budget);
    let plain_fits = best(Plain, pick.world) <= budget;
    assert_eq!(
        pick.activation_checkpointing,
        if plain_fits { Plain } else { Balanced },
        "{pick:?}"
    );
    let mut cfg = TrainConfig::new(pick.strategy, pick.world);
    cfg.model = model;
    cfg.batch = per_rank * pick.world;
    cfg.steps = 2;
    cfg.shard_threshold = Some(0);
    cfg.rotation = pick.rotation;
    cfg.activation_checkpointing = pick.activation_checkpointing;
    cfg.eval_every = 0;
    cfg.eval_batches = 1;
    let out = train::<NdArray>(&cfg, |_| Default::default(), None).unwrap();
    let peak = out.report.peak_bytes_per_rank[0].total;
    assert!(
        peak <= budget,
        "{} at N = {} peaked at {peak} B on rank 0, over the {budget} B budget it was chosen for",
        pick.label(),
        pick.world
    );
}
