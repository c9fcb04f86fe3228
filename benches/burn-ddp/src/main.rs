//! Burn's own data parallelism on wgpu, measured as a peer of burn-rtp.
//!
//! burn-train 0.21 offers two ways to train one model on several devices: `ExecutionStrategy::ddp`
//! (Burn's DDP: gradients all-reduced by the backend, feature `distributed`) and
//! `ExecutionStrategy::multi` (gradients moved to a main device with `to_device`). This binary
//! tries both at N = 2 on two wgpu devices of this machine's one adapter (`WgpuDevice::Cpu` and
//! `WgpuDevice::DefaultDevice`; on a CPU-only machine both are Mesa's lavapipe), next to a
//! single-device run of the same model, data and global batch.
//!
//! Each attempt runs in a child process of this binary with a time limit, because a failing
//! multi-device run may hang rather than fail. The parent writes one JSON file: per attempt,
//! whether it finished, the wall time per step, the peak resident set, the final loss on a fixed
//! batch, and every error line the attempt printed or logged (panics, and the "Task failed"
//! warnings with which cubecl's device runner reports a panic it caught).
//!
//! ```text
//! cargo run --manifest-path benches/burn-ddp/Cargo.toml -- --out burn-ddp.json
//! ```

use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, Wgpu};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn::tensor::backend::distributed::{DistributedConfig, ReduceOperation};
use burn::train::metric::LossMetric;
use burn::train::{
    ExecutionStrategy, InferenceStep, Learner, MultiDeviceOptim, RegressionOutput,
    SupervisedTraining, TrainOutput, TrainStep,
};
use clap::Parser;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The model and rows, shared with the scaling report's rows of burn-rtp (one source).
#[path = "../../src/peer_mlp.rs"]
mod peer_mlp;
use peer_mlp::{eval_rows, rows, Mlp};

/// The training backend of every attempt.
type Train = Autodiff<Wgpu>;

/// Command line.
#[derive(Parser, Debug)]
struct Args {
    /// Where the JSON result goes.
    #[arg(long, default_value = "burn-ddp.json")]
    out: PathBuf,
    /// Seconds an attempt may run before it is killed and reported as hung.
    #[arg(long, default_value_t = 240)]
    timeout: u64,
    /// Training steps per attempt.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Global batch (rows per step over all devices).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Hidden width of the model.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Internal: run one attempt in this process and write its outcome to `--out`.
    #[arg(long, hide = true)]
    only: Option<Attempt>,
}

/// What one child process tries.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
enum Attempt {
    /// Copy a tensor from one wgpu device to the other and read it back.
    ToDevice,
    /// The reference: one device, the whole global batch.
    Single,
    /// `ExecutionStrategy::multi` on two devices (gradients moved with `to_device`).
    Multi,
    /// `ExecutionStrategy::ddp` on two devices (Burn's DDP, all-reduce in the backend).
    Ddp,
}

impl Attempt {
    /// The attempt's name on the command line.
    fn name(self) -> &'static str {
        match self {
            Attempt::ToDevice => "to-device",
            Attempt::Single => "single",
            Attempt::Multi => "multi",
            Attempt::Ddp => "ddp",
        }
    }
}

/// What a child reports about itself.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
struct ChildReport {
    /// Milliseconds of wall time per training step (launch to end, over the steps).
    step_ms: Option<f64>,
    /// Loss of the trained model on a fixed batch (read back from the device).
    final_loss: Option<f64>,
    /// The value read back by the `to-device` check.
    read_back: Option<Vec<f32>>,
    /// Peak resident set of the child (`VmHWM`), bytes.
    peak_rss_bytes: Option<u64>,
}

/// One attempt as the parent saw it.
#[derive(Serialize, Debug)]
struct Outcome {
    attempt: Attempt,
    /// `finished`, `failed (exit status …)` or `hung (killed after … s)`.
    status: String,
    /// Whether it ran to the end without any error line.
    ok: bool,
    #[serde(flatten)]
    report: ChildReport,
    /// Distinct panics the attempt printed or logged (also those cubecl's device runner
    /// caught and only logged).
    errors: Vec<String>,
    /// Device tasks cubecl's runner reported as failed ("Task failed") and carried on past.
    failed_device_tasks: usize,
}

/// The whole result.
#[derive(Serialize, Debug)]
struct Report {
    burn: &'static str,
    devices: Vec<String>,
    steps: usize,
    batch: usize,
    hidden: usize,
    attempts: Vec<Outcome>,
    /// One line for a report's notes.
    summary: String,
}

/// The peer's model under burn-train's regression output.
fn regression<B: Backend>(model: &Mlp<B>, batch: XyBatch<B>) -> RegressionOutput<B> {
    let out = model.forward(batch.x);
    let loss = model.loss(out.clone(), batch.y.clone());
    RegressionOutput::new(loss, out, batch.y)
}

impl TrainStep for Mlp<Train> {
    type Input = XyBatch<Train>;
    type Output = RegressionOutput<Train>;

    fn step(&self, batch: XyBatch<Train>) -> TrainOutput<RegressionOutput<Train>> {
        let item = regression(self, batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl InferenceStep for Mlp<Wgpu> {
    type Input = XyBatch<Wgpu>;
    type Output = RegressionOutput<Wgpu>;

    fn step(&self, batch: XyBatch<Wgpu>) -> RegressionOutput<Wgpu> {
        regression(self, batch)
    }
}

/// Inputs and targets of a batch (public, as the shared model's step types name it).
#[derive(Clone, Debug)]
pub struct XyBatch<B: Backend> {
    x: Tensor<B, 2>,
    y: Tensor<B, 2>,
}

/// The shared rows ([`peer_mlp::rows`]) as burn-train batches.
#[derive(Clone)]
struct XyBatcher;

impl<B: Backend> Batcher<B, usize, XyBatch<B>> for XyBatcher {
    fn batch(&self, items: Vec<usize>, device: &B::Device) -> XyBatch<B> {
        let (x, y) = rows(&items, device);
        XyBatch { x, y }
    }
}

fn devices() -> Vec<WgpuDevice> {
    vec![WgpuDevice::Cpu, WgpuDevice::DefaultDevice]
}

/// Peak resident set of this process, from `/proc/self/status`.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs one attempt in this process.
fn run_child(attempt: Attempt, args: &Args, dir: &Path) -> ChildReport {
    let main = WgpuDevice::Cpu;
    if attempt == Attempt::ToDevice {
        let t = Tensor::<Wgpu, 1>::from_floats([1.0, 2.0, 3.0], &WgpuDevice::Cpu);
        let moved = t.to_device(&WgpuDevice::DefaultDevice);
        let read = moved.into_data().to_vec::<f32>().ok();
        return ChildReport {
            read_back: read,
            peak_rss_bytes: peak_rss(),
            ..Default::default()
        };
    }
    let n_dev = if attempt == Attempt::Single { 1 } else { 2 };
    // Every strategy sees the same global batch per step: the multi-device strategies give
    // each device its own batch of `batch / 2` rows.
    let per_device = args.batch / n_dev;
    let rows = args.steps * args.batch;
    let train = DataLoaderBuilder::<Train, _, _>::new(XyBatcher)
        .batch_size(per_device)
        .build(InMemDataset::new((0..rows).collect::<Vec<_>>()));
    let valid = DataLoaderBuilder::<Wgpu, _, _>::new(XyBatcher)
        .batch_size(args.batch)
        .build(InMemDataset::new(
            (rows..rows + args.batch).collect::<Vec<_>>(),
        ));
    let strategy = match attempt {
        Attempt::Single => ExecutionStrategy::SingleDevice(main.clone()),
        Attempt::Multi => ExecutionStrategy::multi(devices(), MultiDeviceOptim::OptimMainDevice),
        Attempt::Ddp => ExecutionStrategy::ddp(
            devices(),
            DistributedConfig {
                all_reduce_op: ReduceOperation::Mean,
            },
        ),
        Attempt::ToDevice => unreachable!(),
    };
    let training = SupervisedTraining::new(dir, train, valid)
        .with_training_strategy(strategy.into())
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .num_epochs(1);
    Train::seed(&main, 7);
    let model = Mlp::<Train>::new(args.hidden, &main);
    let optim = AdamConfig::new().init::<Train, Mlp<Train>>();
    let start = Instant::now();
    let result = training.launch(Learner::new(model, optim, 1e-3));
    let step_ms = start.elapsed().as_secs_f64() * 1e3 / args.steps as f64;
    let batch: XyBatch<Wgpu> = XyBatcher.batch(eval_rows(args.batch).collect(), &main);
    let loss = regression(&result.model, batch).loss.into_scalar();
    ChildReport {
        step_ms: Some(step_ms),
        final_loss: Some(f64::from(loss)),
        read_back: None,
        peak_rss_bytes: peak_rss(),
    }
}

/// The distinct panics in `text` (`panicked at <place>: <message>`, the message being the
/// line after), and how many device tasks cubecl's runner reported as failed.
fn panics(text: &str) -> (Vec<String>, usize) {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<String> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(at) = line.find("panicked at ") else {
            continue;
        };
        let place = line[at + "panicked at ".len()..].trim_end_matches(':');
        // Registry paths are long; the crate and file are what a reader needs.
        let place = place
            .rsplit_once("/src/index.crates.io-")
            .map_or(place, |(_, p)| {
                p.split_once('/').map_or(p, |(_, rest)| rest)
            });
        let message = lines.get(i + 1).map_or("", |l| l.trim());
        let entry = format!("panicked at {place}: {message}");
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    let failed_tasks = lines.iter().filter(|l| l.contains("Task failed")).count();
    (out, failed_tasks)
}

/// Runs one attempt as a child process, with the time limit.
fn attempt(attempt: Attempt, args: &Args, work: &Path) -> Outcome {
    let dir = work.join(attempt.name());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the attempt's folder");
    let json = dir.join("child.json");
    let log = dir.join("child.log");
    let exe = std::env::current_exe().expect("own path");
    let mut child = Command::new(exe)
        .args(["--only", attempt.name()])
        .args([
            "--steps",
            &args.steps.to_string(),
            "--batch",
            &args.batch.to_string(),
        ])
        .args(["--hidden", &args.hidden.to_string()])
        .arg("--out")
        .arg(&json)
        .stdout(Stdio::from(std::fs::File::create(&log).expect("log file")))
        .stderr(Stdio::from(
            std::fs::OpenOptions::new()
                .append(true)
                .open(&log)
                .expect("log file"),
        ))
        .spawn()
        .expect("start the attempt");
    let start = Instant::now();
    let limit = Duration::from_secs(args.timeout);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the attempt") {
            break if status.success() {
                "finished".to_string()
            } else {
                format!("failed ({status})")
            };
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break format!("hung (killed after {} s)", args.timeout);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut text = std::fs::read_to_string(&log).unwrap_or_default();
    // burn-train's application logger writes here; cubecl's caught task panics land in it.
    if let Ok(logged) = std::fs::read_to_string(dir.join("experiment.log")) {
        text.push_str(&logged);
    }
    let report: ChildReport = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let (errors, failed_device_tasks) = panics(&text);
    let ok = status == "finished" && errors.is_empty() && failed_device_tasks == 0;
    Outcome {
        attempt,
        status,
        ok,
        report,
        errors,
        failed_device_tasks,
    }
}

fn main() {
    let args = Args::parse();
    if let Some(only) = args.only {
        let dir = args.out.parent().unwrap_or(Path::new(".")).to_path_buf();
        let report = run_child(only, &args, &dir);
        std::fs::write(&args.out, serde_json::to_vec(&report).expect("json"))
            .expect("write the attempt's outcome");
        return;
    }
    let work = std::env::temp_dir().join(format!("burn-ddp-{}", std::process::id()));
    let mut attempts = Vec::new();
    for a in [
        Attempt::ToDevice,
        Attempt::Single,
        Attempt::Multi,
        Attempt::Ddp,
    ] {
        eprintln!("burn-ddp: {a:?} ...");
        let outcome = attempt(a, &args, &work);
        eprintln!(
            "burn-ddp: {a:?}: {}{}",
            outcome.status,
            outcome
                .errors
                .first()
                .map(|e| format!("; first error: {e}"))
                .unwrap_or_default()
        );
        attempts.push(outcome);
    }
    let describe = |o: &Outcome| {
        let timing = match (o.report.step_ms, o.report.final_loss) {
            (Some(ms), Some(loss)) => format!(" ({ms:.1} ms/step, final loss {loss:.5})"),
            _ => String::new(),
        };
        if o.ok {
            format!("{} ran{timing}", o.attempt.name())
        } else {
            format!(
                "{} {}{timing}, {} device task(s) failed and were skipped, panics: {}",
                o.attempt.name(),
                if o.status == "finished" {
                    "exited 0 after panics"
                } else {
                    &o.status
                },
                o.failed_device_tasks,
                o.errors
                    .iter()
                    .map(|e| format!("`{e}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    };
    let summary = format!(
        "Burn 0.21 on wgpu, N = 2 ({}): {}",
        devices()
            .iter()
            .map(|d| format!("{d:?}"))
            .collect::<Vec<_>>()
            .join(" + "),
        attempts.iter().map(describe).collect::<Vec<_>>().join("; ")
    );
    let report = Report {
        burn: "0.21.0",
        devices: devices().iter().map(|d| format!("{d:?}")).collect(),
        steps: args.steps,
        batch: args.batch,
        hidden: args.hidden,
        attempts,
        summary: summary.clone(),
    };
    std::fs::write(&args.out, serde_json::to_vec_pretty(&report).expect("json"))
        .expect("write the report");
    println!("{summary}");
    let _ = std::fs::remove_dir_all(&work);
}
