//! Races under load: training must give the same bits however the ranks are scheduled.
//!
//! Every run injects seeded delays and yields into every send, receive and hand-over of the
//! in-process transport ([`Chaos`]), while busy threads compete for the cores and several
//! worlds train at once. Each run is compared with single-device training (tolerance, as in
//! the equivalence suite) and bit for bit with an unperturbed run of the same configuration:
//! in-process training is deterministic, so any difference is a race.
//!
//! `RTP_STRESS_REPS` sets the runs per configuration (default 3, sized for CI); the test
//! prints how many runs it made and how many differed.

mod common;

use burn_rtp::{Chaos, RotationMode, Routing, RtpConfig, Strategy};
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Worlds training at once, besides the busy threads.
const PARALLEL_WORLDS: usize = 3;

/// The configurations under test: every N, both rotation modes with the weights rotating,
/// the default (`Routing::Auto`, which routes the MLP), and both baselines.
fn configs() -> Vec<RtpConfig> {
    let mut out = Vec::new();
    for n in [2, 3, 4, 8] {
        for mode in [RotationMode::OutOfPlace, RotationMode::InPlace] {
            out.push(
                RtpConfig::new(n)
                    .with_shard_threshold(0)
                    .with_rotation(mode)
                    .with_routing(Routing::Weights),
            );
        }
        out.push(RtpConfig::new(n).with_shard_threshold(0));
        out.push(
            RtpConfig::new(n)
                .with_shard_threshold(0)
                .with_strategy(Strategy::Fsdp),
        );
        out.push(
            RtpConfig::new(n)
                .with_shard_threshold(0)
                .with_strategy(Strategy::Ddp),
        );
    }
    out
}

fn label(c: &RtpConfig) -> String {
    format!(
        "N={} {} {} {}",
        c.world_size, c.strategy, c.rotation, c.routing
    )
}

/// Threads that spin until dropped, so that ranks get descheduled at arbitrary points.
struct BusyThreads {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl BusyThreads {
    fn start(count: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..count)
            .map(|i| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = i as u64 + 1;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        }
                        std::hint::black_box(x);
                    }
                })
            })
            .collect();
        Self { stop, handles }
    }
}

impl Drop for BusyThreads {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn bits(runs: &[RankRun]) -> Vec<Vec<u32>> {
    runs.iter()
        .flat_map(|(losses, params)| {
            std::iter::once(losses.iter().map(|v| v.to_bits()).collect()).chain(
                params
                    .iter()
                    .map(|p| p.iter().map(|v| v.to_bits()).collect()),
            )
        })
        .collect()
}

fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The comparison with single-device training is meaningful only if rounding alone cannot
/// move training past the tolerance. Data parallelism averages per-rank means where the
/// reference takes one mean over the batch; this checks, over many initial weights, that
/// single-device Burn itself stays within the tolerance when only that order changes.
#[test]
fn the_equivalence_model_is_well_conditioned() {
    let seeds = env_count("RTP_STRESS_SEEDS", 40);
    let mut bad = Vec::new();
    let mut worst = 0f32;
    for seed in 0..seeds {
        let weights = mlp_weights(seed);
        let (losses, params) = reference_mlp(&weights);
        for blocks in [2, 3, 4, 8] {
            let split = [reference_mlp_split(&weights, blocks)];
            worst = worst.max(worst_share_of_tolerance(&params, &split));
            let label = format!("seed {seed}, {blocks} row blocks");
            if let Err(e) = compare(Which::Mlp, &losses, &params, &split, &label) {
                bad.push(e);
            }
        }
    }
    println!(
        "conditioning: {} of {} (seed, blocks) pairs left the tolerance by rounding alone; worst parameter difference {:.3} of the tolerance",
        bad.len(),
        seeds * 4,
        worst
    );
    assert!(bad.is_empty(), "{} pairs, first: {}", bad.len(), bad[0]);
}

#[test]
fn training_is_bit_identical_under_chaos_and_load() {
    let reps = env_count("RTP_STRESS_REPS", 3);
    let weights = mlp_weights(SEED);
    let (ref_losses, ref_params) = reference_mlp(&weights);
    let configs = configs();
    // Unperturbed runs, one per configuration, before any load starts.
    let baselines: Vec<Vec<Vec<u32>>> = configs
        .iter()
        .map(|c| {
            let runs = rtp_mlp(c.clone(), &weights).expect("unperturbed run");
            if let Err(e) = compare(Which::Mlp, &ref_losses, &ref_params, &runs, &label(c)) {
                panic!("unperturbed: {e}");
            }
            bits(&runs)
        })
        .collect();

    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let _busy = BusyThreads::start(cores);
    let next = AtomicU64::new(0);
    let total = configs.len() as u64 * reps;
    let failures = Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        for _ in 0..PARALLEL_WORLDS {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= total {
                    break;
                }
                let i = (k % configs.len() as u64) as usize;
                let seed = 0x5EED_0000 + k;
                let config = configs[i].clone().with_chaos(Chaos::new(seed));
                let name = format!("{} (chaos seed {seed:#x})", label(&config));
                let outcome = match rtp_mlp(config, &weights) {
                    Err(e) => Err(format!("{name}: failed: {e}")),
                    Ok(runs) => compare(Which::Mlp, &ref_losses, &ref_params, &runs, &name)
                        .and_then(|()| {
                            if bits(&runs) == baselines[i] {
                                Ok(())
                            } else {
                                Err(format!("{name}: not bit-identical to the unperturbed run"))
                            }
                        }),
                };
                if let Err(e) = outcome {
                    failures.lock().unwrap().push(e);
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    println!(
        "stress: {} of {total} perturbed runs differed ({} configurations x {reps}, {} worlds at once, {cores} busy threads)",
        failures.len(),
        configs.len(),
        PARALLEL_WORLDS
    );
    assert!(
        failures.is_empty(),
        "{} of {total} perturbed runs differed; first: {}",
        failures.len(),
        failures[0]
    );
}
