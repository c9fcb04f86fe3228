//! Configuration of an RTP world.

use crate::error::{RtpError, RtpResult};
use std::time::Duration;

/// `FromStr` and `Display` for a configuration enum, from one table: each variant's name (what
/// `Display` writes), then the aliases it also parses from. An unknown name is an error that
/// lists the names.
macro_rules! named {
    ($ty:ty, $what:literal, { $($variant:ident => $name:literal $(| $alias:literal)*),+ $(,)? }) => {
        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name $(| $alias)* => Ok(Self::$variant),)+
                    other => Err(format!(
                        "unknown {} `{other}`: expected {}",
                        $what,
                        one_of(&[$($name),+])
                    )),
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self {
                    $(Self::$variant => $name,)+
                })
            }
        }
    };
}

/// "`a`, `b` or `c`".
fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.concat(),
    }
}

/// How weight shards travel around the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RotationMode {
    /// Double-buffered: the next shard is received while the current one computes.
    #[default]
    OutOfPlace,
    /// Single buffer: compute, then swap the buffer with the neighbours. Less memory, less overlap.
    InPlace,
}

named!(RotationMode, "rotation mode", {
    OutOfPlace => "out-of-place" | "outofplace" | "oop",
    InPlace => "in-place" | "inplace",
});

/// What moves between ranks when RTP computes with a sharded Linear weight.
///
/// Per rank and pass, for a Linear of `d_in x d_out` and `T` tokens per rank, rotating the
/// weights moves about `(N-1)/N * d_in * d_out` elements in `N - 1` exchanges; routing the
/// activations moves about `(N-1) * T * d_in + (N-1)/N * T * d_out` in two. Weights are right
/// where a rank's tokens outweigh its weights (large batches), activations where they do not
/// (small batches, fine-tuning, inference).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// The weight shards rotate around the ring while each rank computes on its own tokens.
    Weights,
    /// Each rank's activations go to every shard's owner, which computes that shard's columns
    /// for every rank and sends them back; no weight leaves its owner. The owner keeps the
    /// inputs it received until the backward, which computes dW from them: each input
    /// travels once per step (Linears fed the same input share it; an input that activation
    /// checkpointing released travels again), and an owner holds `N - 1` peers' inputs
    /// beside its own as activations (the memory planner adds them). Ranks may pass
    /// a Linear different numbers of rows (an uneven last batch): they agree their input
    /// shapes in one small all-gather per Linear input, which the backward reuses.
    Activations,
    /// Per Linear and per pass, whichever of the two sends fewer elements (the counts above
    /// for the forward, without `x` where the owners have it already; in the backward,
    /// rotation sends the weight once per gradient it computes, dX and dW, and routing sends
    /// `dy`'s columns, the dX partials back and `x` for dW unless the forward routed it),
    /// with a margin of 1.25 in rotation's favour (its transfers hide behind compute;
    /// routing's wait).
    /// Every rank decides on the mean of the rows the ranks agreed, so ranks with uneven
    /// batches take the same schedule. A forward may decide to rotate from the rows last
    /// agreed, for up to 32 forwards, without agreeing again (rotation is right whatever the
    /// rows, and an agreement synchronises every rank); a pass that routes agrees the shapes.
    /// The default: it rotates where the tokens outweigh the weights (training at large
    /// batches) and routes where they do not (small batches, fine-tuning, generation).
    #[default]
    Auto,
}

named!(Routing, "routing", {
    Weights => "weights" | "rotate",
    Activations => "activations" | "route",
    Auto => "auto",
});

/// Whether autodiff recomputes activations in the backward pass instead of keeping them:
/// the checkpointing strategy of `Autodiff<Rtp<B>, C>`, named for settings, plans and
/// reports (the type parameter is what applies it).
///
/// Burn's balanced strategy recomputes memory-bound ops (normalisation, activations,
/// reshapes, softmax) and keeps the outputs of compute-bound ones (matmuls, Linears), so a
/// rotated Linear never runs its forward twice. Its numbers are the same to the bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivationCheckpointing {
    /// `Autodiff<_, NoCheckpointing>` (Burn's default): every activation the backward pass
    /// reads is kept.
    #[default]
    None,
    /// `Autodiff<_, BalancedCheckpointing>`: memory-bound ops are recomputed.
    Balanced,
}

named!(ActivationCheckpointing, "activation checkpointing", {
    None => "none",
    Balanced => "balanced",
});

/// How the MPI transport's communication thread waits while bytes are in flight.
///
/// Over a transport that moves a large message only while both processes call MPI (Open MPI's
/// shared memory without single-copy support, TCP between hosts), a thread that sleeps between
/// tests moves a fragment per wake-up: measured at about 0.4-1 GB/s. Testing back to back cut
/// such a job's wire time about 5-fold here, but takes a core, which a machine with more ranks
/// than cores needs for compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MpiProgress {
    /// Spin where it pays: when the host has a core for each local rank's compute and
    /// communication threads, or once a large receive showed that the transport needs this
    /// process's calls to move bytes; back off otherwise.
    #[default]
    Auto,
    /// Test back to back (yielding the core between tests) while data is in flight.
    Spin,
    /// Sleep between tests, doubling the sleep up to 200 µs while nothing completes.
    Backoff,
}

named!(MpiProgress, "MPI progress policy", {
    Auto => "auto",
    Spin => "spin",
    Backoff => "backoff",
});

/// How parameters are placed and moved: RTP, or one of the two baselines it is measured against.
/// (Single-device training is `Ddp` on one rank: every parameter whole, nothing exchanged.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Rotated Tensor Parallelism: shards rotate through every Linear and Embedding.
    #[default]
    Rtp,
    /// ZeRO-3 / FSDP: shards are all-gathered into the full weight before use, and gradients
    /// are reduce-scattered.
    Fsdp,
    /// Data parallelism: every parameter is replicated and gradients are all-reduced.
    Ddp,
}

named!(Strategy, "strategy", {
    Rtp => "rtp",
    Fsdp => "fsdp" | "zero3",
    Ddp => "ddp",
});

/// Settings shared by every rank of a world.
#[derive(Debug, Clone)]
pub struct RtpConfig {
    /// Number of ranks.
    pub world_size: usize,
    /// Placement strategy.
    pub strategy: Strategy,
    /// Rotation variant.
    pub rotation: RotationMode,
    /// What moves for a sharded Linear under RTP: the weights or the activations.
    pub routing: Routing,
    /// Parameters with fewer elements than this stay replicated instead of sharded
    /// (default [`DEFAULT_SHARD_THRESHOLD`]; 0 shards every parameter).
    pub shard_threshold: usize,
    /// How long a rank waits for a silent peer before failing.
    pub peer_timeout: Duration,
    /// Whether ops without a shard-wise rule gather their operands (otherwise they fail).
    pub gather_fallback: bool,
    /// Per-rank memory cap enforced by the accounting (`None`: unlimited).
    pub memory_cap: Option<u64>,
    /// Whether a rank copies each received shard into its own buffer before using it.
    /// `None` decides by backend: asynchronous backends (wgpu, CUDA) copy, because their
    /// ranks run on separate streams; NdArray hands tensors over without a copy.
    pub copy_on_receive: Option<bool>,
    /// Seeded random delays and yields injected into the in-process transport, for stress
    /// tests that look for races (`None`: off, the default).
    pub chaos: Option<Chaos>,
    /// How the in-process transport delivers: rendezvous (default) or buffered.
    pub delivery: Delivery,
    /// In-process threads, MPI processes or NCCL (`None`: [`TransportKind::from_environment`]).
    pub transport: Option<TransportKind>,
    /// How the MPI transport's communication thread waits while bytes are in flight.
    pub mpi_progress: MpiProgress,
    /// Under MPI, whether to ask glibc for one malloc arena for the whole process (default
    /// on; see [`RtpConfig::with_one_malloc_arena`]).
    pub one_malloc_arena: bool,
    /// Under MPI, whether to ask glibc to keep freed tensors' pages for reuse (default on; see
    /// [`RtpConfig::with_keep_freed_pages`]).
    pub keep_freed_pages: bool,
    /// Whether GELU and its backward run burn-rtp-kernels' one-pass steps where the inner
    /// backend has them (default on; see [`RtpConfig::with_fused_activations`]).
    pub fused_activations: bool,
    /// Whether [`FusedAdam`](crate::FusedAdam) updates each parameter in one pass where the
    /// inner backend has the kernel (default on; see [`RtpConfig::with_fused_optimizer`]).
    pub fused_optimizer: bool,
    /// Under DDP, the gradient bucket size in bytes (default [`DEFAULT_DDP_BUCKET_BYTES`];
    /// 0: each gradient is all-reduced on its own after the backward; see
    /// [`RtpConfig::with_ddp_bucket_bytes`]).
    pub ddp_bucket_bytes: usize,
    /// Threads each rank computes with: the size of the rayon pool its program runs in
    /// (`None`: the host's cores divided by the ranks on it, at least one; see
    /// [`RtpConfig::threads_per_rank_here`]).
    pub threads_per_rank: Option<usize>,
}

/// How the ranks of a world talk to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// Every rank is a thread of this process (the default outside `mpirun`).
    InProcess,
    /// One rank per process under `mpirun`, on Open MPI (cargo feature `mpi`).
    Mpi,
    /// One rank per process and GPU under `mpirun`: tensors move GPU to GPU over NCCL,
    /// control messages over MPI (cargo feature `nccl`, inner backend `Cuda`). Never chosen
    /// by the environment: ask for it.
    Nccl,
}

named!(TransportKind, "transport", {
    InProcess => "in-process" | "inprocess",
    Mpi => "mpi",
    Nccl => "nccl",
});

impl TransportKind {
    /// What the environment asks for: MPI when `mpirun` started this process, else in-process.
    pub fn from_environment() -> Self {
        if mpi_launch().is_some() {
            Self::Mpi
        } else {
            Self::InProcess
        }
    }
}

/// How the in-process transport completes a send.
///
/// Rendezvous is the default because it bounds what a rank holds whatever the timing: with
/// buffered sends a rank that runs ahead of its right-hand neighbour keeps every bundle it sent
/// alive until the neighbour takes it, so its in-flight memory grew with the scheduling (up to
/// 7.6 MiB over the planner's prediction at d_model 768, N = 8, in the scaling report), and a
/// run's peak was not reproducible. With rendezvous sends the ledger's peak equalled the
/// planner's prediction in every run, at the same speed (config A and the small bench model,
/// N = 4 and 8, within this machine's noise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// A send completes only once the receiver has taken the message, like MPI's rendezvous
    /// protocol or NCCL (the default): a call site that relied on buffering deadlocks (and
    /// times out) here.
    #[default]
    Rendezvous,
    /// A send completes at once; messages queue without limit, and stay charged to their
    /// sender until taken.
    Buffered,
}

/// Seeded perturbation of the in-process transport: before and after every send, receive
/// and hand-over, a rank may yield or sleep. The same seed draws the same perturbations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chaos {
    /// Seed of the per-rank generators (rank `r` uses a stream derived from `seed` and `r`).
    pub seed: u64,
    /// Longest injected sleep.
    pub max_delay: Duration,
}

impl Chaos {
    /// Perturbations drawn from `seed`, with sleeps of up to 200 µs.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            max_delay: Duration::from_micros(200),
        }
    }
}

/// Parameters with fewer elements than this are replicated by default: none, so every
/// parameter is sharded.
///
/// The scaling report's sweep (`benches/report/report.md`, "Replicating small layers", N=4,
/// strategies alternating) measured 0 as the fastest threshold on both models it sweeps, and
/// a replicated layer costs N times its state, which is what a user of RTP wants to avoid.
/// Raise it with [`RtpConfig::with_shard_threshold`] where a model's many small layers make
/// neighbour synchronisations cost more than their replicated state.
pub const DEFAULT_SHARD_THRESHOLD: usize = 0;

/// DDP's default gradient bucket: 25 MiB, PyTorch DDP's `bucket_cap_mb`.
pub const DEFAULT_DDP_BUCKET_BYTES: usize = 25 << 20;

impl RtpConfig {
    /// A world of `world_size` ranks with the default settings.
    pub fn new(world_size: usize) -> Self {
        Self {
            world_size,
            strategy: Strategy::Rtp,
            rotation: RotationMode::OutOfPlace,
            routing: Routing::Auto,
            shard_threshold: DEFAULT_SHARD_THRESHOLD,
            peer_timeout: Duration::from_secs(120),
            gather_fallback: true,
            memory_cap: None,
            copy_on_receive: None,
            chaos: None,
            delivery: Delivery::Rendezvous,
            transport: None,
            mpi_progress: MpiProgress::Auto,
            one_malloc_arena: true,
            keep_freed_pages: true,
            fused_activations: true,
            fused_optimizer: true,
            ddp_bucket_bytes: DEFAULT_DDP_BUCKET_BYTES,
            threads_per_rank: None,
        }
    }

    /// Sets the threads each rank computes with. Each rank's program runs in a rayon pool of
    /// this size, which the inner backend's parallel kernels use (Flex's GEMMs and element-wise
    /// ops, burn-ndarray's parallel iterators); by default the ranks on a host share its cores
    /// evenly, so N ranks never oversubscribe them.
    pub fn with_threads_per_rank(mut self, threads: usize) -> Self {
        self.threads_per_rank = Some(threads.max(1));
        self
    }

    /// The threads each rank of this process computes with: the chosen count, or the host's
    /// cores divided by the ranks on this host (the world in-process; under `mpirun`, the
    /// launcher's local size), at least one.
    pub fn threads_per_rank_here(&self) -> usize {
        if let Some(threads) = self.threads_per_rank {
            return threads;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let ranks_here = match self.transport_kind() {
            TransportKind::InProcess => self.world_size,
            _ => mpi_launch().map_or(self.world_size, |l| l.local_size),
        };
        (cores / ranks_here.max(1)).max(1)
    }

    /// Chooses the transport instead of letting the environment decide.
    pub fn with_transport(mut self, transport: TransportKind) -> Self {
        self.transport = Some(transport);
        self
    }

    /// The transport `launch` uses: the chosen one, or what the environment asks for.
    pub fn transport_kind(&self) -> TransportKind {
        self.transport
            .unwrap_or_else(TransportKind::from_environment)
    }

    /// The settings every rank must share, by name, as the start-up agreement compares them.
    pub(crate) fn shared_settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("world size", self.world_size.to_string()),
            ("strategy", self.strategy.to_string()),
            ("rotation mode", self.rotation.to_string()),
            ("routing", self.routing.to_string()),
            ("shard threshold", self.shard_threshold.to_string()),
            ("gather fallback", self.gather_fallback.to_string()),
            ("ddp bucket bytes", self.ddp_bucket_bytes.to_string()),
        ]
    }

    /// Injects seeded delays and yields into the in-process transport (stress tests).
    pub fn with_chaos(mut self, chaos: Chaos) -> Self {
        self.chaos = Some(chaos);
        self
    }

    /// Sets how the in-process transport delivers messages.
    pub fn with_delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// Sets the placement strategy.
    pub fn with_strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Sets the rotation variant.
    pub fn with_rotation(mut self, rotation: RotationMode) -> Self {
        self.rotation = rotation;
        self
    }

    /// Sets what moves for a sharded Linear under RTP (see [`Routing`]).
    pub fn with_routing(mut self, routing: Routing) -> Self {
        self.routing = routing;
        self
    }

    /// Under DDP, sets the gradient bucket size in bytes: gradients join a bucket in the order
    /// the backward produces them, and a full bucket is all-reduced on the rank's background
    /// worker while the rest of the backward computes (PyTorch DDP's buckets). The optimizer
    /// step starts the last, partial bucket and waits for all of them. Each rank then holds
    /// the summed copy of a bucketed gradient beside the gradient itself until the step, as
    /// PyTorch's DDP holds its bucket buffers. 0 turns buckets off: each gradient is
    /// all-reduced on its own in the optimizer step, after the backward.
    pub fn with_ddp_bucket_bytes(mut self, bytes: usize) -> Self {
        self.ddp_bucket_bytes = bytes;
        self
    }

    /// Sets the element count below which parameters stay replicated.
    pub fn with_shard_threshold(mut self, elements: usize) -> Self {
        self.shard_threshold = elements;
        self
    }

    /// Sets how the MPI transport's communication thread waits while bytes are in flight.
    pub fn with_mpi_progress(mut self, progress: MpiProgress) -> Self {
        self.mpi_progress = progress;
        self
    }

    /// Under MPI, whether the transport asks glibc for one malloc arena for the whole process
    /// (`mallopt(M_ARENA_MAX, 1)`, before its communication thread starts; default on).
    ///
    /// This changes the allocator of the application that embeds burn-rtp, every thread of
    /// it, for the life of the process. It pays for RTP: the communication thread allocates
    /// every received buffer and the rank's thread frees it, and with an arena per thread
    /// glibc trims the communication thread's arena and faults the next buffer in again. In
    /// the MPI report's side-by-side runs (4 processes on 2 cores) one arena made RTP's step
    /// 5% faster at config A and 10% at B, N = 4, with DDP's step and every resident set
    /// within their spread. Turn it off where the application manages its allocator itself;
    /// a `MALLOC_ARENA_MAX` in the environment always wins, and other C libraries are left
    /// alone. In-process worlds never touch the allocator.
    pub fn with_one_malloc_arena(mut self, on: bool) -> Self {
        self.one_malloc_arena = on;
        self
    }

    /// Under MPI, whether the transport asks glibc to keep freed tensors' pages for reuse
    /// (`mallopt`'s mmap threshold at 32 MiB and trim threshold at 1 GiB, before its
    /// communication thread starts; default on).
    ///
    /// Like [`RtpConfig::with_one_malloc_arena`], this changes the allocator of the whole
    /// process for its life. It pays because glibc's defaults hand large freed blocks back to
    /// the kernel, so each step faults its tensors' pages in again: on config A, one process
    /// and one thread, about 3,000-4,000 minor page faults per step fell to about 100 and the
    /// step by 2-4% (the MPI report's speed section has the faults per step). The resident set
    /// then stays near its peak between steps; the peak is unchanged. Tensors over 32 MiB
    /// still get mappings of their own. Thresholds set in the environment
    /// (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `GLIBC_TUNABLES`) always win.
    pub fn with_keep_freed_pages(mut self, on: bool) -> Self {
        self.keep_freed_pages = on;
        self
    }

    /// Whether GELU and its backward run burn-rtp-kernels' one-pass steps (default on), or
    /// the inner backend's own ops.
    ///
    /// On NdArray, Burn's GELU is a chain of whole-tensor ops around f64 `erf` and `tanh`; the
    /// one-pass steps compute the same function, each element within one ulp of the
    /// transcendental and almost always bit for bit (`burn-rtp-kernels`' `kernel/gelu` states
    /// the bound). Other backends run their own ops either way. Turn it off to measure what
    /// it buys, or to train bit-identically to single-device NdArray.
    pub fn with_fused_activations(mut self, on: bool) -> Self {
        self.fused_activations = on;
        self
    }

    /// Whether [`FusedAdam`](crate::FusedAdam) (`RtpOptimizer::adam`) updates each parameter
    /// in one pass where the inner backend has the kernel (NdArray), bit for bit as Burn's
    /// Adam (default on), or runs Burn's Adam. Optimizers made with `RtpOptimizer::new` are
    /// not affected.
    pub fn with_fused_optimizer(mut self, on: bool) -> Self {
        self.fused_optimizer = on;
        self
    }

    /// Sets how long a rank waits for a silent peer.
    pub fn with_peer_timeout(mut self, timeout: Duration) -> Self {
        self.peer_timeout = timeout;
        self
    }

    /// Caps the bytes each rank may hold; going over fails like a device allocation would.
    pub fn with_memory_cap(mut self, bytes: u64) -> Self {
        self.memory_cap = Some(bytes);
        self
    }

    /// Forces copying received shards on (`true`) or off (`false`) instead of deciding by backend.
    pub fn with_copy_on_receive(mut self, copy: bool) -> Self {
        self.copy_on_receive = Some(copy);
        self
    }

    /// Enables or disables the gather fallback for ops without a shard-wise rule.
    pub fn with_gather_fallback(mut self, enabled: bool) -> Self {
        self.gather_fallback = enabled;
        self
    }
}

/// Validates a rank index against a world size.
pub fn check_rank(rank: usize, world_size: usize) -> RtpResult<()> {
    if world_size == 0 {
        Err(RtpError::EmptyWorld)
    } else if rank >= world_size {
        Err(RtpError::RankOutOfRange { rank, world_size })
    } else {
        Ok(())
    }
}

/// This process's place in a job that `mpirun` (or another PMI launcher) started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpiLaunch {
    /// This process's rank.
    pub rank: usize,
    /// Processes in the job.
    pub size: usize,
    /// Processes of the job on this host (the whole job where the launcher does not say).
    pub local_size: usize,
}

/// Reads the launcher's environment: Open MPI's `OMPI_COMM_WORLD_SIZE` / `OMPI_COMM_WORLD_RANK`,
/// the `PMI_SIZE` / `PMI_RANK` of MPICH-style launchers, or, under Slurm's `srun --mpi=pmix`,
/// `SLURM_STEP_NUM_TASKS` / `PMIX_RANK` (with `OMPI_COMM_WORLD_LOCAL_SIZE`, MPICH's
/// `MPI_LOCALNRANKS` or Slurm's `SLURM_STEP_TASKS_PER_NODE` for the processes on this host).
/// `None` outside such a job.
pub fn mpi_launch() -> Option<MpiLaunch> {
    launch_from(|name| std::env::var(name).ok())
}

/// [`mpi_launch`] over any source of variables (tests give it a map).
fn launch_from(var: impl Fn(&str) -> Option<String>) -> Option<MpiLaunch> {
    let read = |name: &str| var(name)?.trim().parse::<usize>().ok();
    let pair = |size: &str, rank: &str| Some((read(size)?, read(rank)?));
    let (size, rank) = pair("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
        .or_else(|| pair("PMI_SIZE", "PMI_RANK"))
        .or_else(|| pair("SLURM_STEP_NUM_TASKS", "PMIX_RANK"))?;
    // Slurm writes tasks per node as `2(x3),1`: this host's count is the largest, as an upper
    // bound (pacing only needs to know whether ranks share the host's cores).
    let slurm_local = || {
        var("SLURM_STEP_TASKS_PER_NODE")?
            .split(',')
            .filter_map(|part| part.split('(').next()?.trim().parse::<usize>().ok())
            .max()
    };
    let local_size = read("OMPI_COMM_WORLD_LOCAL_SIZE")
        .or_else(|| read("MPI_LOCALNRANKS"))
        .or_else(slurm_local)
        .unwrap_or(size);
    Some(MpiLaunch {
        rank,
        size,
        local_size,
    })
}

#[cfg(test)]
mod tests;
