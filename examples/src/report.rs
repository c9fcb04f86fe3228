//! The JSON report of a run. Its keys are fixed: benches and tools read them.

use serde::{Deserialize, Serialize};

/// Peak bytes of one rank, split as the decorator's accounting splits them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct PeakBytes {
    /// Model state: parameters, gradients, optimizer state.
    pub sharded: u64,
    /// Activations and temporaries.
    pub local: u64,
    /// Rotation buffers and gathered units.
    pub in_flight: u64,
    /// Peak of the sum.
    pub total: u64,
}

impl From<burn_rtp::MemoryStats> for PeakBytes {
    fn from(m: burn_rtp::MemoryStats) -> Self {
        Self {
            sharded: m.sharded,
            local: m.local,
            in_flight: m.in_flight,
            total: m.total,
        }
    }
}

/// What `--report FILE` writes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// `single`, `ddp`, `fsdp` or `rtp`.
    pub strategy: String,
    /// Number of ranks.
    pub ranks: usize,
    /// Steps trained in this run.
    pub steps: usize,
    /// Parameters of the model.
    pub params: usize,
    /// Training tokens (bytes) per second over all ranks.
    pub tokens_per_s: f64,
    /// Median wall time of one training step.
    pub step_time_ms_median: f64,
    /// Mean training loss of the last step (nats per byte).
    pub final_train_loss: f64,
    /// Validation loss at the end (nats per byte).
    pub final_val_loss: f64,
    /// Mean training loss of every step.
    pub losses: Vec<f64>,
    /// Peak memory of each rank, as the decorator's ledger counts it.
    pub peak_bytes_per_rank: Vec<PeakBytes>,
    /// Peak resident set (the OS's `VmHWM`) of the process of each rank. In-process, every
    /// rank is a thread of one process, so each entry is that whole process's figure.
    pub peak_rss_bytes_per_rank: Vec<u64>,
    /// `in-process` (ranks are threads of one process) or `mpi` (one process per rank).
    pub transport: String,
    /// Under MPI, how each rank's communication thread paced its tests of transfers in
    /// flight, and why (empty in-process, where nothing is in flight).
    #[serde(default)]
    pub mpi_progress_per_rank: Vec<String>,
    /// Single-device model-state bytes (fp32 parameters, gradients, Adam moments) / ranks.
    pub ideal_model_state_bytes_per_rank: u64,
    /// `fused` (the `#[cube]` rotation kernels ran) or `generic` (compositions of Burn ops).
    pub kernels: String,
    /// The inner backend's name (`ndarray`, `flex`, ...).
    #[serde(default)]
    pub backend: String,
    /// Threads each rank computed with (the size of its compute pool).
    #[serde(default)]
    pub threads_per_rank: usize,
    /// `none` or `balanced`: whether the backward pass recomputed memory-bound activations.
    #[serde(default)]
    pub activation_checkpointing: String,
    /// Each rank's share of its transfer time that fell during its compute, over the last 20
    /// steps (never the first); `null` where nothing was received. On a GPU the intervals are
    /// host times around launches and syncs, not the device's own timestamps.
    #[serde(default)]
    pub hidden_transfer_fraction_per_rank: Vec<Option<f64>>,
}

/// The keys a report must have; tests and tools check against this list.
pub const REPORT_KEYS: [&str; 19] = [
    "strategy",
    "ranks",
    "steps",
    "params",
    "tokens_per_s",
    "step_time_ms_median",
    "final_train_loss",
    "final_val_loss",
    "losses",
    "peak_bytes_per_rank",
    "peak_rss_bytes_per_rank",
    "transport",
    "mpi_progress_per_rank",
    "ideal_model_state_bytes_per_rank",
    "kernels",
    "backend",
    "threads_per_rank",
    "activation_checkpointing",
    "hidden_transfer_fraction_per_rank",
];
