//! `scaling-report --transport mpi`: every strategy runs as its own `mpirun -np N` job, one
//! rank per process, strategies alternating, and the figures come from those processes: step
//! times between barriers, the ledger's peak beside the OS's peak resident set (`VmHWM`), the
//! share of the time bytes were really moving (by the MPI transport's clock) that ran during
//! compute, and the largest model that trains under a real per-process address-space limit
//! (`prlimit --as`).

mod activations;
mod capacity;
mod cells;
mod headline;
mod job;
mod launch;
mod markdown;
mod planner;
mod plots;

pub use activations::{activation_cells, Activations, ACTIVATION_HEADING};
pub use job::{timeline_file, worker, Job, JobResult};
pub use launch::pytorch_peer_script;
pub(crate) use launch::{job_output, run_job, run_peer, worker_command, Runner};
pub use planner::planner_rows;

use crate::runner::{Failure, Report};
use crate::Variant;
use burn_rtp::MpiProgress;
use burn_rtp_gpt::GptConfig;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

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
    /// A job of `variant` on `config`'s model and batch, with this report's warm-up, timed
    /// steps and pacing, writing its result to `out`; on NdArray, with the host's threads,
    /// fused activations, no activation checkpointing and no timeline (a section that
    /// measures another setting changes that field).
    pub fn job(&self, config: &Config, variant: Variant, out: PathBuf) -> Job {
        Job {
            variant,
            model: config.model.clone(),
            batch_per_rank: config.batch_per_rank,
            warmup: self.warmup,
            steps: self.steps,
            out,
            mpi_progress: self.mpi_progress,
            timeline: None,
            activation_checkpointing: burn_rtp::ActivationCheckpointing::None,
            backend: crate::InnerBackend::Ndarray,
            threads: None,
            fused_activations: true,
        }
    }

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
pub(super) const STRATEGIES: [Variant; 4] = [
    Variant::DDP,
    Variant::FSDP,
    Variant::RTP_OUT_OF_PLACE,
    Variant::DDP_UNBUCKETED,
];

/// The MPI report as [`crate::runner::run`] drives it: its settings, and the binary that
/// `mpirun` starts as the workers (`scaling-report worker job`).
#[derive(Debug, Clone)]
pub struct MpiReport {
    /// What to measure.
    pub cfg: MpiReportConfig,
    /// The `scaling-report` binary.
    pub exe: PathBuf,
}

/// Everything the MPI report measured.
pub struct Measured {
    /// Each (config, N, runner) cell's jobs.
    cells: cells::Cells,
    /// DDP's and RTP's largest model under the limit, with its parameters.
    capacity: Vec<capacity::Largest>,
    /// The activation section.
    activations: Activations,
    /// The planner's predictions against the resident set.
    planner_rows: Vec<Value>,
}

impl Report for MpiReport {
    type Measured = Measured;

    fn out(&self) -> &Path {
        &self.cfg.out
    }

    fn measure(&self, log: &dyn Fn(&str)) -> Result<Measured, Failure> {
        let (cfg, exe) = (&self.cfg, self.exe.as_path());
        let scratch = cfg.out.join("jobs");
        std::fs::create_dir_all(&scratch)?;
        let cells = cells::measure(cfg, exe, &scratch, log)?;
        let capacity = capacity::capacity(cfg, exe, &scratch, log)?;
        let activations = activation_cells(cfg, exe, log)?;
        let planner_rows = planner_rows(&cfg.planner_grid, cfg.mpi_progress, exe, &scratch, log)?;
        Ok(Measured {
            cells,
            capacity,
            activations,
            planner_rows,
        })
    }

    fn headline(&self, measured: &Measured) -> Map<String, Value> {
        headline::headline(&self.cfg, measured)
    }

    fn details(&self, measured: &Measured) -> Result<Map<String, Value>, Failure> {
        Ok(headline::details(&self.cfg, measured))
    }

    fn markdown(&self, measured: &Measured, report: &Value) -> String {
        markdown::markdown(&self.cfg, report, &measured.cells)
            + &measured.activations.markdown(&self.cfg)
    }

    fn plots(&self, measured: &Measured) -> Result<Vec<&'static str>, Failure> {
        plots::plots(&self.cfg, &measured.cells, &measured.capacity)?;
        Ok(vec!["mpi_step_time.svg", "mpi_rss.svg", "mpi_capacity.svg"])
    }

    fn check_keys(&self, report: &Value) -> Result<(), String> {
        crate::figures::check_keys(crate::figures::MPI, report)?;
        if report.get("pytorch").is_some() {
            crate::figures::check_keys(crate::figures::MPI_PYTORCH, report)?;
        }
        Ok(())
    }
}
