//! `docs/porting.md`'s recipe, followed on a model no other test trains: an MLP classifier
//! (23 inputs, a hidden width of 37 with LayerNorm and a residual, 5 classes; no dimension
//! divisible by 2, 3 or 4) trained with cross-entropy on synthetic data, by Adam and by SGD,
//! at N = 1, 2, 3 and 4 under `Autodiff<Rtp<NdArray>>`, against single-device
//! `Autodiff<NdArray>` from the same initial record, step by step.
//!
//! It also checks what the recipe relies on: the lazy-clone trap it warns of, the loss read
//! with `all_reduce_mean(loss.into_scalar())`, the placement report, and a checkpoint
//! consolidated into a file Burn's own `NamedMpkFileRecorder` loads.
//!
//! The bounds the comparisons assert are the ones `docs/porting.md` quotes; the test prints
//! what it measured (`cargo test -p burn-rtp --test porting -- --nocapture`).

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Gelu, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_rtp::checkpoint::{self, Checkpoint};
use burn_rtp::{launch, placement, KernelPath, RotationKernels, Rtp, RtpConfig, RtpOptimizer};
use common::{load_bytes, param_values, seeded, to_bytes};
use std::ops::Range;

/// Single-device Burn: the reference.
type Ref = Autodiff<NdArray>;
/// The ported backend.
type Dist = Autodiff<Rtp<NdArray>>;

const IN: usize = 23;
const HIDDEN: usize = 37;
const CLASSES: usize = 5;
/// The global batch: every world here (1 to 4 ranks) splits it evenly.
const BATCH: usize = 24;
const STEPS: usize = 30;
const SEED: u64 = 23;

/// The classifier a user ports: `input`, then a residual block `h + hidden(gelu(norm(h)))`,
/// then `head`.
#[derive(Module, Debug)]
struct Classifier<B: Backend> {
    input: Linear<B>,
    norm: LayerNorm<B>,
    hidden: Linear<B>,
    head: Linear<B>,
    act: Gelu,
}

impl<B: Backend> Classifier<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            input: LinearConfig::new(IN, HIDDEN).init(device),
            norm: LayerNormConfig::new(HIDDEN).init(device),
            hidden: LinearConfig::new(HIDDEN, HIDDEN).init(device),
            head: LinearConfig::new(HIDDEN, CLASSES).init(device),
            act: Gelu::new(),
        }
    }

    fn loss(&self, x: Tensor<B, 2>, y: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        let h = self.input.forward(x);
        let h = h.clone() + self.hidden.forward(self.act.forward(self.norm.forward(h)));
        let logits = self.head.forward(h);
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, y)
    }
}

/// Step `step`'s global batch: inputs in [-1, 1) and the labels of a fixed linear teacher,
/// so that the loss falls as the model learns.
fn global_batch(step: usize) -> (Vec<f32>, Vec<i64>) {
    let mut s = 0xA076_1D64_78BD_642Fu64 ^ (step as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 2000) as f32 / 1000.0 - 1.0
    };
    let x: Vec<f32> = (0..BATCH * IN).map(|_| next()).collect();
    let teacher = |i: usize, c: usize| (((i * 7 + c * 11) % 13) as f32 - 6.0) / 6.0;
    let labels = x
        .chunks(IN)
        .map(|row| {
            let score = |c: usize| {
                row.iter()
                    .enumerate()
                    .map(|(i, v)| v * teacher(i, c))
                    .sum::<f32>()
            };
            (0..CLASSES)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap() as i64
        })
        .collect();
    (x, labels)
}

/// Rows `rows` of step `step`'s global batch.
fn batch<B: Backend>(
    step: usize,
    rows: Range<usize>,
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let (x, labels) = global_batch(step);
    let n = rows.len();
    let x = TensorData::new(x[rows.start * IN..rows.end * IN].to_vec(), [n, IN]);
    let y = TensorData::new(labels[rows].to_vec(), [n]);
    (Tensor::from_data(x, device), Tensor::from_data(y, device))
}

/// The recipe's slice: rank `r` of `n` takes rows `[r*b/n, (r+1)*b/n)` of the global batch.
fn slice(rank: usize, n: usize) -> Range<usize> {
    rank * BATCH / n..(rank + 1) * BATCH / n
}

/// The initial weights, as a record of single-device Burn (bytes any backend loads).
///
/// The recipe records a freshly initialised model; here the values are also drawn from a
/// fixed seed (`seeded`), since Burn's own generator is seeded from OS entropy and every run
/// would otherwise train other weights.
fn initial_record() -> Vec<u8> {
    to_bytes(seeded(
        Classifier::<NdArray>::new(&Default::default()),
        SEED,
    ))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Opt {
    Adam,
    Sgd,
}

impl Opt {
    fn lr(self) -> f64 {
        match self {
            Opt::Adam => 1e-2,
            Opt::Sgd => 0.1,
        }
    }
}

/// Per-step losses (as `read` reports them) and the final parameters.
type Run = (Vec<f64>, Vec<Vec<f32>>);

/// The ordinary Burn training loop: the same code on every backend.
fn train<B, O>(
    mut model: Classifier<B>,
    mut optim: O,
    lr: f64,
    rows: Range<usize>,
    device: &B::Device,
    read: impl Fn(Tensor<B, 1>) -> f64,
) -> Run
where
    B: AutodiffBackend,
    O: Optimizer<Classifier<B>, B>,
{
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = batch::<B>(step, rows.clone(), device);
        let loss = model.loss(x, y);
        losses.push(read(loss.clone()));
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);
    }
    (losses, param_values(&model))
}

/// Single-device Burn on the whole global batch.
fn reference(opt: Opt, record: &[u8]) -> Run {
    let device = Default::default();
    let model = load_bytes(Classifier::<Ref>::new(&device), record, &device);
    let read = |loss: Tensor<Ref, 1>| loss.into_scalar().elem::<f64>();
    let rows = 0..BATCH;
    match opt {
        Opt::Adam => train(
            model,
            AdamConfig::new().init(),
            opt.lr(),
            rows,
            &device,
            read,
        ),
        Opt::Sgd => train(
            model,
            SgdConfig::new().init(),
            opt.lr(),
            rows,
            &device,
            read,
        ),
    }
}

/// The port: `Autodiff<Rtp<NdArray>>` on `n` ranks, each on its slice, the loss read as the
/// mean over ranks. Every rank's run, in rank order, with the steps that rank's thread ran on
/// burn-rtp-kernels' own kernels.
fn ported(opt: Opt, n: usize, record: &[u8]) -> Vec<(Run, u64)> {
    ported_with(opt, RtpConfig::new(n).with_shard_threshold(0), record)
}

/// [`ported`] under `config`.
fn ported_with(opt: Opt, config: RtpConfig, record: &[u8]) -> Vec<(Run, u64)> {
    let n = config.world_size;
    launch(config, |device| {
        let before = burn_rtp_kernels::fused_launches_on_this_thread();
        // Built inside the closure: each rank keeps only its slice of the full record.
        let model = load_bytes(Classifier::<Dist>::new(&device), record, &device);
        let read = |loss: Tensor<Dist, 1>| {
            // The backend's element type goes in as it is.
            f64::from(device.all_reduce_mean(loss.into_scalar()))
        };
        let rows = slice(device.rank(), n);
        let run = match opt {
            Opt::Adam => {
                let optim = RtpOptimizer::new(AdamConfig::new().init());
                train(model, optim, opt.lr(), rows, &device, read)
            }
            Opt::Sgd => {
                let optim = RtpOptimizer::new(SgdConfig::new().init());
                train(model, optim, opt.lr(), rows, &device, read)
            }
        };
        (
            run,
            burn_rtp_kernels::fused_launches_on_this_thread() - before,
        )
    })
    .expect("the ported run")
}

/// The largest difference between two loss curves.
fn max_loss_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The largest difference between two sets of parameters, relative to each parameter's
/// largest magnitude.
fn max_param_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f64;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len());
        let scale = y.iter().fold(1e-3f32, |m, v| m.max(v.abs())) as f64;
        for (u, v) in x.iter().zip(y) {
            worst = worst.max((u - v).abs() as f64 / scale);
        }
    }
    worst
}

/// The bounds `docs/porting.md` quotes, for N = 2, 3 and 4 (N = 1 must be bit-identical):
/// the largest per-step loss difference against single-device Burn, and between the ported
/// runs at N = 1, 2 and 3; and the final parameters' largest difference from single-device
/// Burn's, relative to each parameter's largest magnitude.
struct Bounds {
    loss: f64,
    between_n_loss: f64,
    params: f64,
}

fn bounds(opt: Opt) -> Bounds {
    match opt {
        Opt::Adam => Bounds {
            loss: 1e-6,
            between_n_loss: 1e-6,
            params: 2e-5,
        },
        Opt::Sgd => Bounds {
            loss: 1e-6,
            between_n_loss: 1e-6,
            params: 2e-6,
        },
    }
}

fn matches_single_device(opt: Opt) {
    let record = initial_record();
    let (ref_losses, ref_params) = reference(opt, &record);
    let b = bounds(opt);
    println!(
        "{opt:?}: single-device Burn's loss {:.4} -> {:.4} in {STEPS} steps",
        ref_losses[0],
        ref_losses[STEPS - 1]
    );
    assert!(
        ref_losses[STEPS - 1] < 0.8 * ref_losses[0],
        "{opt:?}: the reference does not learn"
    );
    // N = 1 runs the rotation (one step per pass) on NdArray's own GEMM steps, not Burn's ops.
    assert_eq!(
        <NdArray as RotationKernels>::kernel_path(),
        KernelPath::Native
    );
    let mut curves = Vec::new();
    for n in 1..=4 {
        let counted = ported(opt, n, &record);
        // Each rank's own thread ran its steps on the native GEMMs (a counter no other test's
        // threads can move).
        for (rank, (_, native_steps)) in counted.iter().enumerate() {
            assert!(
                *native_steps > 0,
                "{opt:?} N={n}: rank {rank} ran no native step"
            );
        }
        let runs: Vec<Run> = counted.into_iter().map(|(run, _)| run).collect();
        let losses = &runs[0].0;
        for (rank, (l, p)) in runs.iter().enumerate() {
            // The mean over ranks is the same bits on every rank, and so are the parameters
            // (gathered).
            assert_eq!(l, losses, "{opt:?} N={n}: rank {rank}'s losses");
            assert_eq!(p, &runs[0].1, "{opt:?} N={n}: rank {rank}'s parameters");
        }
        let loss_diff = max_loss_diff(losses, &ref_losses);
        let param_diff = max_param_diff(&runs[0].1, &ref_params);
        println!(
            "{opt:?} N={n} vs single-device Burn: max |loss diff| {loss_diff:.3e}, \
             max param diff {param_diff:.3e} (of each parameter's largest magnitude)"
        );
        if n == 1 {
            // One rank without the one-pass GELU (whose transcendentals differ from Burn's
            // by a few ulps): the same arithmetic as single-device Burn, bit for bit.
            let config = RtpConfig::new(1)
                .with_shard_threshold(0)
                .with_fused_activations(false);
            let (exact, _) = &ported_with(opt, config, &record)[0];
            assert_eq!(exact.0, ref_losses, "{opt:?} N=1: losses");
            assert_eq!(exact.1, ref_params, "{opt:?} N=1: parameters");
        }
        assert!(
            loss_diff <= b.loss,
            "{opt:?} N={n}: loss differs from single-device Burn by {loss_diff:e} > {:e}",
            b.loss
        );
        assert!(
            param_diff <= b.params,
            "{opt:?} N={n}: parameters differ by {param_diff:e} > {:e}",
            b.params
        );
        curves.push(losses.clone());
    }
    // The ported runs at N = 1, 2 and 3 against each other.
    for (i, a) in curves.iter().enumerate().take(3) {
        for (j, b_curve) in curves.iter().enumerate().take(3).skip(i + 1) {
            let d = max_loss_diff(a, b_curve);
            let (ni, nj) = (i + 1, j + 1);
            println!("{opt:?} N={ni} vs N={nj}: max |loss diff| {d:.3e}");
            assert!(
                d <= b.between_n_loss,
                "{opt:?}: N={ni} and N={nj} differ by {d:e} > {:e}",
                b.between_n_loss
            );
        }
    }
}

#[test]
fn adam_training_matches_single_device_burn_at_n_1_to_4() {
    matches_single_device(Opt::Adam);
}

#[test]
fn sgd_training_matches_single_device_burn_at_n_1_to_4() {
    matches_single_device(Opt::Sgd);
}

/// The trap the recipe warns of: Burn 0.21's parameters are lazy, and cloning a model whose
/// parameters are not initialised yet clones their initialisers, so the copy draws weights of
/// its own. Recording the model (`into_record`) initialises it; a record is one set of weights.
#[test]
fn a_clone_of_an_uninitialised_model_holds_other_weights() {
    let device = Default::default();
    let model = Classifier::<NdArray>::new(&device);
    let copy = model.clone();
    assert_ne!(param_values(&copy), param_values(&model));

    let model = Classifier::<NdArray>::new(&device);
    let record = to_bytes(model.clone());
    let loaded = load_bytes(Classifier::<NdArray>::new(&device), &record, &device);
    // `to_bytes(model.clone())` initialised the clone only: `model` draws again.
    assert_ne!(param_values(&loaded), param_values(&model));
    // Loaded from the one record, two models hold the same weights.
    let again = load_bytes(Classifier::<NdArray>::new(&device), &record, &device);
    assert_eq!(param_values(&loaded), param_values(&again));
}

/// The loss read as the recipe reads it, on `Autodiff<Rtp<NdArray>>`: `into_scalar()` goes into
/// `all_reduce_mean` as it is, and so does an `f64`.
#[test]
fn all_reduce_mean_takes_the_backend_element_and_f64() {
    let record = initial_record();
    let out = launch(RtpConfig::new(3), |device| {
        let model = load_bytes(Classifier::<Dist>::new(&device), &record, &device);
        let (x, y) = batch::<Dist>(0, slice(device.rank(), 3), &device);
        let loss = model.loss(x, y);
        let local = loss.clone().into_scalar();
        let mean = device.all_reduce_mean(loss.into_scalar());
        let rank = device.all_reduce_mean(device.rank() as f64);
        (local, mean, rank)
    })
    .unwrap();
    let sum: f64 = out.iter().map(|(l, _, _)| f64::from(*l)).sum();
    for (_, mean, rank) in &out {
        assert_eq!(*mean, (sum / 3.0) as f32);
        assert_eq!(*rank, 1.0f64);
    }
    // The mean of the slices' means is the global batch's loss, to rounding.
    let device = Default::default();
    let model = load_bytes(Classifier::<Ref>::new(&device), &record, &device);
    let (x, y) = batch::<Ref>(0, 0..BATCH, &device);
    let whole: f32 = model.loss(x, y).into_scalar();
    assert!((out[0].1 - whole).abs() <= 1e-6 * whole.abs());
}

/// The placement report: at threshold 0 every parameter is sharded and the ranks' bytes add
/// up to the model's; with a threshold between two parameter sizes, the smaller ones are
/// replicated. Works on the autodiff model and the inner one alike.
#[test]
fn placement_reports_sharded_and_replicated_parameters() {
    let record = initial_record();
    let n = 3;
    let reports = launch(RtpConfig::new(n).with_shard_threshold(0), |device| {
        let model = load_bytes(Classifier::<Dist>::new(&device), &record, &device);
        let inner = placement(&model.valid());
        (placement(&model), inner)
    })
    .unwrap();
    let full_bytes = 4 * (IN * HIDDEN + HIDDEN + 2 * HIDDEN + HIDDEN * HIDDEN + HIDDEN)
        + 4 * (HIDDEN * CLASSES + CLASSES);
    let mut sum = 0;
    for (rank, (p, inner)) in reports.iter().enumerate() {
        assert_eq!(p, inner, "the autodiff model and its inner model");
        assert_eq!((p.rank, p.world_size), (rank, n));
        assert_eq!(p.params.len(), 8);
        assert_eq!(p.num_sharded(), 8, "{p}");
        assert_eq!(p.replicated_bytes(), 0);
        assert_eq!(p.full_bytes(), full_bytes);
        assert_eq!(p.rank_bytes(), p.sharded_bytes());
        // About a third each: the first ranks take the remainder of an uneven split.
        let third = full_bytes as f64 / n as f64;
        let share = p.sharded_bytes() as f64;
        assert!(
            (share - third).abs() <= 0.1 * third,
            "rank {rank}: {share} of {full_bytes}"
        );
        sum += p.sharded_bytes();
    }
    assert_eq!(sum, full_bytes, "the shards add up to the model");
    let p = &reports[0].0;
    let paths: Vec<&str> = p.params.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "input.weight",
            "input.bias",
            "norm.gamma",
            "norm.beta",
            "hidden.weight",
            "hidden.bias",
            "head.weight",
            "head.bias"
        ]
    );
    let head = &p.params[6];
    assert_eq!(
        (head.shape.clone(), head.local_shape.clone()),
        (vec![HIDDEN, CLASSES], vec![HIDDEN, 2])
    );
    assert_eq!(head.local_bytes, HIDDEN * 2 * 4);
    let table = p.to_string();
    println!("{table}");
    assert!(table.contains("hidden.weight") && table.contains("[37, 13]"));
    assert!(table.ends_with(&format!(
        "{}; {} here of the model's {}",
        p.summary(),
        burn_rtp::human_bytes(p.rank_bytes() as u64),
        burn_rtp::human_bytes(full_bytes as u64)
    )));

    // A threshold between the head's weight (185 elements) and the input's (851): the two
    // large weights stay sharded, every other parameter is replicated.
    let reports = launch(RtpConfig::new(n).with_shard_threshold(500), |device| {
        let model = load_bytes(Classifier::<Dist>::new(&device), &record, &device);
        placement(&model)
    })
    .unwrap();
    for p in &reports {
        let sharded: Vec<&str> = p
            .params
            .iter()
            .filter(|e| e.layout_name() == "sharded")
            .map(|e| e.path.as_str())
            .collect();
        assert_eq!(sharded, ["input.weight", "hidden.weight"], "{p}");
        assert_eq!(p.num_replicated(), 6);
        let replicated = 4 * (4 * HIDDEN + HIDDEN * CLASSES + CLASSES);
        assert_eq!(p.replicated_bytes(), replicated);
        assert_eq!(
            p.summary(),
            format!(
                "2 sharded ({} on this rank), 6 replicated ({})",
                burn_rtp::human_bytes(p.sharded_bytes() as u64),
                burn_rtp::human_bytes(replicated as u64)
            )
        );
    }
}

/// A checkpoint of the ported run, consolidated, is a file Burn's own `NamedMpkFileRecorder`
/// loads, named with or without its `.mpk`, holding the weights the world trained.
#[test]
fn a_consolidated_checkpoint_loads_with_burns_file_recorder() {
    let record = initial_record();
    let root = std::env::temp_dir().join(format!("burn-rtp-porting-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let n = 3;
    let trained = launch(RtpConfig::new(n).with_shard_threshold(0), |device| {
        let model = load_bytes(Classifier::<Dist>::new(&device), &record, &device);
        let mut optim = RtpOptimizer::new(AdamConfig::new().init());
        let (x, y) = batch::<Dist>(0, slice(device.rank(), n), &device);
        let grads = GradientsParams::from_grads(model.loss(x, y).backward(), &model);
        let model = optim.step(1e-2, model, grads);
        checkpoint::save(&device, &root, 1, &model, &optim, &()).unwrap();
        param_values(&model)
    })
    .unwrap();
    let ckpt = Checkpoint::open(&root).unwrap();
    let device = Default::default();
    let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
    for (out, load_as) in [
        ("model", "model"),
        ("model", "model.mpk"),
        ("weights.mpk", "weights"),
        ("weights.mpk", "weights.mpk"),
    ] {
        let written = ckpt.consolidate(&root.join(out)).unwrap();
        assert_eq!(written, checkpoint::record_file(&root.join(out)));
        assert_eq!(written.extension().unwrap(), "mpk");
        let loaded = recorder
            .load(root.join(load_as), &device)
            .unwrap_or_else(|e| panic!("consolidate({out:?}) then load({load_as:?}): {e}"));
        let single = Classifier::<NdArray>::new(&device).load_record(loaded);
        assert_eq!(
            param_values(&single),
            trained[0],
            "{out} loaded as {load_as}"
        );
    }
    std::fs::remove_dir_all(&root).unwrap();
}
