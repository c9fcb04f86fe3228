//! The device of one rank: its place in the world and the inner backend's device.

use crate::backend::rank::{find_rank_ctx, new_rank_ctx, RankCtx};
use crate::comm::transport::{HubOptions, InProcessHub, Transport};
use crate::config::{RtpConfig, Strategy};
use crate::error::{RtpError, RtpResult};
use crate::state::accounting::MemoryStats;
use crate::state::shard_io::{ShardIo, ShardMap};
use burn::tensor::backend::{Backend, DeviceId, DeviceOps};
use burn::tensor::Element;
use std::any::Any;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

static NEXT_WORLD_ID: AtomicU64 = AtomicU64::new(1);

/// A rank of an RTP world, usable wherever Burn wants a device.
pub struct RtpDevice<B: Backend> {
    pub(crate) ctx: Arc<RankCtx<B>>,
}

impl<B: Backend> Clone for RtpDevice<B> {
    fn clone(&self) -> Self {
        Self {
            ctx: self.ctx.clone(),
        }
    }
}

impl<B: Backend> PartialEq for RtpDevice<B> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.ctx, &other.ctx)
    }
}

impl<B: Backend> Eq for RtpDevice<B> {}

impl<B: Backend> std::fmt::Debug for RtpDevice<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RtpDevice({:?})", self.ctx)
    }
}

impl<B: Backend> Default for RtpDevice<B> {
    fn default() -> Self {
        solo_device::<B>()
    }
}

impl<B: Backend> burn::tensor::backend::Device for RtpDevice<B> {
    fn from_id(device_id: DeviceId) -> Self {
        device_from_index::<B>(device_id.index_id).unwrap_or_else(|| {
            panic!("no live RTP rank has device id {device_id}; it belonged to a world that ended")
        })
    }

    fn to_id(&self) -> DeviceId {
        DeviceId {
            type_id: 0x52_54,
            index_id: self.ctx.index_id,
        }
    }
}

impl<B: Backend> DeviceOps for RtpDevice<B> {}

impl<B: Backend> RtpDevice<B> {
    /// This rank's index.
    pub fn rank(&self) -> usize {
        self.ctx.comm.rank
    }

    /// Number of ranks in the world.
    pub fn world_size(&self) -> usize {
        self.ctx.comm.world_size
    }

    /// The inner backend's device this rank computes on.
    pub fn inner_device(&self) -> &B::Device {
        &self.ctx.comm.inner
    }

    /// Bytes this rank holds now, by category.
    pub fn memory_live(&self) -> MemoryStats {
        self.ctx.comm.ledger.live()
    }

    /// Highest bytes this rank held since the last [`reset_memory_peak`](Self::reset_memory_peak).
    pub fn memory_peak(&self) -> MemoryStats {
        self.ctx.comm.ledger.peak()
    }

    /// What this rank's highest total since the last reset was made of (each category's
    /// bytes at that moment): the make-up the memory planner scales.
    pub fn memory_at_peak(&self) -> MemoryStats {
        self.ctx.comm.ledger.at_peak()
    }

    /// The make-up of this rank's highest peak in each phase of a step, `(compute, update)`:
    /// forward and backward, and the optimizer's update, as [`RtpOptimizer`](crate::RtpOptimizer)
    /// marks them. The memory planner scales each to other world sizes.
    pub fn memory_phase_peaks(&self) -> (MemoryStats, MemoryStats) {
        self.ctx.comm.ledger.phase_peaks()
    }

    /// Starts a new peak window.
    pub fn reset_memory_peak(&self) {
        self.ctx.comm.ledger.reset_peak()
    }

    /// How often each op without a shard-wise rule gathered its operands on this rank.
    pub fn gather_fallbacks(&self) -> BTreeMap<String, u64> {
        self.ctx.fallback_counts()
    }

    /// How many exchanges this rank has made with other ranks so far: each one posts its
    /// receives, starts its sends and waits for both, a synchronisation with its peers.
    pub fn exchanges(&self) -> u64 {
        self.ctx
            .comm
            .exchanges
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Blocks until every rank of the world reaches this call.
    pub fn barrier(&self) {
        crate::comm::collectives::barrier(&self.ctx.comm)
    }

    /// The mean of `value` over all ranks (a collective: every rank must call it), as the
    /// element type it was given: pass a loss's `into_scalar()` directly, whatever the
    /// backend's float element (`f32`, `f64`, `f16`), or any other Burn element.
    ///
    /// The values travel exactly (as their `f64` bits) and are summed in `f64` in rank order,
    /// so every rank gets the same bits; the mean is rounded once, to `E`.
    ///
    /// ```
    /// use burn::backend::{Autodiff, NdArray};
    /// use burn::tensor::Tensor;
    /// use burn_rtp::{launch, Rtp, RtpConfig};
    ///
    /// type B = Autodiff<Rtp<NdArray>>;
    /// let means = launch(RtpConfig::new(3), |device| {
    ///     let rank = device.rank() as f32;
    ///     let loss = Tensor::<B, 1>::from_floats([rank, rank + 1.0], &device).mean();
    ///     // The backend's element type in, the same type out.
    ///     let loss = device.all_reduce_mean(loss.into_scalar());
    ///     // Any other element too: here an f64 figure.
    ///     let tokens = device.all_reduce_mean(1000.0 * (device.rank() + 1) as f64);
    ///     (loss, tokens)
    /// })
    /// .unwrap();
    /// // Ranks' losses 0.5, 1.5 and 2.5; their mean 1.5, on every rank.
    /// assert!(means.iter().all(|&m| m == (1.5f32, 2000.0f64)));
    /// ```
    pub fn all_reduce_mean<E: Element>(&self, value: E) -> E {
        let all = self.all_gather_f64("all_reduce_mean", value.to_f64());
        E::from_elem(mean_in_rank_order(&all))
    }

    /// The mean of `value` over all ranks, or, when it is NaN or infinite on any rank, the
    /// same [`RtpError::NonFinite`](crate::RtpError::NonFinite) on every rank, naming `step`
    /// and the lowest such rank (a collective: every rank must call it).
    ///
    /// Every rank gets the same verdict, so a training loop can stop on all ranks at once,
    /// before a bad update is applied or a checkpoint written. The mean is bit-identical to
    /// [`all_reduce_mean`](Self::all_reduce_mean)'s for the same element type (the same
    /// exact gather, the same `f64` sum in rank order, the same rounding to `E`).
    ///
    /// ```
    /// use burn_rtp::{launch, RtpConfig, RtpError};
    ///
    /// let verdicts = launch::<burn::backend::NdArray, _, _>(RtpConfig::new(3), |device| {
    ///     let loss = if device.rank() == 1 { f32::NAN } else { 0.5 };
    ///     device.check_finite(7, "loss", loss)
    /// })
    /// .unwrap();
    /// for verdict in verdicts {
    ///     assert!(matches!(verdict, Err(RtpError::NonFinite { step: 7, bad_rank: 1, .. })));
    /// }
    /// ```
    pub fn check_finite<E: Element>(&self, step: u64, what: &str, value: E) -> crate::RtpResult<E> {
        let all = self.all_gather_f64("check_finite", value.to_f64());
        if let Some((bad_rank, bad)) = all.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(crate::RtpError::NonFinite {
                rank: self.ctx.comm.rank,
                step,
                what: what.to_string(),
                bad_rank,
                value: bad.to_string(),
            });
        }
        Ok(E::from_elem(mean_in_rank_order(&all)))
    }

    /// Every rank's `value` on every rank, in rank order, exactly (as the bytes of its bits).
    fn all_gather_f64(&self, op: &'static str, value: f64) -> Vec<f64> {
        crate::comm::collectives::all_gather_bytes(&self.ctx.comm, op, &value.to_le_bytes())
            .into_iter()
            .map(|bytes| {
                let bits: [u8; 8] = bytes.try_into().unwrap_or_else(|b: Vec<u8>| {
                    panic!(
                        "rank {}: `{op}` received {} bytes for an f64",
                        self.ctx.comm.rank,
                        b.len()
                    )
                });
                f64::from_le_bytes(bits)
            })
            .collect()
    }

    /// Whether `flag` is set on any rank (a collective). Ranks that each watch a local event,
    /// such as a signal, use it to act on the same step.
    pub fn any_rank(&self, flag: bool) -> bool {
        let sum = crate::comm::collectives::all_reduce_sum_host(
            &self.ctx.comm,
            "any_rank",
            vec![f32::from(u8::from(flag))],
        );
        sum[0] > 0.0
    }

    /// Every rank's `bytes` on every rank, in rank order (a collective, for small host
    /// messages such as per-rank statistics).
    pub fn all_gather_bytes(&self, bytes: &[u8]) -> Vec<Vec<u8>> {
        crate::comm::collectives::all_gather_bytes(&self.ctx.comm, "all_gather_bytes", bytes)
    }

    /// Every rank's `value` on every rank, in rank order (a collective; the value travels as
    /// JSON, for small per-rank figures such as memory peaks).
    pub fn all_gather_json<T>(&self, value: &T) -> Vec<T>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let own = serde_json::to_vec(value).expect("a per-rank figure serialises");
        self.all_gather_bytes(&own)
            .iter()
            .map(|b| serde_json::from_slice(b).expect("every rank sends what it serialised"))
            .collect()
    }

    /// Checks that every rank passes the same `(name, value)` settings (a collective). Each
    /// rank gets the same verdict, so a mismatch stops every rank before its first step.
    pub fn agree(&self, settings: &[(&str, String)]) -> crate::RtpResult<()> {
        crate::comm::collectives::agree(&self.ctx.comm, settings)
    }

    /// Runs `save` (which serialises records) so that every sharded tensor it reads yields
    /// only this rank's shard, and returns the map needed to load them back. The mode holds
    /// for the calling thread only, which may be any thread (a checkpointer's).
    pub fn save_shards<T>(&self, save: impl FnOnce() -> T) -> crate::RtpResult<(T, ShardMap)> {
        self.ctx.shard_io.set(ShardIo::Saving {
            map: ShardMap::default(),
            conflicts: Vec::new(),
        });
        let out = save();
        let io = self.ctx.shard_io.take();
        Ok((out, io.finish(self.ctx.comm.rank)?))
    }

    /// Runs `load` (which deserialises records saved by [`save_shards`](Self::save_shards)) so
    /// that the tensors it creates are this rank's shards again (on the calling thread).
    pub fn load_shards<T>(&self, map: &ShardMap, load: impl FnOnce() -> T) -> T {
        /// Puts the thread's shard IO back to ordinary, also when `load` unwinds.
        struct Off<'a>(&'a crate::state::shard_io::ShardIoByThread);
        impl Drop for Off<'_> {
            fn drop(&mut self) {
                self.0.set(ShardIo::Off);
            }
        }
        self.ctx.shard_io.set(ShardIo::Loading(map.clone()));
        let _off = Off(&self.ctx.shard_io);
        load()
    }

    /// Starts (or stops) recording this rank's rotation timeline, clearing what was recorded.
    pub fn record_timeline(&self, on: bool) {
        self.ctx.comm.transport.record_wire(on);
        self.ctx.comm.timeline.enable(on)
    }

    /// The intervals recorded since the last call.
    pub fn take_timeline(&self) -> Vec<crate::state::timeline::Interval> {
        self.ctx
            .comm
            .timeline
            .take(self.ctx.comm.transport.take_wire())
    }

    /// What DDP's gradient buckets did on this rank so far (see
    /// [`RtpConfig::with_ddp_bucket_bytes`](crate::RtpConfig::with_ddp_bucket_bytes)).
    pub fn ddp_buckets(&self) -> DdpBuckets {
        let (started, claimed) = self.ctx.ahead_of(Strategy::Ddp);
        DdpBuckets { started, claimed }
    }

    /// What FSDP's prefetch did on this rank so far (see `RtpOptimizer`, which registers
    /// the parameters whose gathers it starts ahead).
    pub fn fsdp_prefetches(&self) -> FsdpPrefetches {
        let (started, used) = self.ctx.ahead_of(Strategy::Fsdp);
        FsdpPrefetches { started, used }
    }

    /// Bytes of tensor data this rank's messages have carried to its peers so far, on any
    /// transport: what the strategy moves, by the tensors' sizes. In-process, where tensors
    /// are handed over rather than sent, this is what a byte transport would have sent.
    pub fn message_bytes(&self) -> u64 {
        self.ctx
            .comm
            .message_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes of tensor data this rank's transport has sent since it started: the wire volume
    /// of MPI (0 in-process, where tensors are handed over, not sent).
    pub fn sent_bytes(&self) -> u64 {
        self.ctx.comm.transport.sent_bytes()
    }

    /// How this rank's transport waits while bytes are in flight, and why (`None`:
    /// in-process, where nothing is in flight).
    pub fn progress_policy(&self) -> Option<String> {
        self.ctx.comm.transport.progress_policy()
    }

    /// The configuration of the world.
    pub fn config(&self) -> &crate::RtpConfig {
        &self.ctx.comm.config
    }
}

/// Creates a rank's device around any transport (used by multi-process launchers too).
pub fn register_device<B: Backend>(
    rank: usize,
    world_id: u64,
    inner: B::Device,
    transport: Arc<dyn Transport<B::FloatTensorPrimitive>>,
    config: RtpConfig,
) -> RtpResult<RtpDevice<B>> {
    new_rank_ctx(rank, world_id, inner, transport, config).map(|ctx| RtpDevice { ctx })
}

/// The mean of every rank's value, summed in rank order in `f64`: the same bits on every rank.
fn mean_in_rank_order(all: &[f64]) -> f64 {
    all.iter().fold(0.0, |sum, v| sum + v) / all.len() as f64
}

/// Finds a device by the id Burn gave it.
fn device_from_index<B: Backend>(index: u16) -> Option<RtpDevice<B>> {
    find_rank_ctx(index).map(|ctx| RtpDevice { ctx })
}

/// The devices of an in-process world and the hub that connects them.
pub(crate) type InProcessWorld<B> = (
    Vec<RtpDevice<B>>,
    Arc<InProcessHub<<B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive>>,
);

/// Builds the rank contexts of an in-process world.
pub(crate) fn in_process_world<B: Backend>(
    config: &RtpConfig,
    inner: impl Fn(usize) -> B::Device,
) -> RtpResult<InProcessWorld<B>> {
    if config.world_size == 0 {
        return Err(RtpError::EmptyWorld);
    }
    let hub = InProcessHub::with_options(
        config.world_size,
        config.peer_timeout,
        HubOptions {
            delivery: config.delivery,
            chaos: config.chaos,
        },
    );
    let world_id = NEXT_WORLD_ID.fetch_add(1, Ordering::Relaxed);
    let devices = (0..config.world_size)
        .map(|rank| {
            register_device(
                rank,
                world_id,
                inner(rank),
                Arc::new(hub.endpoint(rank)),
                config.clone(),
            )
        })
        .collect::<RtpResult<Vec<_>>>()?;
    Ok((devices, hub))
}

/// A world of one rank on the inner backend's default device, for use outside `launch`.
pub(crate) fn solo_device<B: Backend>() -> RtpDevice<B> {
    static SOLO: OnceLock<Mutex<Vec<Box<dyn Any + Send + Sync>>>> = OnceLock::new();
    let solos = SOLO.get_or_init(|| Mutex::new(Vec::new()));
    let mut solos = solos.lock().unwrap();
    for s in solos.iter() {
        if let Some(dev) = s.downcast_ref::<RtpDevice<B>>() {
            return dev.clone();
        }
    }
    let (mut devices, _hub) = in_process_world::<B>(&RtpConfig::new(1), |_| Default::default())
        .expect("a world of one rank is valid");
    let dev = devices.remove(0);
    solos.push(Box::new(dev.clone()));
    dev
}

thread_local! {
    static CURRENT: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Makes `device` this thread's rank until the guard drops.
///
/// Int and bool tensors carry no rank of their own; ops that need one read it from here.
pub fn enter_rank<B: Backend>(device: &RtpDevice<B>) -> RankGuard {
    let previous = CURRENT.with(|c| c.borrow_mut().replace(Box::new(device.clone())));
    RankGuard { previous }
}

/// Restores the previous rank of the thread when dropped.
pub struct RankGuard {
    previous: Option<Box<dyn Any>>,
}

impl Drop for RankGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// This thread's rank device, or a one-rank world outside `launch`.
pub(crate) fn current_device<B: Backend>() -> RtpDevice<B> {
    CURRENT
        .with(|c| {
            c.borrow()
                .as_ref()
                .and_then(|d| d.downcast_ref::<RtpDevice<B>>().cloned())
        })
        .unwrap_or_else(solo_device::<B>)
}

/// What DDP's gradient buckets did on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DdpBuckets {
    /// Buckets whose all-reduce started (full ones during the backward, the last one at
    /// the optimizer step).
    pub started: u64,
    /// Gradients whose bucketed sum the optimizer took instead of all-reducing them itself.
    pub claimed: u64,
}

/// What FSDP's prefetch did on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsdpPrefetches {
    /// Gathers started ahead on the background worker, while a layer computed.
    pub started: u64,
    /// Prefetched gathers a module op used (a prediction that missed is dropped).
    pub used: u64,
}
