//! Per-rank memory is about 1/N of single-device model state, measured by the accounting.

mod common;

use burn::module::Module;
use burn::optim::Optimizer;
use burn_rtp::{launch, MemoryStats, RotationMode, Rtp, RtpConfig, RtpOptimizer};
use common::*;

type Dist = burn::backend::Autodiff<Rtp<burn::backend::NdArray>>;

const WORLD: usize = 4;

/// Trains the language model for a few Adam steps and returns each rank's peaks.
fn measure(mode: RotationMode) -> Vec<(MemoryStats, usize)> {
    launch(
        RtpConfig::new(WORLD)
            .with_shard_threshold(0)
            .with_rotation(mode),
        |device| {
            device.reset_memory_peak();
            let mut model = TinyLm::<Dist>::new(&device);
            let mut optim = RtpOptimizer::new(adam().init());
            for step in 0..3 {
                let loss = step_loss_lm(&model, step, rows(device.rank(), WORLD), &device);
                let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
                model = optim.step(LR, model, grads);
            }
            (device.memory_peak(), model.num_params())
        },
    )
    .expect("training runs")
}

fn largest_shard_bytes() -> usize {
    // The embedding [67, 36] and head [36, 67]/FF [36, 100]: rank 0 holds ceil(last / 4) columns.
    let shapes: [(usize, usize); 4] = [
        (VOCAB, D_MODEL),
        (D_MODEL, VOCAB),
        (D_MODEL, D_FF),
        (D_FF, D_MODEL),
    ];
    shapes
        .iter()
        .map(|(rows, cols)| rows * cols.div_ceil(WORLD) * 4)
        .max()
        .unwrap()
}

#[test]
fn sharded_state_is_a_quarter_of_single_device_at_n4() {
    let peaks = measure(RotationMode::OutOfPlace);
    let params = peaks[0].1;
    // fp32 parameters + gradients + Adam's two moments.
    let single_device_state = params * 4 * 4;
    let budget =
        1.05 * single_device_state as f64 / WORLD as f64 + 2.0 * largest_shard_bytes() as f64;
    for (rank, (peak, _)) in peaks.iter().enumerate() {
        assert!(
            (peak.sharded as f64) <= budget,
            "rank {rank}: sharded peak {} B exceeds budget {budget:.0} B (single-device state {single_device_state} B)",
            peak.sharded
        );
        assert!(
            (peak.sharded as f64) >= 0.9 * single_device_state as f64 / WORLD as f64,
            "rank {rank}: sharded peak {} B is implausibly small: is the state tracked?",
            peak.sharded
        );
    }
}

/// Both rotation modes move shards, and the ledger sees them in flight. (In-place holds one
/// bundle while it computes where out-of-place holds two, but at each swap the outgoing
/// bundle lives until the neighbour takes it while the incoming one arrives, so the two
/// modes reach the same peak; which rank reaches it depends on which neighbour lags.)
#[test]
fn both_rotation_modes_hold_shards_in_flight() {
    let out_of_place = measure(RotationMode::OutOfPlace);
    let in_place = measure(RotationMode::InPlace);
    for rank in 0..WORLD {
        let (oop, ip) = (out_of_place[rank].0.in_flight, in_place[rank].0.in_flight);
        assert!(ip > 0, "rank {rank}: in-place rotation moved nothing");
        assert!(oop > 0, "rank {rank}: out-of-place rotation moved nothing");
    }
}

#[test]
fn the_memory_cap_fails_like_an_allocation_and_names_the_rank() {
    let run = |cap: u64| {
        launch(
            RtpConfig::new(WORLD)
                .with_shard_threshold(0)
                .with_memory_cap(cap),
            |device| {
                let mut model = TinyLm::<Dist>::new(&device);
                let mut optim = RtpOptimizer::new(adam().init());
                let loss = step_loss_lm(&model, 0, rows(device.rank(), WORLD), &device);
                let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
                model = optim.step(LR, model, grads);
                model.num_params()
            },
        )
    };
    let err = run(16 * 1024).unwrap_err();
    assert!(
        matches!(err, burn_rtp::RtpError::OutOfMemory { cap: 16384, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("out of memory"), "{err}");
    assert!(run(64 * 1024 * 1024).is_ok());
}

#[test]
fn out_of_place_rotation_hides_transfers_behind_compute() {
    let hidden = |mode: RotationMode| {
        launch(
            RtpConfig::new(WORLD)
                .with_shard_threshold(0)
                .with_rotation(mode),
            |device| {
                let model = TinyLm::<Dist>::new(&device);
                device.record_timeline(true);
                let loss = step_loss_lm(&model, 0, rows(device.rank(), WORLD), &device);
                let _ = loss.backward();
                burn_rtp::timeline::hidden_transfer_fraction(&device.take_timeline())
            },
        )
        .unwrap()
    };
    let oop = hidden(RotationMode::OutOfPlace);
    let ip = hidden(RotationMode::InPlace);
    for rank in 0..WORLD {
        let (o, i) = (
            oop[rank].expect("transfers recorded"),
            ip[rank].expect("transfers recorded"),
        );
        assert!(o > 0.0, "rank {rank}: out-of-place hid nothing");
        assert!(i < o, "rank {rank}: in-place hid {i}, out-of-place {o}");
    }
}
