//! One training step (forward, backward, Adam) of the GPT under every strategy, at N in
//! {1, 2, 4, 8} in-process ranks, on a small model and on a state-dominated one.
//!
//! Burn's own DDP (burn-train's `DistributedDataParallel`) is not benched here: it needs Burn's
//! `distributed` feature and a `DistributedBackend`, which NdArray does not implement.

use burn_rtp_benches::{models, Case, Driver, Variant};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::time::Duration;

fn step(c: &mut Criterion) {
    for (model_name, model, batch) in [
        ("small", models::small(), 16),
        ("state-dominated", models::state_dominated(), 8),
    ] {
        let mut group = c.benchmark_group(format!("step/{model_name}"));
        for ranks in [1usize, 2, 4, 8] {
            for variant in Variant::ALL {
                let case = Case {
                    variant,
                    ranks,
                    model: model.clone(),
                    batch,
                    memory_cap: None,
                    shard_threshold: None,
                    activation_checkpointing: burn_rtp::ActivationCheckpointing::None,
                };
                let mut driver = Driver::start(case).expect("the world starts");
                driver.steps(1).expect("warm-up step");
                group.bench_with_input(BenchmarkId::new(variant.name(), ranks), &ranks, |b, _| {
                    b.iter_custom(|iters| {
                        Duration::from_secs_f64(driver.steps(iters as usize).expect("steps run"))
                    })
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, step);
criterion_main!(benches);
