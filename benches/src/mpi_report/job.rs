//! What one MPI job trains and measures, and the worker that runs it as one rank of
//! `mpirun` (`scaling-report worker job JSON`).

use crate::{InnerBackend, Variant};
use burn::backend::autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn_rtp::timeline::IntervalKind;
use burn_rtp::{ActivationCheckpointing, MpiProgress, RotationKernels, Rtp, RtpOptimizer};
use burn_rtp_gpt::data::{Corpus, Windows};
use burn_rtp_gpt::{Gpt, GptConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
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
