//! Sharded checkpoints through the library API: a round trip resumes bit for bit, a
//! checkpoint loads into another world (4 → 3, 2 → 5) and training continues as single-device
//! training does, consolidation gives an ordinary Burn record, and damaged or mismatched
//! checkpoints are refused before anything is loaded.

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::optim::{GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_rtp::checkpoint::{self, Checkpoint, CheckpointError};
use burn_rtp::{launch, Rtp, RtpConfig, RtpOptimizer, Strategy};
use common::*;
use std::path::{Path, PathBuf};

type Ref = Autodiff<NdArray>;
type Dist = Autodiff<Rtp<NdArray>>;

/// Rows of the global batch: a multiple of 2, 3, 4 and 5, so every rank of every world here
/// has an equal slice and the mean of the ranks' losses is the global loss.
const ROWS: usize = 60;
/// Steps before and after the checkpoint.
const HALF: usize = 4;

/// Token and target rows of step `step` (a fixed pseudo-random stream).
fn tokens(step: usize) -> (Vec<i64>, Vec<i64>) {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ (step as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % VOCAB as u64) as i64
    };
    let stream: Vec<i64> = (0..ROWS * (SEQ + 1)).map(|_| next()).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for row in 0..ROWS {
        let base = row * (SEQ + 1);
        x.extend_from_slice(&stream[base..base + SEQ]);
        y.extend_from_slice(&stream[base + 1..base + SEQ + 1]);
    }
    (x, y)
}

fn loss<B: AutodiffBackend>(
    model: &TinyLm<B>,
    step: usize,
    rows: std::ops::Range<usize>,
    device: &B::Device,
) -> Tensor<B, 1> {
    let (x, y) = tokens(step);
    let part = |v: Vec<i64>| {
        let v = v[rows.start * SEQ..rows.end * SEQ].to_vec();
        Tensor::<B, 2, Int>::from_data(TensorData::new(v, [rows.len(), SEQ]), device)
    };
    model.loss(part(x), part(y))
}

fn slice(rank: usize, world: usize) -> std::ops::Range<usize> {
    let per = ROWS / world;
    rank * per..(rank + 1) * per
}

/// Runs `steps`, returning the model, the optimizer and this rank's losses.
fn run<B, O>(
    mut model: TinyLm<B>,
    mut optim: O,
    steps: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    device: &B::Device,
) -> (TinyLm<B>, O, Vec<f32>)
where
    B: AutodiffBackend,
    O: Optimizer<TinyLm<B>, B>,
{
    let mut losses = Vec::new();
    for step in steps {
        let l = loss(&model, step, rows.clone(), device);
        losses.push(l.clone().into_scalar().elem_f32());
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optim.step(LR, model, grads);
    }
    (model, optim, losses)
}

trait ElemF32 {
    fn elem_f32(self) -> f32;
}
impl<E: burn::tensor::ElementConversion> ElemF32 for E {
    fn elem_f32(self) -> f32 {
        self.elem::<f32>()
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-rtp-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn config(world: usize, strategy: Strategy) -> RtpConfig {
    RtpConfig::new(world)
        .with_strategy(strategy)
        .with_shard_threshold(0)
}

/// Trains `HALF` steps in a world of `world` from `weights` and saves at step `HALF`.
fn train_and_save(weights: &[u8], world: usize, strategy: Strategy, root: &Path) {
    launch(config(world, strategy), |device| {
        let model = load_bytes(TinyLm::<Dist>::new(&device), weights, &device);
        let optim = RtpOptimizer::new(adam().init());
        let rows = slice(device.rank(), world);
        let (model, optim, _) = run(model, optim, 0..HALF, rows, &device);
        checkpoint::save(&device, root, HALF as u64, &model, &optim, &"test").unwrap();
    })
    .unwrap();
}

/// Per-step mean loss over the ranks of a world that resumes from `root` (resharded).
fn resume_resharded(root: &Path, world: usize, strategy: Strategy) -> Vec<f32> {
    let ckpt = Checkpoint::open(root).unwrap();
    let runs = launch(config(world, strategy), |device| {
        let (model, optim) = ckpt
            .load_resharded(
                &device,
                TinyLm::<Dist>::new(&device),
                RtpOptimizer::new(adam().init()),
            )
            .unwrap();
        let rows = slice(device.rank(), world);
        run(model, optim, HALF..2 * HALF, rows, &device).2
    })
    .unwrap();
    (0..HALF)
        .map(|t| runs.iter().map(|l| l[t]).sum::<f32>() / world as f32)
        .collect()
}

/// Single-device training of `2 * HALF` steps from `weights`, uninterrupted.
fn reference(weights: &[u8]) -> Vec<f32> {
    let device = Default::default();
    let model = load_bytes(TinyLm::<Ref>::new(&device), weights, &device);
    run(model, adam().init(), 0..2 * HALF, 0..ROWS, &device).2
}

fn reshard_matches_single_device(from: usize, s_from: Strategy, to: usize, s_to: Strategy) {
    let device = Default::default();
    let weights = to_bytes(TinyLm::<Ref>::new(&device));
    let want = reference(&weights);
    let root = scratch(&format!("reshard-{from}-{to}"));
    train_and_save(&weights, from, s_from, &root);
    let got = resume_resharded(&root, to, s_to);
    for (t, (g, w)) in got.iter().zip(&want[HALF..]).enumerate() {
        assert!(
            rel_close(*g, *w, 1e-5),
            "{from} ranks ({s_from}) -> {to} ranks ({s_to}): step {}: loss {g} vs single-device {w}",
            HALF + t
        );
    }
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_checkpoint_of_4_ranks_continues_on_3_as_single_device_training_does() {
    reshard_matches_single_device(4, Strategy::Rtp, 3, Strategy::Rtp);
}

#[test]
fn a_checkpoint_of_2_fsdp_ranks_continues_on_5_rtp_ranks_as_single_device_training_does() {
    reshard_matches_single_device(2, Strategy::Fsdp, 5, Strategy::Rtp);
}

#[test]
fn resuming_in_the_same_world_is_bit_exact_and_consolidation_is_plain_burn() {
    let device = Default::default();
    let weights = to_bytes(TinyLm::<Ref>::new(&device));
    let root = scratch("exact");
    let world = 3;
    // Uninterrupted: HALF steps, save, HALF more; the parameters at the save, gathered.
    let straight = launch(config(world, Strategy::Rtp), |device| {
        let model = load_bytes(TinyLm::<Dist>::new(&device), &weights, &device);
        let rows = slice(device.rank(), world);
        let optim = RtpOptimizer::new(adam().init());
        let (model, optim, _) = run(model, optim, 0..HALF, rows.clone(), &device);
        checkpoint::save(&device, &root, HALF as u64, &model, &optim, &"exact").unwrap();
        let at_save = param_values(&model);
        let (model, _, losses) = run(model, optim, HALF..2 * HALF, rows, &device);
        (losses, param_values(&model), at_save)
    })
    .unwrap();
    let ckpt = Checkpoint::open(&root).unwrap();
    assert_eq!(ckpt.manifest().step, HALF as u64);
    assert_eq!(ckpt.user::<String>().unwrap(), "exact");
    let resumed = launch(config(world, Strategy::Rtp), |device| {
        let (model, optim) = ckpt
            .load(
                &device,
                TinyLm::<Dist>::new(&device),
                RtpOptimizer::new(adam().init()),
            )
            .unwrap();
        let rows = slice(device.rank(), world);
        let (model, _, losses) = run(model, optim, HALF..2 * HALF, rows, &device);
        (losses, param_values(&model))
    })
    .unwrap();
    for (rank, ((want_l, want_p, _), (got_l, got_p))) in straight.iter().zip(&resumed).enumerate() {
        assert_eq!(got_l, want_l, "rank {rank}: losses after resuming");
        assert_eq!(got_p, want_p, "rank {rank}: parameters after resuming");
    }
    // Consolidated on the host: an ordinary record that single-device Burn loads, holding
    // exactly the parameters the world had at the save.
    let out = root.join("whole.mpk");
    ckpt.consolidate(&out).unwrap();
    let record = NamedMpkFileRecorder::<FullPrecisionSettings>::new()
        .load(out.clone(), &device)
        .unwrap();
    let single = TinyLm::<Ref>::new(&device).load_record(record);
    assert_eq!(param_values(&single), straight[0].2);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn damaged_or_mismatched_checkpoints_are_refused_before_loading() {
    let device = Default::default();
    let weights = to_bytes(TinyLm::<Ref>::new(&device));
    let root = scratch("refusals");
    train_and_save(&weights, 2, Strategy::Rtp, &root);
    let ckpt = Checkpoint::open(&root).unwrap();

    // Another world size, or another strategy: refused by the exact load, with what differs.
    for (world, strategy, what) in [
        (3, Strategy::Rtp, "world size"),
        (2, Strategy::Fsdp, "strategy"),
    ] {
        let errors = launch(config(world, strategy), |device| {
            ckpt.load(
                &device,
                TinyLm::<Dist>::new(&device),
                RtpOptimizer::new(adam().init()),
            )
            .err()
            .map(|e| e.to_string())
        })
        .unwrap();
        for e in errors {
            let e = e.expect("a mismatched world must be refused");
            assert!(e.contains(what), "{e}");
        }
    }

    let dir = ckpt.dir().to_path_buf();
    let file = dir.join("rank-00001.model.mpk");
    let good = std::fs::read(&file).unwrap();
    // Truncated.
    std::fs::write(&file, &good[..good.len() - 10]).unwrap();
    match Checkpoint::open(&dir) {
        Err(CheckpointError::Truncated {
            bytes, expected, ..
        }) => {
            assert_eq!(bytes + 10, expected)
        }
        other => panic!("expected Truncated, got {other:?}"),
    }
    // Opened through its root, the only checkpoint there is not complete: the error says so
    // and names its fault.
    match Checkpoint::open(&root) {
        Err(CheckpointError::NoneComplete {
            tried: 1, newest, ..
        }) => {
            assert!(
                matches!(*newest, CheckpointError::Truncated { .. }),
                "{newest}"
            )
        }
        other => panic!("expected NoneComplete, got {other:?}"),
    }
    // One byte flipped.
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x40;
    std::fs::write(&file, &bad).unwrap();
    assert!(matches!(
        Checkpoint::open(&dir),
        Err(CheckpointError::Checksum { .. })
    ));
    std::fs::write(&file, &good).unwrap();
    Checkpoint::open(&root).unwrap();
    // Another format version.
    let manifest = dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replace(
            &format!("\"format\": {}", checkpoint::FORMAT),
            "\"format\": 1",
        ),
    )
    .unwrap();
    assert!(matches!(
        Checkpoint::open(&dir),
        Err(CheckpointError::Format { found: 1, .. })
    ));
    // Nothing there.
    assert!(matches!(
        Checkpoint::open(&root.join("nowhere")),
        Err(CheckpointError::Missing { .. })
    ));
    std::fs::remove_dir_all(&root).unwrap();
}
