//! The memory planner against the ledger: model state exact to the byte at N = 1, 2, 3, 4, 8
//! under every strategy, and the total peak within 10% at N = 2 and 3 in both rotation modes,
//! on the equivalence models. The planner itself only ever ran at N = 1.

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn_rtp::{
    launch, sync_gradients, PlanConfig, Planner, RotationMode, Routing, Rtp, RtpConfig, RtpDevice,
    RtpOptimizer, Strategy,
};
use common::*;

type Ad = Autodiff<Rtp<NdArray>>;

const STRATEGIES: [Strategy; 3] = [Strategy::Rtp, Strategy::Fsdp, Strategy::Ddp];

/// Rows `[rank·batch, (rank+1)·batch)` of the shared data.
fn my_rows(device: &RtpDevice<NdArray>, batch: usize) -> std::ops::Range<usize> {
    device.rank() * batch..(device.rank() + 1) * batch
}

/// What a measured run saw on rank 0.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// Live model-state bytes with parameters, synchronised gradients and optimizer state.
    with_grads: u64,
    /// Live model-state bytes after the update (the gradients are gone).
    after_step: u64,
    /// The ledger's peak of the sum over the run.
    peak_total: u64,
    /// Each category's peak.
    peak: burn_rtp::MemoryStats,
    /// What the peak of the sum was made of.
    at_peak: burn_rtp::MemoryStats,
}

/// Two Adam steps of `which` at `batch` samples per rank; on the second, the model state is
/// read once the gradients are synchronised and once the update is done.
fn run<M>(
    model: M,
    device: &RtpDevice<NdArray>,
    batch: usize,
    loss: impl Fn(&M, usize, std::ops::Range<usize>, &RtpDevice<NdArray>) -> Tensor<Ad, 1>,
) -> (M, Seen)
where
    M: AutodiffModule<Ad>,
{
    let mut model = model;
    let mut optim = RtpOptimizer::new(adam().init::<Ad, M>());
    let mut seen = Seen {
        with_grads: 0,
        after_step: 0,
        peak_total: 0,
        peak: Default::default(),
        at_peak: Default::default(),
    };
    // Three steps: FSDP's prefetch starts in the third, once the second has recorded the
    // order of the gathers.
    for step in 0..3 {
        let l = loss(&model, step, my_rows(device, batch), device);
        let mut grads = GradientsParams::from_grads(l.backward(), &model);
        sync_gradients::<M, Ad, NdArray>(&model, &mut grads);
        seen.with_grads = device.memory_live().sharded;
        model = optim.step(LR, model, grads);
        seen.after_step = device.memory_live().sharded;
    }
    seen.peak_total = device.memory_peak().total;
    seen.peak = device.memory_peak();
    seen.at_peak = device.memory_at_peak();
    (model, seen)
}

fn mlp_run(device: &RtpDevice<NdArray>, batch: usize) -> (Mlp<Ad>, Seen) {
    run(Mlp::<Ad>::new(device), device, batch, |m, s, r, d| {
        step_loss_mlp(m, s, r, d)
    })
}

fn lm_run(device: &RtpDevice<NdArray>, batch: usize) -> (TinyLm<Ad>, Seen) {
    run(TinyLm::<Ad>::new(device), device, batch, |m, s, r, d| {
        step_loss_lm(m, s, r, d)
    })
}

fn planner(which: Which) -> Planner {
    planner_routing(which, Routing::Weights)
}

fn planner_routing(which: Which, routing: Routing) -> Planner {
    let config = PlanConfig::default()
        .with_shard_threshold(0)
        .with_batch(4)
        .with_routing(routing);
    match which {
        Which::Mlp => Planner::probe::<NdArray, Ad, _, _>(config, |d, b| mlp_run(d, b).0),
        Which::Lm => Planner::probe::<NdArray, Ad, _, _>(config, |d, b| lm_run(d, b).0),
    }
    .unwrap()
}

fn measure(
    which: Which,
    strategy: Strategy,
    rotation: RotationMode,
    world: usize,
    batch: usize,
) -> Seen {
    measure_routing(which, strategy, rotation, Routing::Weights, world, batch)
}

fn measure_routing(
    which: Which,
    strategy: Strategy,
    rotation: RotationMode,
    routing: Routing,
    world: usize,
    batch: usize,
) -> Seen {
    let config = RtpConfig::new(world)
        .with_strategy(strategy)
        .with_rotation(rotation)
        .with_routing(routing)
        .with_shard_threshold(0);
    let seen = launch::<NdArray, _, _>(config, move |device| match which {
        Which::Mlp => mlp_run(&device, batch).1,
        Which::Lm => lm_run(&device, batch).1,
    })
    .unwrap();
    seen[0]
}

#[test]
fn model_state_is_predicted_to_the_byte() {
    for which in [Which::Mlp, Which::Lm] {
        let plan = planner(which);
        for world in [1, 2, 3, 4, 8] {
            for strategy in STRATEGIES {
                let seen = measure(which, strategy, RotationMode::OutOfPlace, world, 3);
                let what = format!("{which:?} {strategy} N={world}");
                assert_eq!(
                    seen.with_grads,
                    plan.model_state(strategy, world),
                    "{what}: parameters, gradients and Adam's moments"
                );
                assert_eq!(
                    seen.after_step,
                    plan.param_bytes(strategy, world) * 3,
                    "{what}: parameters and Adam's moments"
                );
            }
        }
    }
}

/// The predicted peak against the ledger's, at N = 2 and 3, for every planned strategy and
/// both rotation modes. A tiny model's ledger peak varies between identical runs (by up to
/// 20% for the MLP, whose peak is half rotation buffers: a sent bundle stays charged until
/// the neighbour takes it, and when that happens is a matter of timing), so the prediction
/// is compared with the mean peak of several runs.
#[test]
fn total_peak_is_predicted_within_ten_percent() {
    let batch = 4;
    let mut failures = Vec::new();
    for (which, runs) in [(Which::Mlp, 7), (Which::Lm, 3)] {
        let plan = planner(which);
        for world in [2, 3] {
            for (strategy, rotation) in burn_rtp::plan::PLANNED {
                let seen: Vec<u64> = (0..runs)
                    .map(|_| measure(which, strategy, rotation, world, batch).peak_total)
                    .collect();
                let mean = seen.iter().sum::<u64>() as f64 / seen.len() as f64;
                let p = plan.predict(strategy, rotation, world, batch);
                let err = (p.total as f64 - mean) / mean;
                eprintln!(
                    "{which:?} {} N={world}: predicted {} B (state {}, activations {}, in flight {}), ledger {seen:?} B, error {:+.1}%",
                    p.label(), p.total, p.model_state, p.activations, p.in_flight, err * 100.0
                );
                let bound = 0.10;
                if err.abs() > bound {
                    failures.push(format!(
                        "{which:?} {} N={world}: {:+.1}%",
                        p.label(),
                        err * 100.0
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// With the activations routed (every pass, or where `Auto` routes), the planner adds the
/// peers' inputs each owner keeps and the routed passes' buffers, and leaves the weights that
/// never rotate out of rotation's: its peak against the ledger's mean peak, at N = 2, 3 and 4.
/// Under `Auto` the bound is the same 10%. Routing every pass, the LM's peak is over-predicted
/// by up to 15%: the planner adds the largest routed backward's buffers (its MLP's second
/// Linear's dX partials) to every activation alive at the start of the backward, though the
/// layers after it (the head) have freed theirs by the time it runs. The MLP routes every
/// pass under `Auto` at 4 samples per rank.
#[test]
fn routed_peak_is_predicted_within_ten_percent() {
    let batch = 4;
    let mut failures = Vec::new();
    for (which, runs) in [(Which::Mlp, 7), (Which::Lm, 3)] {
        for routing in [Routing::Activations, Routing::Auto] {
            let plan = planner_routing(which, routing);
            for world in [2, 3, 4] {
                let rotation = RotationMode::OutOfPlace;
                let seen: Vec<u64> = (0..runs)
                    .map(|_| {
                        measure_routing(which, Strategy::Rtp, rotation, routing, world, batch)
                            .peak_total
                    })
                    .collect();
                let mean = seen.iter().sum::<u64>() as f64 / seen.len() as f64;
                let p = plan.predict(Strategy::Rtp, rotation, world, batch);
                let err = (p.total as f64 - mean) / mean;
                eprintln!(
                    "{which:?} {} N={world}: predicted {} B (state {}, activations {}, in flight {}), ledger {seen:?} B, error {:+.1}%",
                    p.label(), p.total, p.model_state, p.activations, p.in_flight, err * 100.0
                );
                let over = match routing {
                    Routing::Activations => 0.15,
                    _ => 0.10,
                };
                if !(-0.10..=over).contains(&err) {
                    failures.push(format!(
                        "{which:?} {} N={world}: {:+.1}%",
                        p.label(),
                        err * 100.0
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
