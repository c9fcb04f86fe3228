//! Measuring strategies side by side: a [`Driver`] keeps a world of ranks alive and runs
//! training steps on demand, so benchmarks time steps, not world start-up.
#![warn(missing_docs)]

pub mod backend_figures;
pub mod burn_ddp;
pub mod checkpointing;
pub mod decode;
pub mod figures;
pub mod mpi_backends;
pub mod mpi_report;
pub mod mpi_routing;
pub mod mpi_speed;
pub mod net_report;
pub mod peer_mlp;
pub mod planner_check;
pub mod plot;
pub mod report;
pub mod runner;
#[cfg(feature = "wgpu")]
pub mod wgpu_figures;
pub mod worker;

use burn::backend::autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn_rtp::timeline::Interval;
use burn_rtp::{
    ActivationCheckpointing, MemoryStats, RotationKernels, RotationMode, Rtp, RtpError,
    RtpOptimizer, Strategy,
};
use burn_rtp_gpt::data::{Corpus, Windows};
use burn_rtp_gpt::{Gpt, GptConfig};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Instant;

/// The training backend over the inner backend `I`, with checkpointing strategy `C`.
type Dist<I, C> = Autodiff<Rtp<I>, C>;

/// A strategy with the rotation mode it runs in: what the benchmarks compare (RTP comes in
/// two rotation modes; the baselines ignore the mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Variant {
    /// The placement strategy.
    pub strategy: Strategy,
    /// The rotation mode (RTP only).
    pub rotation: RotationMode,
    /// DDP only: whether gradients are all-reduced in buckets during the backward (the
    /// default), or each on its own after it (the DDP this project had before buckets).
    #[serde(default = "yes")]
    pub buckets: bool,
    /// RTP only: what moves for a sharded Linear, the weight shards or the activations.
    #[serde(default)]
    pub routing: burn_rtp::Routing,
}

fn yes() -> bool {
    true
}

impl Variant {
    /// Data parallelism, its gradients all-reduced in 25 MiB buckets during the backward.
    pub const DDP: Variant = Variant::of(Strategy::Ddp, RotationMode::OutOfPlace);
    /// Data parallelism without buckets: each gradient all-reduced on its own after the
    /// backward (the weaker baseline, kept to show what the buckets gain).
    pub const DDP_UNBUCKETED: Variant = Variant {
        buckets: false,
        ..Variant::DDP
    };
    /// ZeRO-3.
    pub const FSDP: Variant = Variant::of(Strategy::Fsdp, RotationMode::OutOfPlace);
    /// RTP, double-buffered.
    pub const RTP_OUT_OF_PLACE: Variant = Variant::of(Strategy::Rtp, RotationMode::OutOfPlace);
    /// RTP, single buffer.
    pub const RTP_IN_PLACE: Variant = Variant::of(Strategy::Rtp, RotationMode::InPlace);
    /// RTP with the activations routed to the weight shards' owners instead of the shards
    /// rotating (`Routing::Activations`).
    pub const RTP_ROUTED: Variant = Variant {
        routing: burn_rtp::Routing::Activations,
        ..Variant::RTP_OUT_OF_PLACE
    };
    /// RTP choosing per Linear and per pass whichever of the two moves fewer bytes
    /// (`Routing::Auto`).
    pub const RTP_AUTO: Variant = Variant {
        routing: burn_rtp::Routing::Auto,
        ..Variant::RTP_OUT_OF_PLACE
    };
    /// Every variant, baselines first.
    pub const ALL: [Variant; 4] = [
        Variant::DDP,
        Variant::FSDP,
        Variant::RTP_OUT_OF_PLACE,
        Variant::RTP_IN_PLACE,
    ];

    /// `strategy` in `rotation` (the baselines' mode is normalised, so equal runs compare
    /// equal).
    pub const fn of(strategy: Strategy, rotation: RotationMode) -> Self {
        let rotation = match strategy {
            Strategy::Rtp => rotation,
            _ => RotationMode::OutOfPlace,
        };
        Variant {
            strategy,
            rotation,
            buckets: true,
            routing: burn_rtp::Routing::Weights,
        }
    }

    /// The decorator's configuration of this variant on `ranks` ranks.
    pub fn config(self, ranks: usize) -> burn_rtp::RtpConfig {
        let config = burn_rtp::RtpConfig::new(ranks)
            .with_strategy(self.strategy)
            .with_rotation(self.rotation)
            .with_routing(self.routing);
        if self.buckets {
            config
        } else {
            config.with_ddp_bucket_bytes(0)
        }
    }

    /// Short name for tables and bench ids.
    pub fn name(self) -> &'static str {
        match (self.strategy, self.rotation) {
            (Strategy::Ddp, _) if !self.buckets => "ddp-unbucketed",
            (Strategy::Rtp, _) if self.routing == burn_rtp::Routing::Activations => "rtp-routed",
            (Strategy::Rtp, _) if self.routing == burn_rtp::Routing::Auto => "rtp-auto",
            (Strategy::Ddp, _) => "ddp",
            (Strategy::Fsdp, _) => "fsdp",
            (Strategy::Rtp, RotationMode::OutOfPlace) => "rtp-oop",
            (Strategy::Rtp, RotationMode::InPlace) => "rtp-ip",
        }
    }
}

/// The CPU inner backends the reports measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InnerBackend {
    /// burn-ndarray, with burn-rtp-kernels' native GEMM steps.
    #[default]
    Ndarray,
    /// Flex, Burn 0.21's pure-Rust CPU backend (the gemm crate).
    Flex,
}

impl InnerBackend {
    /// Both, NdArray first.
    pub const ALL: [InnerBackend; 2] = [InnerBackend::Ndarray, InnerBackend::Flex];

    /// Its name in tables and keys.
    pub fn name(self) -> &'static str {
        match self {
            InnerBackend::Ndarray => "ndarray",
            InnerBackend::Flex => "flex",
        }
    }
}

/// One benchmark case: a variant, a world size, a model and a global batch.
#[derive(Debug, Clone)]
pub struct Case {
    /// The strategy.
    pub variant: Variant,
    /// Ranks.
    pub ranks: usize,
    /// Model shape.
    pub model: GptConfig,
    /// Sequences per step over all ranks.
    pub batch: usize,
    /// Per-rank memory cap.
    pub memory_cap: Option<u64>,
    /// Parameters with fewer elements are replicated instead of sharded (`None`: the
    /// trainer's default).
    pub shard_threshold: Option<usize>,
    /// Whether autodiff recomputes memory-bound activations in the backward pass.
    pub activation_checkpointing: ActivationCheckpointing,
}

/// The two benchmark models.
pub mod models {
    use burn_rtp_gpt::GptConfig;

    /// A small model, where activations and overheads matter.
    pub fn small() -> GptConfig {
        GptConfig::new(32, 64, 2, 4)
    }

    /// Config A of the issues: d_model 256, 4 layers, 4 heads, context 64 (run with 8
    /// sequences per rank).
    pub fn config_a() -> GptConfig {
        GptConfig::new(64, 256, 4, 4)
    }

    /// A model whose state (parameters, gradients, Adam) dominates its activations: one wide
    /// block (3.4 M parameters, 54 MiB of fp32 state) on short sequences.
    pub fn state_dominated() -> GptConfig {
        GptConfig::new(16, 512, 1, 8)
    }
}

enum Cmd {
    Steps(usize),
    ResetPeak,
    Peak,
    Timeline(bool),
    Exchanges,
    State,
    Stop,
}

enum Reply {
    Ready(usize),
    Stepped(f64),
    Peak(usize, MemoryStats),
    Timeline(usize, Vec<Interval>),
    Exchanges(usize, u64),
    State(usize, u64),
    Ack,
}

/// A live world of ranks that trains on demand.
pub struct Driver {
    commands: Vec<Sender<Cmd>>,
    replies: Receiver<Reply>,
    world: Option<JoinHandle<Result<(), RtpError>>>,
    params: usize,
}

fn rank_loop<I: RotationKernels, C: CheckpointStrategy>(
    device: burn_rtp::RtpDevice<I>,
    case: &Case,
    corpus: &Corpus,
    commands: Receiver<Cmd>,
    replies: Sender<Reply>,
) {
    Dist::<I, C>::seed(&device, 7);
    let world = device.world_size();
    let per = case.batch / world;
    let rank = device.rank();
    let mut model: Gpt<Dist<I, C>> = case.model.init::<Dist<I, C>>(&device);
    let mut optim = RtpOptimizer::<
        burn::optim::adaptor::OptimizerAdaptor<burn_rtp::FusedAdam, Gpt<Dist<I, C>>, Dist<I, C>>,
    >::adam(&AdamConfig::new());
    let mut step = 0;
    let mut state_with_grads = 0;
    let _ = replies.send(Reply::Ready(model.num_params()));
    while let Ok(cmd) = commands.recv() {
        match cmd {
            Cmd::Steps(k) => {
                let t0 = Instant::now();
                for _ in 0..k {
                    let (x, y) = Windows::train(
                        corpus,
                        7,
                        step,
                        rank * per..(rank + 1) * per,
                        case.model.seq,
                    )
                    .tensors::<Dist<I, C>>(&device);
                    let loss = model.loss(x, y);
                    let mut grads = GradientsParams::from_grads(loss.backward(), &model);
                    // Synchronised here (the optimizer's own call is then a no-op) to read
                    // the model state with every gradient on its shard.
                    burn_rtp::sync_gradients::<Gpt<Dist<I, C>>, Dist<I, C>, I>(&model, &mut grads);
                    state_with_grads = device.memory_live().sharded;
                    model = optim.step(1e-3, model, grads);
                    step += 1;
                }
                // Steps end together: the slowest rank sets the step time.
                device.barrier();
                let _ = replies.send(Reply::Stepped(t0.elapsed().as_secs_f64()));
            }
            Cmd::ResetPeak => device.reset_memory_peak(),
            Cmd::Peak => {
                let _ = replies.send(Reply::Peak(rank, device.memory_peak()));
            }
            Cmd::Timeline(on) => {
                let intervals = device.take_timeline();
                device.record_timeline(on);
                let _ = replies.send(Reply::Timeline(rank, intervals));
            }
            Cmd::Exchanges => {
                let _ = replies.send(Reply::Exchanges(rank, device.exchanges()));
            }
            Cmd::State => {
                let _ = replies.send(Reply::State(rank, state_with_grads));
            }
            Cmd::Stop => break,
        }
        let _ = replies.send(Reply::Ack);
    }
}

impl Driver {
    /// Starts the world of `case` and builds its model on every rank (inner backend NdArray).
    pub fn start(case: Case) -> Result<Self, RtpError> {
        Self::start_on::<NdArray>(case)
    }

    /// [`Driver::start`] on the inner backend `I` (each rank on `I`'s default device).
    pub fn start_on<I: RotationKernels>(case: Case) -> Result<Self, RtpError> {
        let mut config = case.variant.config(case.ranks);
        if let Some(cap) = case.memory_cap {
            config = config.with_memory_cap(cap);
        }
        if let Some(elements) = case.shard_threshold {
            config = config.with_shard_threshold(elements);
        }
        let ranks = config.world_size;
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for _ in 0..ranks {
            let (tx, rx) = channel();
            senders.push(tx);
            receivers.push(Mutex::new(Some(rx)));
        }
        let (reply_tx, replies) = channel();
        let reply_tx = Mutex::new(reply_tx);
        let corpus = Corpus::load(None, case.model.seq).expect("the shipped corpus loads");
        let world = std::thread::spawn(move || {
            burn_rtp::launch(config, |device| {
                let rx = receivers[device.rank()]
                    .lock()
                    .unwrap()
                    .take()
                    .expect("one receiver per rank");
                let tx = reply_tx.lock().unwrap().clone();
                match case.activation_checkpointing {
                    ActivationCheckpointing::None => {
                        rank_loop::<I, NoCheckpointing>(device, &case, &corpus, rx, tx)
                    }
                    ActivationCheckpointing::Balanced => {
                        rank_loop::<I, BalancedCheckpointing>(device, &case, &corpus, rx, tx)
                    }
                }
            })
            .map(|_| ())
        });
        let mut driver = Self {
            commands: senders,
            replies,
            world: Some(world),
            params: 0,
        };
        // Each rank reports once its model is built.
        for _ in 0..ranks {
            match driver.replies.recv() {
                Ok(Reply::Ready(params)) => driver.params = params,
                _ => return Err(driver.failure()),
            }
        }
        Ok(driver)
    }

    /// Parameters of the model.
    pub fn params(&self) -> usize {
        self.params
    }

    fn failure(&mut self) -> RtpError {
        match self.world.take().map(|h| h.join()) {
            Some(Ok(Err(e))) => e,
            _ => RtpError::WorldEnded {
                reason: "the benchmark's next command".into(),
            },
        }
    }

    fn broadcast(&mut self, cmd: impl Fn() -> Cmd) -> Result<Vec<Reply>, RtpError> {
        let n = self.commands.len();
        for tx in &self.commands {
            if tx.send(cmd()).is_err() {
                return Err(self.failure());
            }
        }
        let mut out = Vec::with_capacity(n);
        let mut acks = 0;
        while acks < n {
            match self.replies.recv() {
                Ok(Reply::Ack) => acks += 1,
                Ok(reply) => out.push(reply),
                Err(_) => return Err(self.failure()),
            }
        }
        Ok(out)
    }

    /// Runs `k` training steps on every rank; returns the wall time of the slowest rank.
    pub fn steps(&mut self, k: usize) -> Result<f64, RtpError> {
        let replies = self.broadcast(|| Cmd::Steps(k))?;
        Ok(replies
            .iter()
            .filter_map(|r| match r {
                Reply::Stepped(s) => Some(*s),
                _ => None,
            })
            .fold(0.0, f64::max))
    }

    /// Starts a new peak window on every rank.
    pub fn reset_peaks(&mut self) -> Result<(), RtpError> {
        self.broadcast(|| Cmd::ResetPeak).map(|_| ())
    }

    /// Every rank's peak memory since the last reset, in rank order.
    pub fn peaks(&mut self) -> Result<Vec<MemoryStats>, RtpError> {
        let replies = self.broadcast(|| Cmd::Peak)?;
        Ok(in_rank_order(replies, |r| match r {
            Reply::Peak(rank, m) => Some((rank, m)),
            _ => None,
        }))
    }

    /// The largest peak of any rank since the last reset, category by category (each
    /// category's maximum over the ranks, and the largest total).
    pub fn worst_peak(&mut self) -> Result<MemoryStats, RtpError> {
        Ok(self
            .peaks()?
            .iter()
            .fold(MemoryStats::default(), |a, p| MemoryStats {
                sharded: a.sharded.max(p.sharded),
                local: a.local.max(p.local),
                in_flight: a.in_flight.max(p.in_flight),
                total: a.total.max(p.total),
            }))
    }

    /// Exchanges with other ranks (each one a synchronisation) per training step, counted
    /// over `k` steps on rank 0 (every rank makes the same ones).
    pub fn exchanges_per_step(&mut self, k: usize) -> Result<f64, RtpError> {
        let count = |d: &mut Self| -> Result<u64, RtpError> {
            let replies = d.broadcast(|| Cmd::Exchanges)?;
            Ok(in_rank_order(replies, |r| match r {
                Reply::Exchanges(rank, n) => Some((rank, n)),
                _ => None,
            })[0])
        };
        let before = count(self)?;
        self.steps(k)?;
        let after = count(self)?;
        Ok((after - before) as f64 / k as f64)
    }

    /// Rank 0's model-state bytes in its last step, with parameters, synchronised gradients
    /// and optimizer state all alive.
    pub fn model_state_with_gradients(&mut self) -> Result<u64, RtpError> {
        let replies = self.broadcast(|| Cmd::State)?;
        Ok(in_rank_order(replies, |r| match r {
            Reply::State(rank, b) => Some((rank, b)),
            _ => None,
        })[0])
    }

    /// Records the rotation timeline during `k` steps and returns each rank's intervals.
    pub fn timeline(&mut self, k: usize) -> Result<Vec<Vec<Interval>>, RtpError> {
        self.broadcast(|| Cmd::Timeline(true))?;
        self.steps(k)?;
        let replies = self.broadcast(|| Cmd::Timeline(false))?;
        Ok(in_rank_order(replies, |r| match r {
            Reply::Timeline(rank, v) => Some((rank, v)),
            _ => None,
        }))
    }
}

/// The per-rank values `pick` finds among `replies`, in rank order.
fn in_rank_order<T>(replies: Vec<Reply>, pick: impl Fn(Reply) -> Option<(usize, T)>) -> Vec<T> {
    let mut found: Vec<(usize, T)> = replies.into_iter().filter_map(pick).collect();
    found.sort_by_key(|(rank, _)| *rank);
    found.into_iter().map(|(_, v)| v).collect()
}

impl Drop for Driver {
    fn drop(&mut self) {
        for tx in &self.commands {
            let _ = tx.send(Cmd::Stop);
        }
        self.commands.clear();
        if let Some(h) = self.world.take() {
            let _ = h.join();
        }
    }
}

/// Median of a sample.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}
