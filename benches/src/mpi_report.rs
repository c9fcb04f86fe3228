//! `scaling-report --transport mpi`: every strategy runs as its own `mpirun -np N` job, one
//! rank per process, strategies alternating, and the figures come from those processes: step
//! times between barriers, the ledger's peak beside the OS's peak resident set (`VmHWM`), the
//! share of the time bytes were really moving (by the MPI transport's clock) that ran during
//! compute, and the largest model that trains under a real per-process address-space limit
//! (`prlimit --as`).

use crate::{median, InnerBackend, Variant};
use burn::backend::autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn_rtp::timeline::IntervalKind;
use burn_rtp::{
    human_bytes, ActivationCheckpointing, MpiProgress, RotationKernels, Rtp, RtpOptimizer,
};
use burn_rtp_gpt::data::{Corpus, Windows};
use burn_rtp_gpt::{Gpt, GptConfig};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// A worker's training backend over the inner backend `I`, with autodiff's checkpointing
/// strategy `C`.
type B<I, C> = Autodiff<Rtp<I>, C>;

/// One job: what a worker process trains and measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    /// The strategy.
    pub variant: Variant,
    /// The model.
    pub model: GptConfig,
    /// Sequences per rank per step.
    pub batch_per_rank: usize,
    /// Untimed steps first.
    pub warmup: usize,
    /// Timed steps.
    pub steps: usize,
    /// Where rank 0 writes the [`JobResult`].
    pub out: PathBuf,
    /// How each process's communication thread paces its tests of transfers in flight.
    #[serde(default)]
    pub mpi_progress: MpiProgress,
    /// Where each rank writes its timeline of the timed steps ([`timeline_file`]), if
    /// anywhere.
    #[serde(default)]
    pub timeline: Option<PathBuf>,
    /// Whether autodiff recomputes memory-bound activations in the backward pass.
    #[serde(default)]
    pub activation_checkpointing: ActivationCheckpointing,
    /// The inner backend.
    #[serde(default)]
    pub backend: InnerBackend,
    /// Compute threads per process (`None`: the host's cores divided by its ranks).
    #[serde(default)]
    pub threads: Option<usize>,
    /// Whether GELU runs burn-rtp-kernels' one-pass steps
    /// ([`burn_rtp::RtpConfig::with_fused_activations`]).
    #[serde(default = "crate::yes")]
    pub fused_activations: bool,
}

/// The file rank `rank` of a job writes its timeline to, for the job's `timeline` stem: a
/// JSON array of [`burn_rtp::timeline::Interval`]s, in seconds from the first timed step.
pub fn timeline_file(stem: &Path, rank: usize) -> PathBuf {
    let mut name = stem.as_os_str().to_owned();
    name.push(format!(".rank{rank}.json"));
    PathBuf::from(name)
}

/// What one job measured, gathered from every rank by rank 0.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobResult {
    /// Parameters of the model.
    pub params: usize,
    /// Wall time of each timed step, barrier to barrier, in seconds.
    pub step_s: Vec<f64>,
    /// Each rank's ledger peak (everything the decorator holds), in bytes.
    pub ledger_peak_bytes: Vec<u64>,
    /// Each rank's process peak resident set (`VmHWM`), in bytes.
    pub peak_rss_bytes: Vec<u64>,
    /// Each rank's peak resident set just before its model was built, in bytes.
    #[serde(default)]
    pub baseline_rss_bytes: Vec<u64>,
    /// Each rank's share of wire time hidden behind compute (`None`: the rank received
    /// nothing while recording; DDP and FSDP, which do not rotate, compute nothing that
    /// could hide a transfer and read 0).
    pub overlap: Vec<Option<f64>>,
    /// Each rank's share of wire time during which it was blocked on its transfers (`None`
    /// as for `overlap`).
    #[serde(default)]
    pub wire_in_waits: Vec<Option<f64>>,
    /// Each rank's communication-thread pacing at the end of the job, and why.
    #[serde(default)]
    pub progress: Vec<String>,
    /// Each rank's bytes of tensor data sent per timed step, counted by its transport.
    #[serde(default)]
    pub sent_bytes_per_step: Vec<f64>,
    /// Each rank's time per timed step computing inside rotations (the timeline's compute
    /// intervals), in seconds: the time a rotating shard's transfer can hide under.
    #[serde(default)]
    pub rotation_compute_s_per_step: Vec<f64>,
    /// Each process's minor page faults per timed step ([`burn_rtp::minor_page_faults`]):
    /// fresh pages the steady state maps.
    #[serde(default)]
    pub minor_faults_per_step: Vec<f64>,
}

#[derive(Serialize, Deserialize)]
struct RankFigures {
    ledger: u64,
    rss: u64,
    baseline: u64,
    overlap: Option<f64>,
    in_waits: Option<f64>,
    progress: String,
    sent_per_step: f64,
    compute_per_step: f64,
    faults_per_step: f64,
}

/// Runs `job` as this process's rank of an MPI job (inside `mpirun`).
pub fn worker(job: &Job) -> Result<(), String> {
    match job.backend {
        InnerBackend::Ndarray => worker_on::<NdArray>(job),
        InnerBackend::Flex => worker_on::<Flex>(job),
    }
}

/// [`worker`] on the inner backend `I`.
fn worker_on<I: RotationKernels>(job: &Job) -> Result<(), String> {
    let launched =
        burn_rtp::transport::mpi_launch().ok_or("the MPI worker must be started by mpirun")?;
    let mut config = job
        .variant
        .config(launched.size)
        .with_mpi_progress(job.mpi_progress);
    if let Some(threads) = job.threads {
        config = config.with_threads_per_rank(threads);
    }
    config = config.with_fused_activations(job.fused_activations);
    let corpus = Corpus::load(None, job.model.seq).map_err(|e| e.to_string())?;
    let results = burn_rtp::try_launch_on::<I, _, std::convert::Infallible, _>(
        config,
        |_| Default::default(),
        |device| {
            Ok(match job.activation_checkpointing {
                ActivationCheckpointing::None => {
                    rank_job::<I, NoCheckpointing>(job, &corpus, device)
                }
                ActivationCheckpointing::Balanced => {
                    rank_job::<I, BalancedCheckpointing>(job, &corpus, device)
                }
            })
        },
    )
    .map_err(|e| e.to_string())?;
    if let Some(result) = results.into_iter().flatten().next() {
        std::fs::write(&job.out, serde_json::to_vec(&result).expect("serialisable"))
            .map_err(|e| format!("cannot write {}: {e}", job.out.display()))?;
    }
    Ok(())
}

/// One rank's part of `job` on `Autodiff<Rtp<I>, C>`: rank 0 returns what every rank
/// measured.
fn rank_job<I: RotationKernels, C: CheckpointStrategy>(
    job: &Job,
    corpus: &Corpus,
    device: burn_rtp::RtpDevice<I>,
) -> Option<JobResult> {
    B::<I, C>::seed(&device, 7);
    let (rank, per) = (device.rank(), job.batch_per_rank);
    let baseline = burn_rtp::peak_rss_bytes().unwrap_or(0);
    let mut model: Gpt<B<I, C>> = job.model.init::<B<I, C>>(&device);
    let mut optim = RtpOptimizer::<
        burn::optim::adaptor::OptimizerAdaptor<burn_rtp::FusedAdam, Gpt<B<I, C>>, B<I, C>>,
    >::adam(&AdamConfig::new());
    let mut step_s = Vec::new();
    let mut sent_before = device.sent_bytes();
    let mut faults_before = burn_rtp::minor_page_faults().unwrap_or(0);
    for step in 0..job.warmup + job.steps {
        if step == job.warmup {
            device.record_timeline(true);
            sent_before = device.sent_bytes();
            faults_before = burn_rtp::minor_page_faults().unwrap_or(0);
        }
        // The batch is built before the clock starts, as the PyTorch peer builds its own.
        let (x, y) = Windows::train(corpus, 7, step, rank * per..(rank + 1) * per, job.model.seq)
            .tensors::<B<I, C>>(&device);
        device.barrier();
        let t0 = Instant::now();
        let loss = model.loss(x, y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
        // Steps end together: the slowest rank sets the step time.
        device.barrier();
        if step >= job.warmup {
            step_s.push(t0.elapsed().as_secs_f64());
        }
    }
    let sent = device.sent_bytes() - sent_before;
    let faults = burn_rtp::minor_page_faults().unwrap_or(0) - faults_before;
    let timeline = device.take_timeline();
    device.record_timeline(false);
    if let Some(stem) = &job.timeline {
        let path = timeline_file(stem, rank);
        let text = serde_json::to_string(&timeline).expect("intervals serialise");
        if let Err(e) = std::fs::write(&path, text) {
            panic!(
                "rank {rank}: cannot write its timeline {}: {e}",
                path.display()
            );
        }
    }
    let own = RankFigures {
        ledger: device.memory_peak().total,
        rss: burn_rtp::peak_rss_bytes().unwrap_or(0),
        baseline,
        overlap: burn_rtp::timeline::hidden_transfer_fraction(&timeline),
        in_waits: burn_rtp::timeline::transfer_share_during(&timeline, IntervalKind::Wait),
        progress: device.progress_policy().unwrap_or_default(),
        sent_per_step: sent as f64 / job.steps.max(1) as f64,
        compute_per_step: timeline
            .iter()
            .filter(|i| i.kind == IntervalKind::Compute)
            .map(|i| i.end - i.start)
            .sum::<f64>()
            / job.steps.max(1) as f64,
        faults_per_step: faults as f64 / job.steps.max(1) as f64,
    };
    let all = device.all_gather_json(&own);
    (rank == 0).then(|| JobResult {
        params: model.num_params(),
        step_s,
        ledger_peak_bytes: all.iter().map(|f| f.ledger).collect(),
        peak_rss_bytes: all.iter().map(|f| f.rss).collect(),
        baseline_rss_bytes: all.iter().map(|f| f.baseline).collect(),
        overlap: all.iter().map(|f| f.overlap).collect(),
        wire_in_waits: all.iter().map(|f| f.in_waits).collect(),
        sent_bytes_per_step: all.iter().map(|f| f.sent_per_step).collect(),
        rotation_compute_s_per_step: all.iter().map(|f| f.compute_per_step).collect(),
        minor_faults_per_step: all.iter().map(|f| f.faults_per_step).collect(),
        progress: all.into_iter().map(|f| f.progress).collect(),
    })
}

/// One benchmark configuration of the table.
#[derive(Debug, Clone)]
pub struct Config {
    /// Its name in keys and tables (`a`, `b`).
    pub name: &'static str,
    /// The model.
    pub model: GptConfig,
    /// Sequences per rank per step.
    pub batch_per_rank: usize,
}

/// What the MPI report measures.
#[derive(Debug, Clone)]
pub struct MpiReportConfig {
    /// Output folder.
    pub out: PathBuf,
    /// Configurations A and B.
    pub configs: Vec<Config>,
    /// World sizes (processes).
    pub ranks: Vec<usize>,
    /// Jobs per strategy and cell (strategies alternate between jobs).
    pub repeats: usize,
    /// Untimed steps per job.
    pub warmup: usize,
    /// Timed steps per job.
    pub steps: usize,
    /// Per-process address-space limit of the capacity search, in bytes.
    pub capacity_limit_bytes: u64,
    /// Models the capacity search tries, smallest first.
    pub capacity_candidates: Vec<GptConfig>,
    /// Where the memory planner's predictions are checked against each process's RSS.
    pub planner_grid: Vec<crate::planner_check::PlanPoint>,
    /// How each process's communication thread paces its tests of transfers in flight.
    pub mpi_progress: MpiProgress,
    /// Whether every timed job's ranks also write their timelines (under `out/jobs/`).
    pub timelines: bool,
    /// The Python that runs the PyTorch peer (`benches/peers/pytorch/gpt_peer.py`): its DDP
    /// and FSDP2 then run in every cell beside ours, alternating with them (`None`: ours only).
    pub pytorch: Option<PathBuf>,
}

impl MpiReportConfig {
    /// The configurations: A (d_model 256, 4 layers, 4 heads, context 64, 8
    /// sequences per rank) and B (d_model 768, 6 layers, 12 heads, context 16, 2 per rank).
    pub fn full(out: PathBuf) -> Self {
        Self {
            out,
            configs: vec![
                Config {
                    name: "a",
                    model: GptConfig::new(64, 256, 4, 4),
                    batch_per_rank: 8,
                },
                Config {
                    name: "b",
                    model: GptConfig::new(16, 768, 6, 12),
                    batch_per_rank: 2,
                },
            ],
            ranks: vec![2, 4],
            repeats: 3,
            warmup: 1,
            steps: 3,
            capacity_limit_bytes: 768 << 20,
            // Two blocks, widths 5% apart (parameters about 10%): the ratio of two
            // strategies' capacities is then not an artefact of where a coarse ladder's rungs
            // fall (the earlier ladder added a block every six widths, so its rungs grew
            // parameters by up to 2.2x).
            capacity_candidates: crate::report::capacity_ladder(8, 2, 256, 4096, 1.05),
            planner_grid: crate::planner_check::rss_grid(),
            mpi_progress: MpiProgress::Auto,
            timelines: false,
            pytorch: None,
        }
    }

    /// Small models, one job per cell: a few minutes on two cores (CI).
    pub fn quick(out: PathBuf) -> Self {
        Self {
            out,
            configs: vec![
                Config {
                    name: "a",
                    model: GptConfig::new(16, 32, 1, 4),
                    batch_per_rank: 2,
                },
                Config {
                    name: "b",
                    model: GptConfig::new(8, 96, 1, 4),
                    batch_per_rank: 1,
                },
            ],
            ranks: vec![2, 4],
            repeats: 1,
            warmup: 1,
            steps: 2,
            capacity_limit_bytes: 320 << 20,
            capacity_candidates: crate::report::capacity_candidates(8, 64, 1024),
            planner_grid: crate::planner_check::tiny_grid()[..1].to_vec(),
            mpi_progress: MpiProgress::Auto,
            timelines: false,
            pytorch: None,
        }
    }
}

/// The strategies of the MPI report, in their first order: DDP with buckets (the baseline
/// every ratio is against), and without them, to show what the buckets gain.
const STRATEGIES: [Variant; 4] = [
    Variant::DDP,
    Variant::FSDP,
    Variant::RTP_OUT_OF_PLACE,
    Variant::DDP_UNBUCKETED,
];

/// What a cell's job runs: one of our strategies, or the PyTorch peer's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Runner {
    /// Our strategy, in this process's binary.
    Ours(Variant),
    /// PyTorch's DDP (`ddp`), FSDP2 (`fsdp`) or unwrapped model (`single`), in the peer
    /// script.
    PyTorch(&'static str),
}

impl Runner {
    /// Its name in cells and keys.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Runner::Ours(v) => v.name(),
            Runner::PyTorch("ddp") => "pytorch-ddp",
            Runner::PyTorch("single") => "pytorch-single",
            Runner::PyTorch(_) => "pytorch-fsdp",
        }
    }
}

/// The PyTorch peer script of this source tree.
pub fn pytorch_peer_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/pytorch/gpt_peer.py")
}

/// Runs `job` as PyTorch's `strategy` (`ddp` or `fsdp`) under `mpirun -np ranks`, with
/// `python` running the peer script; gloo finds its peers through a free local port.
pub(crate) fn run_peer(
    python: &Path,
    strategy: &str,
    ranks: usize,
    job: &Job,
) -> Result<JobResult, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free local port for gloo: {e}"))?
        .port()
        .to_string();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--allow-run-as-root", "-np"])
        .arg(ranks.to_string());
    for (name, value) in [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port.as_str())] {
        cmd.arg("-x").arg(name).env(name, value);
    }
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .arg(python)
        .arg(pytorch_peer_script())
        .args(["--strategy", strategy, "--job"])
        .arg(serde_json::to_string(job).expect("serialisable"))
        // The same threads per rank as ours: all of them on one host, so our default
        // (`RtpConfig::threads_per_rank_here`) is the cores divided by the ranks.
        .arg("--threads")
        .arg(
            job.threads
                .unwrap_or_else(|| {
                    burn_rtp::RtpConfig::new(ranks)
                        .with_transport(burn_rtp::TransportKind::InProcess)
                        .threads_per_rank_here()
                })
                .to_string(),
        );
    let what = format!("PyTorch {strategy} at -np {ranks}");
    job_output(cmd, job, &what, false)?.ok_or_else(|| format!("{what} wrote no result"))
}

/// Runs `job` under `mpirun -np ranks` (optionally under `prlimit --as`); `Ok(None)` when the
/// job failed, which the capacity search reads as "does not fit".
pub(crate) fn run_job(
    exe: &Path,
    ranks: usize,
    job: &Job,
    as_limit: Option<u64>,
    env: &[(&str, &str)],
) -> Result<Option<JobResult>, String> {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--allow-run-as-root", "-np"])
        .arg(ranks.to_string());
    for (name, value) in env {
        // `-x` exports the variable to every rank, wherever mpirun starts it.
        cmd.arg("-x").arg(name).env(name, value);
    }
    if let Some(limit) = as_limit {
        cmd.arg("prlimit").arg(format!("--as={limit}"));
    }
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let what = format!("{} at -np {ranks}", job.variant.name());
    job_output(
        worker_command(cmd, exe, job),
        job,
        &what,
        as_limit.is_some(),
    )
}

/// `cmd` (a launcher) with `exe` as the MPI worker running `job`.
pub(crate) fn worker_command(mut cmd: Command, exe: &Path, job: &Job) -> Command {
    cmd.arg(exe)
        .arg("--mpi-worker")
        .arg(serde_json::to_string(job).expect("serialisable"));
    cmd
}

/// Runs the launcher `cmd` of `job` and reads the job's result. A failed job is an error
/// naming `what`, or `Ok(None)` where `failure_is_none` (the capacity search reads it as "does
/// not fit").
pub(crate) fn job_output(
    mut cmd: Command,
    job: &Job,
    what: &str,
    failure_is_none: bool,
) -> Result<Option<JobResult>, String> {
    let _ = std::fs::remove_file(&job.out);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {what} (is Open MPI installed?): {e}"))?;
    if !out.status.success() {
        if !failure_is_none {
            return Err(format!(
                "{what} failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
        }
        return Ok(None);
    }
    let text = std::fs::read(&job.out)
        .map_err(|e| format!("the job wrote no result ({}): {e}", job.out.display()))?;
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Checks that each of a job's `ranks` wrote a readable timeline with some compute in it, so
/// that a report run with timelines never leaves a silent gap.
fn check_timelines(stem: &Path, ranks: usize) -> Result<(), String> {
    for rank in 0..ranks {
        let path = timeline_file(stem, rank);
        let text = std::fs::read(&path)
            .map_err(|e| format!("rank {rank} wrote no timeline ({}): {e}", path.display()))?;
        let intervals: Vec<burn_rtp::timeline::Interval> = serde_json::from_slice(&text)
            .map_err(|e| format!("unreadable timeline {}: {e}", path.display()))?;
        if !intervals.iter().any(|i| i.kind == IntervalKind::Compute) {
            return Err(format!("timeline {} holds no compute", path.display()));
        }
    }
    Ok(())
}

/// The mean over the ranks that timed something (`None` if none did).
fn mean_of_ranks(per_rank: &[Option<f64>]) -> Option<f64> {
    let timed: Vec<f64> = per_rank.iter().flatten().copied().collect();
    (!timed.is_empty()).then(|| timed.iter().sum::<f64>() / timed.len() as f64)
}

/// Median and spread (min, max) of a sample.
fn summary(values: &[f64]) -> Value {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    json!({ "median": median(values), "min": min, "max": max, "samples": values.len() })
}

#[derive(Default)]
struct Cell {
    step_ms: Vec<f64>,
    rss: Vec<f64>,
    ledger: Vec<f64>,
    overlap: Vec<f64>,
    /// Per job, the ranks' mean share of wire time spent blocked on transfers.
    in_waits: Vec<f64>,
    params: usize,
    /// The communication threads' pacings seen across the cell's jobs and ranks.
    progress: std::collections::BTreeSet<String>,
}

/// Runs every job and writes `report.json`, `report.md` and the SVG plots; `exe` is the
/// `scaling-report` binary, which `mpirun` starts in worker mode.
pub fn run(
    cfg: &MpiReportConfig,
    exe: &Path,
    log: &dyn Fn(&str),
) -> Result<Value, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&cfg.out)?;
    let scratch = cfg.out.join("jobs");
    std::fs::create_dir_all(&scratch)?;
    let mut cells: std::collections::BTreeMap<(&str, usize, &str), Cell> = Default::default();
    for c in &cfg.configs {
        for &n in &cfg.ranks {
            for repeat in 0..cfg.repeats {
                let mut order: Vec<Runner> = STRATEGIES.map(Runner::Ours).to_vec();
                if cfg.pytorch.is_some() {
                    order.extend([Runner::PyTorch("ddp"), Runner::PyTorch("fsdp")]);
                }
                let len = order.len();
                order.rotate_left(repeat % len);
                for runner in order {
                    let variant = match runner {
                        Runner::Ours(v) => v,
                        // The peer reads the model, the batch and the steps; not the variant.
                        Runner::PyTorch(_) => Variant::DDP,
                    };
                    let job = Job {
                        variant,
                        model: c.model.clone(),
                        batch_per_rank: c.batch_per_rank,
                        warmup: cfg.warmup,
                        steps: cfg.steps,
                        out: scratch.join(format!("{}-{n}-{}.json", c.name, runner.name())),
                        mpi_progress: cfg.mpi_progress,
                        timeline: (cfg.timelines && matches!(runner, Runner::Ours(_))).then(|| {
                            scratch.join(format!(
                                "timeline-{}-{n}-{}-{repeat}",
                                c.name,
                                runner.name()
                            ))
                        }),
                        activation_checkpointing: ActivationCheckpointing::None,
                        backend: InnerBackend::Ndarray,
                        threads: None,
                        fused_activations: true,
                    };
                    if let Some(stem) = &job.timeline {
                        // A file left by an earlier run must not pass for this job's.
                        for rank in 0..n {
                            let _ = std::fs::remove_file(timeline_file(stem, rank));
                        }
                    }
                    let r = match (runner, &cfg.pytorch) {
                        (Runner::PyTorch(strategy), Some(python)) => {
                            run_peer(python, strategy, n, &job)?
                        }
                        _ => run_job(exe, n, &job, None, &[])?.expect("failures are errors here"),
                    };
                    if let Some(stem) = &job.timeline {
                        check_timelines(stem, n)?;
                    }
                    let step = median(&r.step_s) * 1e3;
                    let rss = r.peak_rss_bytes.iter().copied().max().unwrap_or(0);
                    let ledger = r.ledger_peak_bytes.iter().copied().max().unwrap_or(0);
                    log(&format!(
                        "config {} N={n} {:<14} step {step:>8.1} ms, peak RSS {} (ledger {})",
                        c.name.to_uppercase(),
                        runner.name(),
                        human_bytes(rss),
                        human_bytes(ledger)
                    ));
                    let cell = cells.entry((c.name, n, runner.name())).or_default();
                    cell.step_ms.push(step);
                    cell.rss.push(rss as f64);
                    cell.ledger.push(ledger as f64);
                    if let Some(hidden) = mean_of_ranks(&r.overlap) {
                        cell.overlap.push(hidden);
                    }
                    if let Some(waits) = mean_of_ranks(&r.wire_in_waits) {
                        cell.in_waits.push(waits);
                    }
                    cell.params = r.params;
                    cell.progress.extend(r.progress);
                }
            }
        }
    }
    let by_name = |c: &str, n: usize, name: &str, pick: &dyn Fn(&Cell) -> &Vec<f64>| {
        cells
            .get(&(c, n, name))
            .map_or(f64::NAN, |cell| median(pick(cell)))
    };
    let med = |c: &str, n: usize, v: Variant, pick: &dyn Fn(&Cell) -> &Vec<f64>| {
        by_name(c, n, v.name(), pick)
    };
    let step = |c, n, v| med(c, n, v, &|cell| &cell.step_ms);
    let rss = |c, n, v| med(c, n, v, &|cell| &cell.rss);
    let mut headline = serde_json::Map::new();
    for c in ["a", "b"] {
        for n in [2, 4] {
            headline.insert(
                format!("mpi_rtp_over_ddp_step_{c}_n{n}"),
                json!(step(c, n, Variant::RTP_OUT_OF_PLACE) / step(c, n, Variant::DDP)),
            );
        }
        for n in [2, 4] {
            headline.insert(
                format!("mpi_ddp_over_unbucketed_ddp_step_{c}_n{n}"),
                json!(step(c, n, Variant::DDP) / step(c, n, Variant::DDP_UNBUCKETED)),
            );
        }
        headline.insert(
            format!("mpi_rtp_over_fsdp_step_{c}_n4"),
            json!(step(c, 4, Variant::RTP_OUT_OF_PLACE) / step(c, 4, Variant::FSDP)),
        );
    }
    headline.insert(
        "mpi_rtp_over_ddp_rss_b_n4".into(),
        json!(rss("b", 4, Variant::RTP_OUT_OF_PLACE) / rss("b", 4, Variant::DDP)),
    );
    // DDP hides its all-reduces under the backward: the wire time its rank did not spend
    // waiting for them (its only waits are for the buckets at the step, and for the few
    // collectives of its own thread).
    headline.insert(
        "mpi_ddp_hidden_fraction_b_n4".into(),
        json!(1.0 - med("b", 4, Variant::DDP, &|cell| &cell.in_waits)),
    );
    // FSDP's prefetched gathers run on the worker while the layer before computes; what its
    // rank still waited for is the rest.
    headline.insert(
        "mpi_fsdp_hidden_fraction_b_n4".into(),
        json!(1.0 - med("b", 4, Variant::FSDP, &|cell| &cell.in_waits)),
    );
    headline.insert(
        "mpi_overlap_fraction_b_n4".into(),
        json!(med("b", 4, Variant::RTP_OUT_OF_PLACE, &|cell| &cell.overlap)),
    );

    if cfg.pytorch.is_some() {
        let steps = |c: &'static str, v: Variant, name: &str| {
            step(c, 4, v) / by_name(c, 4, name, &|cell| &cell.step_ms)
        };
        for (key, value) in [
            (
                "mpi_rtp_over_pytorch_ddp_step_a_n4",
                steps("a", Variant::RTP_OUT_OF_PLACE, "pytorch-ddp"),
            ),
            (
                "mpi_rtp_over_pytorch_ddp_step_b_n4",
                steps("b", Variant::RTP_OUT_OF_PLACE, "pytorch-ddp"),
            ),
            (
                "mpi_ddp_over_pytorch_ddp_step_a_n4",
                steps("a", Variant::DDP, "pytorch-ddp"),
            ),
            (
                "mpi_ddp_over_pytorch_ddp_step_b_n4",
                steps("b", Variant::DDP, "pytorch-ddp"),
            ),
            (
                "mpi_fsdp_over_pytorch_fsdp_step_b_n4",
                steps("b", Variant::FSDP, "pytorch-fsdp"),
            ),
            (
                "mpi_rtp_over_pytorch_fsdp_step_b_n4",
                steps("b", Variant::RTP_OUT_OF_PLACE, "pytorch-fsdp"),
            ),
            (
                "mpi_rtp_over_pytorch_ddp_rss_b_n4",
                rss("b", 4, Variant::RTP_OUT_OF_PLACE)
                    / by_name("b", 4, "pytorch-ddp", &|cell| &cell.rss),
            ),
        ] {
            headline.insert(key.into(), json!(value));
        }
    }

    // Capacity: the largest candidate that trains 3 steps under the per-process limit.
    let capacity_n = 4;
    let mut capacity = Vec::new();
    for variant in [Variant::DDP, Variant::RTP_OUT_OF_PLACE] {
        let fits = |model: &GptConfig| -> Result<Option<usize>, String> {
            let job = Job {
                variant,
                model: model.clone(),
                batch_per_rank: 1,
                warmup: 0,
                steps: 3,
                out: scratch.join(format!("capacity-{}.json", variant.name())),
                mpi_progress: cfg.mpi_progress,
                timeline: None,
                activation_checkpointing: ActivationCheckpointing::None,
                backend: InnerBackend::Ndarray,
                threads: None,
                fused_activations: true,
            };
            let r = run_job(exe, capacity_n, &job, Some(cfg.capacity_limit_bytes), &[])?;
            log(&format!(
                "capacity {:<7} d_model {:>5}, {} layer(s) under {} per process: {}",
                variant.name(),
                model.d_model,
                model.layers,
                human_bytes(cfg.capacity_limit_bytes),
                if r.is_some() { "trains" } else { "fails" }
            ));
            Ok(r.map(|r| r.params))
        };
        let c = &cfg.capacity_candidates;
        let (mut lo, mut hi, mut best) = (0usize, c.len(), None);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match fits(&c[mid])? {
                Some(params) => {
                    best = Some((c[mid].clone(), params));
                    lo = mid + 1;
                }
                None => hi = mid,
            }
        }
        let Some((model, params)) = best else {
            return Err(format!(
                "{}: not even the smallest candidate trains under {} per process",
                variant.name(),
                human_bytes(cfg.capacity_limit_bytes)
            )
            .into());
        };
        if fits(&c[0])?.is_none() {
            return Err(format!(
                "{}: the smallest candidate failed on a re-run: the limit, not the model, decides",
                variant.name()
            )
            .into());
        }
        capacity.push((variant, model, params));
    }
    headline.insert(
        "mpi_capacity_rtp_over_ddp_n4".into(),
        json!(capacity[1].2 as f64 / capacity[0].2 as f64),
    );

    let activations = activation_cells(cfg, exe, log)?;
    for (key, value) in activations.figures().as_object().expect("an object") {
        headline.insert(key.clone(), value.clone());
    }

    let planner_rows = planner_rows(&cfg.planner_grid, cfg.mpi_progress, exe, &scratch, log)?;
    let worst_rss = planner_rows
        .iter()
        .filter_map(|r| r["rel_error_rss"].as_f64())
        .map(f64::abs)
        .fold(0.0, f64::max);

    let mut details = Vec::new();
    for ((c, n, v), cell) in &cells {
        details.push(json!({
            "config": c, "ranks": n, "strategy": v, "params": cell.params,
            "step_ms": summary(&cell.step_ms),
            "peak_rss_bytes": summary(&cell.rss),
            "ledger_peak_bytes": summary(&cell.ledger),
            "overlap_fraction": if cell.overlap.is_empty() { Value::Null } else { summary(&cell.overlap) },
            "wire_in_waits_fraction": if cell.in_waits.is_empty() { Value::Null } else { summary(&cell.in_waits) },
            "mpi_progress": cell.progress,
        }));
    }
    headline.insert("planner_max_rel_error_rss".into(), json!(worst_rss));
    headline.insert(
        "planner_max_rel_error_rss_default_malloc".into(),
        json!(planner_rows
            .iter()
            .filter_map(|r| r["rel_error_rss_default_malloc"].as_f64())
            .map(f64::abs)
            .fold(0.0, f64::max)),
    );
    let mut report = Value::Object(headline);
    report["cells"] = json!(details);
    report["planner"] = json!(planner_rows);
    report["capacity"] = json!(capacity
        .iter()
        .map(|(v, m, p)| json!({"strategy": v.name(), "ranks": capacity_n, "d_model": m.d_model, "layers": m.layers, "params": p}))
        .collect::<Vec<_>>());
    report["capacity_limit_bytes_per_process"] = json!(cfg.capacity_limit_bytes);
    if let Some(python) = &cfg.pytorch {
        // What the peer's processes said they ran (torch version, backend, threads).
        let version: std::collections::BTreeSet<&String> = cells
            .iter()
            .filter(|((_, _, name), _)| name.starts_with("pytorch"))
            .flat_map(|(_, cell)| &cell.progress)
            .collect();
        report["pytorch"] = json!({
            "python": python,
            "script": "benches/peers/pytorch/gpt_peer.py",
            "version": version.into_iter().cloned().collect::<Vec<_>>().join("; "),
            "command": format!("scaling-report --transport mpi --pytorch {}", python.display()),
        });
    }
    report["activation_checkpointing"] = activations.cells();
    let most = cfg.ranks.iter().copied().max().unwrap_or(0);
    let cores = std::thread::available_parallelism().map_or(0, |p| p.get());
    // Each rank runs a compute thread and a communication thread.
    let sharing = if 2 * most > cores {
        "ranks share cores, so step times include time-slicing, and a message's copy (CPU work of the receiving process) can overlap compute only by taking turns with it on a core"
    } else {
        "a core for each rank's compute and communication threads, unless mpirun's binding (one core per process at -np 2) puts them on one"
    };
    report["machine_note"] = json!(format!(
        "up to {most} processes per job on {cores} cores: {sharing}; \
         RSS is each process's VmHWM; overlap uses the MPI transport's own timestamps of when received bytes were moving; \
         wire in waits is the share of that time during which the receiving rank was blocked on a transfer instead of working"
    ));
    std::fs::write(
        cfg.out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(
        cfg.out.join("report.md"),
        markdown(cfg, &report, &cells) + &activations.markdown(cfg),
    )?;
    plots(cfg, &cells, &capacity)?;
    Ok(report)
}

/// The activation section's heading in `report.md`.
pub const ACTIVATION_HEADING: &str = "## Activations: balanced activation checkpointing";

/// RTP on config A at N = 4 with and without balanced activation checkpointing: each
/// setting's jobs, the settings alternating.
pub struct Activations {
    /// The configuration measured.
    config: Config,
    ranks: usize,
    /// Per setting (`none`, `balanced`): step (ms), peak RSS and ledger peak (bytes) per job.
    cells: Vec<(ActivationCheckpointing, Cell)>,
}

/// Runs the activation section's jobs: config A's RTP (out-of-place) at N = 4, once per
/// repeat under each setting, alternating which goes first.
pub fn activation_cells(
    cfg: &MpiReportConfig,
    exe: &Path,
    log: &dyn Fn(&str),
) -> Result<Activations, Box<dyn std::error::Error>> {
    let scratch = cfg.out.join("jobs");
    std::fs::create_dir_all(&scratch)?;
    let config = cfg
        .configs
        .iter()
        .find(|c| c.name == "a")
        .ok_or("the MPI report has no config A")?
        .clone();
    let ranks = 4;
    let settings = [
        ActivationCheckpointing::None,
        ActivationCheckpointing::Balanced,
    ];
    let mut cells: Vec<(ActivationCheckpointing, Cell)> =
        settings.iter().map(|&ac| (ac, Cell::default())).collect();
    for repeat in 0..cfg.repeats {
        for k in 0..settings.len() {
            let i = if repeat % 2 == 0 {
                k
            } else {
                settings.len() - 1 - k
            };
            let ac = settings[i];
            let job = Job {
                variant: Variant::RTP_OUT_OF_PLACE,
                model: config.model.clone(),
                batch_per_rank: config.batch_per_rank,
                warmup: cfg.warmup,
                steps: cfg.steps,
                out: scratch.join(format!("activations-{ac}.json")),
                mpi_progress: cfg.mpi_progress,
                timeline: None,
                activation_checkpointing: ac,
                backend: InnerBackend::Ndarray,
                threads: None,
                fused_activations: true,
            };
            let r = run_job(exe, ranks, &job, None, &[])?.expect("failures are errors here");
            let step = median(&r.step_s) * 1e3;
            let rss = r.peak_rss_bytes.iter().copied().max().unwrap_or(0);
            let ledger = r.ledger_peak_bytes.iter().copied().max().unwrap_or(0);
            log(&format!(
                "activations: config A N={ranks} rtp-oop {ac:<8} step {step:>8.1} ms, peak RSS {} (ledger {})",
                human_bytes(rss),
                human_bytes(ledger)
            ));
            let cell = &mut cells[i].1;
            cell.step_ms.push(step);
            cell.rss.push(rss as f64);
            cell.ledger.push(ledger as f64);
            cell.params = r.params;
        }
    }
    Ok(Activations {
        config,
        ranks,
        cells,
    })
}

impl Activations {
    fn median_of(&self, ac: ActivationCheckpointing, pick: fn(&Cell) -> &Vec<f64>) -> f64 {
        self.cells
            .iter()
            .find(|(a, _)| *a == ac)
            .map_or(f64::NAN, |(_, c)| median(pick(c)))
    }

    fn ratio(&self, pick: fn(&Cell) -> &Vec<f64>) -> f64 {
        self.median_of(ActivationCheckpointing::Balanced, pick)
            / self.median_of(ActivationCheckpointing::None, pick)
    }

    /// The section's headline figures (checkpointed ÷ not, medians over jobs).
    pub fn figures(&self) -> Value {
        json!({
            "mpi_activation_checkpoint_rss_ratio_a_n4": self.ratio(|c| &c.rss),
            "mpi_activation_checkpoint_ledger_ratio_a_n4": self.ratio(|c| &c.ledger),
            "mpi_activation_checkpoint_step_ratio_a_n4": self.ratio(|c| &c.step_ms),
        })
    }

    /// Each setting's jobs, summarised, for `report.json`.
    pub fn cells(&self) -> Value {
        json!(self
            .cells
            .iter()
            .map(|(ac, c)| json!({
                "config": self.config.name, "ranks": self.ranks, "strategy": "rtp-oop",
                "activation_checkpointing": ac.to_string(), "params": c.params,
                "step_ms": summary(&c.step_ms),
                "peak_rss_bytes": summary(&c.rss),
                "ledger_peak_bytes": summary(&c.ledger),
            }))
            .collect::<Vec<_>>())
    }

    /// The section of `report.md`.
    pub fn markdown(&self, cfg: &MpiReportConfig) -> String {
        let m = &self.config.model;
        let mut md = format!(
            "\n{ACTIVATION_HEADING}\n\nRTP (out-of-place), d_model {}, {} layer(s), context {}, {} sequence(s) per rank, at N = {}: {} job(s) of `mpirun -np {}` per setting, the settings alternating; a job times {} step(s) after {} warm-up step(s). `balanced` trains on `Autodiff<Rtp<NdArray>, BalancedCheckpointing>`, which recomputes memory-bound ops in the backward pass. Peak RSS is each process's VmHWM (the largest of the job's processes), which also holds the program, Open MPI and the allocator's free lists: memory that checkpointing does not touch.\n\n| checkpointing | step (ms) median [min–max] | peak RSS / process | ledger peak |\n|---|---|---|---|\n",
            m.d_model, m.layers, m.seq, self.config.batch_per_rank, self.ranks, cfg.repeats, self.ranks, cfg.steps, cfg.warmup
        );
        for (ac, c) in &self.cells {
            let min = c.step_ms.iter().copied().fold(f64::INFINITY, f64::min);
            let max = c.step_ms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            md += &format!(
                "| {ac} | {:.1} [{min:.1}–{max:.1}] | {} | {} |\n",
                median(&c.step_ms),
                human_bytes(median(&c.rss) as u64),
                human_bytes(median(&c.ledger) as u64)
            );
        }
        md
    }
}

/// glibc's mmap threshold fixed at 128 KiB, its starting value. Fixed, every block of that size
/// or more (every tensor of the grid's models but the smallest) is mapped on its own and
/// unmapped when freed, so the resident set follows the bytes alive. By default glibc raises
/// the threshold after each freed mapping (up to 32 MiB) and serves later tensors from its
/// heap, which keeps freed blocks resident: the RSS then also holds memory the program no
/// longer uses, in amounts set by the order of frees, which no shape-based plan can know.
const FIXED_MMAP_THRESHOLD: (&str, &str) = ("MALLOC_MMAP_THRESHOLD_", "131072");

/// The memory planner, probed in this process at N = 1, against each grid point's RSS
/// growth under mpirun (rank 0's `VmHWM` minus its value just before the model was built),
/// each job's communication thread paced as `mpi_progress` asks.
pub fn planner_rows(
    grid: &[crate::planner_check::PlanPoint],
    mpi_progress: MpiProgress,
    exe: &Path,
    scratch: &Path,
    log: &dyn Fn(&str),
) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let mut planner_rows = Vec::new();
    for p in grid {
        let b = p.batch_per_rank;
        let plan_config = burn_rtp::PlanConfig::default().with_batch(b);
        let planner = burn_rtp_gpt::plan::probe_gpt::<NdArray>(&p.model, plan_config)?;
        // The planner plans the default DDP (with buckets); the unbucketed one is a baseline.
        for variant in STRATEGIES.into_iter().filter(|v| v.buckets) {
            let prediction = planner.predict(variant.strategy, variant.rotation, p.ranks, b);
            let predicted = prediction.total;
            let job = Job {
                variant,
                model: p.model.clone(),
                batch_per_rank: b,
                warmup: 0,
                steps: 3,
                out: scratch.join(format!("planner-{}.json", variant.name())),
                mpi_progress,
                timeline: None,
                activation_checkpointing: ActivationCheckpointing::None,
                backend: InnerBackend::Ndarray,
                threads: None,
                fused_activations: true,
            };
            // The same job under glibc's default allocator and with its mmap threshold fixed.
            let growth = |env: &[(&str, &str)]| -> Result<(u64, u64), String> {
                let r = run_job(exe, p.ranks, &job, None, env)?.expect("failures are errors here");
                let growth = r.peak_rss_bytes[0].saturating_sub(r.baseline_rss_bytes[0]);
                Ok((growth, r.ledger_peak_bytes[0]))
            };
            let (default_growth, _) = growth(&[])?;
            let (fixed_growth, ledger) = growth(&[FIXED_MMAP_THRESHOLD])?;
            let rel = |growth: u64| (predicted as f64 - growth as f64) / growth.max(1) as f64;
            log(&format!(
                "planner: d_model {} x {} layers, context {}, N = {} {:<7}: predicted {}, RSS growth {} ({:+.1}%; {} {:+.1}% with glibc's default mmap threshold), ledger {}",
                p.model.d_model,
                p.model.layers,
                p.model.seq,
                p.ranks,
                variant.name(),
                human_bytes(predicted),
                human_bytes(fixed_growth),
                rel(fixed_growth) * 100.0,
                human_bytes(default_growth),
                rel(default_growth) * 100.0,
                human_bytes(ledger)
            ));
            planner_rows.push(json!({
                "d_model": p.model.d_model, "layers": p.model.layers, "seq": p.model.seq,
                "ranks": p.ranks, "strategy": variant.name(), "predicted_total": predicted,
                "rss_growth": fixed_growth, "ledger_total": ledger, "rel_error_rss": rel(fixed_growth),
                "rss_growth_default_malloc": default_growth,
                "rel_error_rss_default_malloc": rel(default_growth),
            }));
        }
    }
    Ok(planner_rows)
}

fn markdown(
    cfg: &MpiReportConfig,
    report: &Value,
    cells: &std::collections::BTreeMap<(&str, usize, &str), Cell>,
) -> String {
    let mut md = String::from("# Scaling report: one MPI process per rank\n\n");
    md += &format!(
        "Each cell is {} job(s) of `mpirun -np N`, strategies alternating; a job times {} step(s) after {} warm-up step(s), barrier to barrier. Medians, with the spread (min–max) across jobs.\n\n",
        cfg.repeats, cfg.steps, cfg.warmup
    );
    // The targets are set for the configurations; say which models these figures
    // come from, so that a quick run's small models are not read as configurations A and B.
    for c in &cfg.configs {
        md += &format!(
            "* config {}: d_model {}, {} layer(s), {} heads, context {}, {} sequence(s) per rank\n",
            c.name.to_uppercase(),
            c.model.d_model,
            c.model.layers,
            c.model.heads,
            c.model.seq,
            c.batch_per_rank
        );
    }
    md += "\n";
    md += &crate::figures::targets_table(crate::figures::MPI, report);
    if let Some(peer) = report.get("pytorch") {
        md += &format!(
            "\nAgainst PyTorch ({}; `{}`), its DDP and FSDP2 on gloo run as the cells' `pytorch-ddp` and `pytorch-fsdp` jobs, alternating with ours, one process per rank, on the same models, batches and optimizer (Adam):\n\n",
            peer["version"].as_str().unwrap_or("?"),
            peer["command"].as_str().unwrap_or("?"),
        );
        md += &crate::figures::targets_table(crate::figures::MPI_PYTORCH, report);
    }
    md += &format!(
        "\nEach process's communication thread paces its tests of transfers in flight as `--mpi-progress {}` asks (spin: back to back while bytes are in flight; backoff: sleeps of up to 200 µs), and asks the kernel for a 100 µs scheduler slice, so that it gets a core as soon as it wakes (taken on Linux 6.12 and later). The last column shows what each cell's processes ran.\n",
        cfg.mpi_progress
    );
    md += "\n| config | N | strategy | params | step (ms) median [min–max] | peak RSS / process | ledger peak | overlap | wire in waits | MPI progress |\n|---|---|---|---|---|---|---|---|---|---|\n";
    for ((c, n, v), cell) in cells {
        let share = |x: &[f64]| {
            if x.is_empty() {
                "–".to_string()
            } else {
                format!("{:.2}", median(x))
            }
        };
        let span = |x: &[f64]| {
            let lo = x.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.1} [{lo:.1}–{hi:.1}]", median(x))
        };
        md += &format!(
            "| {} | {n} | {v} | {} | {} | {} | {} | {} | {} | {} |\n",
            c.to_uppercase(),
            cell.params,
            span(&cell.step_ms),
            human_bytes(median(&cell.rss) as u64),
            human_bytes(median(&cell.ledger) as u64),
            share(&cell.overlap),
            share(&cell.in_waits),
            cell.progress
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(" \\| ")
        );
    }
    md += &format!(
        "\nCapacity: the largest candidate model that trains 3 steps at N=4 with every process under `prlimit --as={}` ({}).\n\n",
        cfg.capacity_limit_bytes,
        human_bytes(cfg.capacity_limit_bytes)
    );
    for c in report["capacity"].as_array().into_iter().flatten() {
        md += &format!(
            "* {}: d_model {}, {} layer(s), {} parameters\n",
            c["strategy"].as_str().unwrap_or("?"),
            c["d_model"],
            c["layers"],
            c["params"]
        );
    }
    md += "\n## Memory planner against the resident set\n\nThe planner probes each model on one rank in-process (N = 1) and predicts rank 0's peak at N; each job trains 3 steps (FSDP prefetches from the third) and its rank 0 reports its peak resident set (`VmHWM`) minus what it was just before the model was built. Each job runs twice: with glibc's mmap threshold fixed at 128 KiB (`MALLOC_MMAP_THRESHOLD_=131072`), so that freed tensors leave the resident set, and with glibc's default, whose rising threshold keeps freed tensors resident in its heap.\n\n| d_model | layers | context | N | strategy | predicted peak | RSS growth | error | RSS growth, default malloc | error | ledger peak |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in report["planner"].as_array().into_iter().flatten() {
        let bytes = |k: &str| human_bytes(r[k].as_u64().unwrap_or(0));
        md += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:+.1}% | {} | {:+.1}% | {} |\n",
            r["d_model"],
            r["layers"],
            r["seq"],
            r["ranks"],
            r["strategy"].as_str().unwrap_or("?"),
            bytes("predicted_total"),
            bytes("rss_growth"),
            r["rel_error_rss"].as_f64().unwrap_or(f64::NAN) * 100.0,
            bytes("rss_growth_default_malloc"),
            r["rel_error_rss_default_malloc"]
                .as_f64()
                .unwrap_or(f64::NAN)
                * 100.0,
            bytes("ledger_total"),
        );
    }
    let timelines = if cfg.timelines {
        "\n* Each timed job's ranks wrote their timelines (compute, waits, and when received bytes were moving, in seconds from the first timed step): `jobs/timeline-<config>-<N>-<strategy>-<job>.rank<r>.json`."
    } else {
        ""
    };
    md += &format!(
        "\n## Notes\n\n* {}.\n* The ledger counts what the decorator holds; the RSS also holds the allocator's free lists, the inner backend's buffers, the MPI library and the program itself.{timelines}\n\nPlots: `mpi_step_time.svg`, `mpi_rss.svg`, `mpi_capacity.svg`.\n",
        report["machine_note"].as_str().unwrap_or("")
    );
    md
}

fn plots(
    cfg: &MpiReportConfig,
    cells: &std::collections::BTreeMap<(&str, usize, &str), Cell>,
    capacity: &[(Variant, GptConfig, usize)],
) -> Result<(), Box<dyn std::error::Error>> {
    let ranks = &cfg.ranks;
    let series = |metric: &dyn Fn(&Cell) -> f64, only: Option<&str>| {
        let mut out = Vec::new();
        for c in &cfg.configs {
            if only.is_some_and(|o| o != c.name) {
                continue;
            }
            for v in STRATEGIES {
                let pts = ranks
                    .iter()
                    .filter_map(|&n| {
                        cells
                            .get(&(c.name, n, v.name()))
                            .map(|cell| (n, metric(cell)))
                    })
                    .collect();
                out.push((format!("{} {}", c.name.to_uppercase(), v.name()), pts));
            }
        }
        out
    };
    crate::report::plot_lines(
        &cfg.out.join("mpi_step_time.svg"),
        "Step time, one MPI process per rank",
        "ms",
        ranks,
        &series(&|cell| median(&cell.step_ms), None),
    )?;
    crate::report::plot_lines(
        &cfg.out.join("mpi_rss.svg"),
        "Peak resident set per process (config B)",
        "MiB",
        ranks,
        &series(&|cell| median(&cell.rss) / (1024.0 * 1024.0), Some("b")),
    )?;
    crate::report::plot_bars(
        &cfg.out.join("mpi_capacity.svg"),
        "Largest model that trains under a per-process limit (N=4)",
        &capacity
            .iter()
            .map(|(v, _, p)| (v.name(), *p as f64 / 1e6))
            .collect::<Vec<_>>(),
    )
}

/// Checks that an MPI report has every headline figure ([`crate::figures::MPI`]) as a
/// finite number.
pub fn check_keys(report: &Value) -> Result<(), String> {
    crate::figures::check_keys(crate::figures::MPI, report)?;
    if report.get("pytorch").is_some() {
        crate::figures::check_keys(crate::figures::MPI_PYTORCH, report)?;
    }
    Ok(())
}
