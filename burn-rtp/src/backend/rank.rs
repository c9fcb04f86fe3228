//! The op-level state of one rank, around its communication context and its strategy: what
//! the backend's ops decide and remember (Linear pairing, parameter streams, gather fallbacks,
//! shard IO) and the device id Burn knows the rank by.

use crate::backend::gathers::GatherFallback;
use crate::backend::pairing::LinearRecords;
use crate::backend::strategy::{for_rank, Param, RankStrategy, Rules};
use crate::comm::context::Comm;
use crate::comm::transport::Transport;
use crate::config::RtpConfig;
use crate::error::{raise, RtpError, RtpResult};
use crate::state::accounting::{Charge, Float, Held};
use crate::state::sharding::Layout;
use burn::tensor::backend::Backend;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The state every op of one rank reads: its communication context, its strategy and the
/// ops' own records. What differs by strategy lives in `strategy`, nowhere else here.
pub struct RankCtx<B: Backend> {
    /// Identity, transport, counters and accounting: all the communication layers see.
    /// Shared with the jobs the strategy runs on the background worker.
    pub(crate) comm: Arc<Comm<B>>,
    /// DDP, FSDP or RTP: what the rank starts ahead of need, and the rules of its ops.
    pub(crate) strategy: Box<dyn RankStrategy<B>>,
    /// Parameter creation: whether it is under way, the random streams and the seed.
    params: ParamStreams,
    /// Linear forwards awaiting their backward, and gradients computed ahead.
    pub(crate) linear: LinearRecords<B>,
    /// Ops that had no shard-wise rule, and the gathered copies kept for them.
    pub(crate) fallback: GatherFallback<B>,
    pub(crate) shard_io: crate::state::shard_io::ShardIoByThread,
    pub(crate) index_id: u16,
}

/// Parameter creation's state: every rank creates the same parameters in the same order, so
/// equal counters give every rank the same random streams.
#[derive(Default)]
struct ParamStreams {
    /// Nesting depth of `memory_persistent_allocations` (parameters are being created).
    persistent: AtomicUsize,
    /// The next parameter's stream.
    stream: AtomicU64,
    seed: AtomicU64,
}

impl<B: Backend> std::fmt::Debug for RankCtx<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.comm.fmt(f)
    }
}

impl<B: Backend> RankCtx<B> {
    /// The rules of this rank's strategy.
    pub(crate) fn rules(&self) -> &'static dyn Rules {
        self.strategy.rules()
    }

    /// Where a parameter (or its gradient) of logical `shape` lives: its split, or `None` when
    /// it is replicated. Creation and every gradient-producing op ask this one function, so a
    /// gradient always has the layout of its parameter.
    pub(crate) fn param_spec(
        &self,
        shape: &burn::tensor::Shape,
    ) -> Option<crate::state::sharding::ShardSpec> {
        let threshold = self.comm.config.shard_threshold;
        self.rules()
            .placement(shape, self.comm.world_size, threshold)
    }

    /// Records a Linear forward (see `backend::pairing`).
    pub(crate) fn record_forward(&self, forward: crate::backend::pairing::Forward<B>) {
        self.linear.record_forward(forward);
    }

    /// Lets the forward records go of inputs nothing else holds any more, so that a Linear's
    /// input autodiff dropped (activation checkpointing) is freed when the next tensor is
    /// made, not at the next Linear. Skipped while this rank is inside a pairing call.
    pub(crate) fn release_inputs(&self) {
        self.linear.release_inputs();
    }

    /// Whether parameters are being created right now (inside `memory_persistent_allocations`).
    pub(crate) fn persistent(&self) -> bool {
        self.params.persistent.load(Ordering::Acquire) > 0
    }

    pub(crate) fn enter_persistent(&self) -> PersistentGuard<'_> {
        self.params.persistent.fetch_add(1, Ordering::AcqRel);
        PersistentGuard(&self.params.persistent)
    }

    /// A new random stream for the next parameter; the same on every rank.
    pub(crate) fn next_param_stream(&self) -> u64 {
        self.params.stream.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn seed(&self) -> u64 {
        self.params.seed.load(Ordering::Relaxed)
    }

    pub(crate) fn set_seed(&self, seed: u64) {
        self.params.seed.store(seed, Ordering::Relaxed);
        self.params.stream.store(0, Ordering::Relaxed);
    }

    /// Records that `op` had to gather a sharded operand; logs the first time per op.
    pub(crate) fn note_fallback(&self, op: &str, shapes: &[Vec<usize>]) {
        if !self.comm.config.gather_fallback {
            raise(RtpError::NoShardRule {
                rank: self.comm.rank,
                op: op.to_string(),
                shapes: shapes.to_vec(),
            });
        }
        if self.fallback.count(op) == 1 && self.comm.rank == 0 {
            tracing::info!(
                op,
                ?shapes,
                "rtp: op has no shard-wise rule; gathering its sharded operands"
            );
        }
    }

    pub(crate) fn fallback_counts(&self) -> BTreeMap<String, u64> {
        self.fallback.counts()
    }

    /// Hands the gradient of a replicated weight (identified by `charge`) to the strategy,
    /// as the backward makes it (DDP's buckets sum it ahead of the step).
    pub(crate) fn on_gradient(&self, charge: &Arc<Charge>, grad: &Float<B>) {
        self.strategy.on_gradient(&self.comm, charge, grad);
    }

    /// The reduced sum of the gradient identified by `charge`, if the strategy computed it
    /// ahead (a DDP bucket).
    pub(crate) fn claim_reduced(&self, charge: &Arc<Charge>) -> Option<Float<B>> {
        self.strategy.claim_reduced(&self.comm, charge)
    }

    /// The backward is over: the strategy starts what it held back (DDP's last bucket).
    pub(crate) fn before_sync(&self) {
        self.strategy.before_sync(&self.comm);
    }

    /// The gradients are synchronised: the strategy drops what nobody claimed.
    pub(crate) fn after_sync(&self) {
        self.strategy.after_sync(&self.comm);
    }

    /// Whether the strategy wants the module's parameters before each step (FSDP's prefetch);
    /// callers skip collecting them otherwise.
    pub(crate) fn wants_params(&self) -> bool {
        self.strategy.wants_params()
    }

    /// Registers the parameters of the next step in the module's order.
    pub(crate) fn register_params(&self, params: Vec<Param<B>>) {
        self.strategy.register_params(params);
    }

    /// Lets go of the registered parameters before the optimizer replaces them.
    pub(crate) fn release_params(&self) {
        self.strategy.release_params();
    }

    /// Whether `pass` of a sharded Linear routes activations to the shards' owners (see
    /// `backend::ops::routed`) instead of rotating the shards.
    pub(crate) fn routes_activations(&self, pass: &crate::backend::strategy::LinearPass) -> bool {
        self.strategy.routes_activations(pass)
    }

    /// Whether some Linear pass may route its activations on this rank.
    pub(crate) fn may_route(&self) -> bool {
        self.strategy.may_route()
    }

    /// What the strategy started ahead of need and what was taken, `(started, taken)`, if
    /// this rank runs `strategy`; else none.
    pub(crate) fn ahead_of(&self, strategy: crate::config::Strategy) -> (u64, u64) {
        if self.comm.config.strategy == strategy {
            self.strategy.ahead()
        } else {
            (0, 0)
        }
    }

    /// The whole of a sharded parameter for a module op that gathers it (FSDP).
    pub(crate) fn gather_param(
        &self,
        charge: &Arc<Charge>,
        inner: &Float<B>,
        layout: &Layout,
        op: &'static str,
    ) -> Held<B> {
        self.strategy
            .gather_param(&self.comm, charge, inner, layout, op)
    }
}

/// Leaves persistent mode when dropped.
pub(crate) struct PersistentGuard<'a>(&'a AtomicUsize);

impl Drop for PersistentGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The live ranks of this process, by the device id Burn knows them by.
///
/// Burn's `DeviceId` has 16 bits for the index, so ids are slots that a rank frees when its
/// last handle drops: ranks alive at the same time never share an id, and a process may
/// create any number of worlds one after another.
#[derive(Default)]
struct Registry {
    slots: Vec<Option<Box<dyn Any + Send + Sync>>>,
    free: Vec<u16>,
}

/// Device ids available: the whole `u16` range.
const MAX_LIVE_RANKS: usize = u16::MAX as usize + 1;

impl Registry {
    fn insert(&mut self, entry: Box<dyn Any + Send + Sync>) -> RtpResult<u16> {
        if let Some(id) = self.free.pop() {
            self.slots[id as usize] = Some(entry);
            return Ok(id);
        }
        if self.slots.len() == MAX_LIVE_RANKS {
            return Err(RtpError::TooManyDevices {
                live: MAX_LIVE_RANKS,
            });
        }
        self.slots.push(Some(entry));
        Ok((self.slots.len() - 1) as u16)
    }

    fn remove(&mut self, id: u16) {
        if let Some(slot) = self.slots.get_mut(id as usize) {
            if slot.take().is_some() {
                self.free.push(id);
            }
        }
    }
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl<B: Backend> Drop for RankCtx<B> {
    fn drop(&mut self) {
        registry().lock().unwrap().remove(self.index_id);
    }
}

/// Creates the context of `rank`, with a device id no other live rank has.
pub(crate) fn new_rank_ctx<B: Backend>(
    rank: usize,
    world_id: u64,
    inner: B::Device,
    transport: Arc<dyn Transport<B::FloatTensorPrimitive>>,
    config: RtpConfig,
) -> RtpResult<Arc<RankCtx<B>>> {
    let strategy = for_rank::<B>(&config);
    let comm = Arc::new(Comm::new(rank, world_id, inner, transport, config)?);
    // The slot is taken first (empty) so that a full registry fails before anything is built.
    let index_id = registry().lock().unwrap().insert(Box::new(()))?;
    let ctx = Arc::new(RankCtx {
        comm,
        strategy,
        params: ParamStreams::default(),
        linear: LinearRecords::default(),
        fallback: GatherFallback::default(),
        shard_io: Default::default(),
        index_id,
    });
    registry().lock().unwrap().slots[index_id as usize] = Some(Box::new(Arc::downgrade(&ctx)));
    Ok(ctx)
}

/// Finds the live rank with the device id Burn knows it by.
pub(crate) fn find_rank_ctx<B: Backend>(index: u16) -> Option<Arc<RankCtx<B>>> {
    let reg = registry().lock().unwrap();
    let weak = reg
        .slots
        .get(index as usize)?
        .as_ref()?
        .downcast_ref::<Weak<RankCtx<B>>>()?;
    weak.upgrade()
}
