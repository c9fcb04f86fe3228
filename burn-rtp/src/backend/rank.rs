//! The op-level state of one rank, around its communication context: what the backend's ops
//! decide and remember (Linear pairing, parameter streams, gather fallbacks, shard IO) and the
//! device id Burn knows the rank by.

use crate::comm::collectives::{all_gather, all_reduce_bucket};
use crate::comm::context::Comm;
use crate::comm::p2p::{adopt, fence};
use crate::comm::transport::Transport;
use crate::config::{RtpConfig, Strategy};
use crate::error::{raise, RtpError, RtpResult};
use crate::state::accounting::{Category, Charge, Float, Held};
use crate::state::sharding::Layout;
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The state every op of one rank reads: its communication context and the ops' own records.
pub struct RankCtx<B: Backend> {
    /// Identity, transport, counters and accounting: all the communication layers see.
    pub(crate) comm: Comm<B>,
    persistent: AtomicUsize,
    param_stream: AtomicU64,
    seed: AtomicU64,
    fallbacks: Mutex<BTreeMap<String, u64>>,
    pub(crate) shard_io: crate::state::shard_io::ShardIoByThread,
    /// Linear forwards awaiting their backward, and gradients computed ahead.
    pub(crate) pairing: Mutex<crate::backend::pairing::Pairing<B>>,
    /// Whether some forward record may hold a Linear input: checked (without a lock) each
    /// time the rank makes a local tensor.
    inputs_held: AtomicBool,
    /// Gathered copies of small sharded tensors, kept while their source lives.
    pub(crate) gathers: Mutex<crate::backend::gathers::Gathers<B>>,
    /// DDP's gradient buckets: open, and handed to the background worker.
    buckets: Mutex<crate::backend::buckets::Buckets<B>>,
    /// Buckets started, and gradients whose bucketed sum the optimizer took, so far.
    pub(crate) bucket_counts: AheadCounts,
    /// FSDP's prefetch: the registered parameters and the order they are gathered in.
    prefetch: Mutex<crate::backend::prefetch::Prefetch<B>>,
    /// Gathers FSDP started ahead, and those that were used, so far.
    pub(crate) prefetch_counts: AheadCounts,
    /// The weight shapes whose Linear backward ran as two passes (dX, then dW on its own),
    /// because autodiff recomputed the input: the planner's probe reads them.
    pub(crate) split_passes: Mutex<Vec<Vec<usize>>>,
    pub(crate) index_id: u16,
}

impl<B: Backend> std::fmt::Debug for RankCtx<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.comm.fmt(f)
    }
}

impl<B: Backend> RankCtx<B> {
    /// Where a parameter (or its gradient) of logical `shape` lives: its split, or `None` when
    /// it is replicated. Creation and every gradient-producing op ask this one function, so a
    /// gradient always has the layout of its parameter.
    pub(crate) fn param_spec(
        &self,
        shape: &burn::tensor::Shape,
    ) -> Option<crate::state::sharding::ShardSpec> {
        crate::state::sharding::placement(
            self.comm.config.strategy,
            shape,
            self.comm.world_size,
            self.comm.config.shard_threshold,
        )
    }

    /// Records a Linear forward (see `backend::pairing`).
    pub(crate) fn record_forward(&self, forward: crate::backend::pairing::Forward<B>) {
        let mut pairing = self.pairing.lock().unwrap();
        pairing.record(forward);
        self.inputs_held
            .store(pairing.release_inputs(), Ordering::Release);
    }

    /// Lets the forward records go of inputs nothing else holds any more, so that a Linear's
    /// input autodiff dropped (activation checkpointing) is freed when the next tensor is
    /// made, not at the next Linear. Skipped while this rank is inside a pairing call.
    pub(crate) fn release_inputs(&self) {
        if !self.inputs_held.load(Ordering::Acquire) {
            return;
        }
        if let Ok(mut pairing) = self.pairing.try_lock() {
            self.inputs_held
                .store(pairing.release_inputs(), Ordering::Release);
        }
    }

    /// Whether parameters are being created right now (inside `memory_persistent_allocations`).
    pub(crate) fn persistent(&self) -> bool {
        self.persistent.load(Ordering::Acquire) > 0
    }

    pub(crate) fn enter_persistent(&self) -> PersistentGuard<'_> {
        self.persistent.fetch_add(1, Ordering::AcqRel);
        PersistentGuard(&self.persistent)
    }

    /// A new random stream for the next parameter; the same on every rank.
    pub(crate) fn next_param_stream(&self) -> u64 {
        self.param_stream.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn seed(&self) -> u64 {
        self.seed.load(Ordering::Relaxed)
    }

    pub(crate) fn set_seed(&self, seed: u64) {
        self.seed.store(seed, Ordering::Relaxed);
        self.param_stream.store(0, Ordering::Relaxed);
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
        let mut map = self.fallbacks.lock().unwrap();
        let count = map.entry(op.to_string()).or_insert(0);
        if *count == 0 && self.comm.rank == 0 {
            tracing::info!(
                op,
                ?shapes,
                "rtp: op has no shard-wise rule; gathering its sharded operands"
            );
        }
        *count += 1;
    }

    pub(crate) fn fallback_counts(&self) -> BTreeMap<String, u64> {
        self.fallbacks.lock().unwrap().clone()
    }

    /// Under DDP with buckets, adds the gradient of a replicated weight (identified by
    /// `charge`) to the open bucket, and starts the bucket's all-reduce in the background once
    /// it is full (see `backend::buckets`). Anything else is left to the optimizer step.
    pub(crate) fn bucket_gradient(self: &Arc<Self>, charge: &Arc<Charge>, grad: &Float<B>) {
        let config = &self.comm.config;
        let n = self.comm.world_size;
        if config.strategy != Strategy::Ddp
            || config.ddp_bucket_bytes == 0
            || n == 1
            || grad.shape().num_elements() < n
        {
            return;
        }
        let full = self
            .buckets
            .lock()
            .unwrap()
            .add((charge.clone(), grad.clone()), config.ddp_bucket_bytes);
        if let Some(bucket) = full {
            self.launch_bucket(bucket);
        }
    }

    /// Starts the open, partial bucket (the optimizer step does, once the backward is over).
    pub(crate) fn flush_buckets(self: &Arc<Self>) {
        let open = self.buckets.lock().unwrap().take_open();
        if let Some(bucket) = open {
            self.launch_bucket(bucket);
        }
    }

    fn launch_bucket(self: &Arc<Self>, bucket: Vec<crate::backend::buckets::Waiting<B>>) {
        let (grads, tensors): (Vec<_>, Vec<_>) = bucket.into_iter().unzip();
        self.bucket_counts.started.fetch_add(1, Ordering::Relaxed);
        let sums: crate::backend::buckets::Sums<B> = Arc::default();
        self.buckets.lock().unwrap().launched(grads, sums.clone());
        let ctx = self.clone();
        let job = move || {
            let out = all_reduce_bucket(&ctx.comm, "ddp.all_reduce_bucket", tensors);
            *sums.lock().unwrap() = Some(out.into_iter().map(Some).collect());
        };
        self.run_in_background(job);
    }

    /// Hands `job` to the rank's background worker once this rank's queued device work is
    /// done: the worker runs on a stream of its own (each thread's, on wgpu and CUDA), and its
    /// jobs read tensors this rank's last kernels wrote (fresh gradients, weights the step
    /// just updated). A no-op fence on synchronous backends such as NdArray.
    fn run_in_background(&self, job: impl FnOnce() + Send + 'static) {
        fence(&self.comm);
        self.comm.background.submit(self.comm.rank, Box::new(job));
    }

    /// The all-reduced sum of the gradient identified by `charge`, if a bucket computed it;
    /// waits for the buckets in flight first.
    pub(crate) fn claim_bucketed(&self, charge: &Arc<Charge>) -> Option<Float<B>> {
        if !self.buckets.lock().unwrap().any_launched() {
            return None;
        }
        self.comm.wait_background();
        let sum = self.buckets.lock().unwrap().claim(charge)?;
        self.bucket_counts.taken.fetch_add(1, Ordering::Relaxed);
        // Computed on the worker's stream: taken over onto this rank's.
        Some(adopt(&self.comm, vec![sum.consume(|t| t)]).remove(0))
    }

    /// Under FSDP, registers the parameters of the next step in the module's order, so that
    /// their gathers can be started ahead (see `backend::prefetch`).
    pub(crate) fn register_params(&self, params: Vec<crate::backend::prefetch::Param<B>>) {
        if self.prefetches() {
            self.prefetch.lock().unwrap().register(params);
        }
    }

    /// Whether FSDP's prefetch runs here (FSDP on more than one rank): callers skip
    /// collecting parameters for it otherwise.
    pub(crate) fn prefetches(&self) -> bool {
        self.comm.config.strategy == Strategy::Fsdp && self.comm.world_size > 1
    }

    /// Lets go of the registered parameters before the optimizer replaces them.
    pub(crate) fn release_params(&self) {
        self.prefetch.lock().unwrap().release();
    }

    /// The whole of a sharded parameter for a module op (FSDP): taken from its prefetched
    /// gather when one was started for it, else gathered now; then the gather the last step
    /// made next is started on the background worker.
    pub(crate) fn gather_param(
        self: &Arc<Self>,
        charge: &Arc<Charge>,
        inner: &Float<B>,
        layout: &Layout,
        op: &'static str,
    ) -> Held<B> {
        let found = self.prefetch.lock().unwrap().on_gather(charge);
        let ready = found.as_ref().and_then(|f| f.ready.clone());
        let full = match ready {
            Some(slot) => {
                self.comm.wait_background();
                let prefetched = slot.lock().unwrap().take();
                self.prefetch_counts.taken.fetch_add(1, Ordering::Relaxed);
                // Gathered on the worker's stream: taken over onto this rank's.
                let prefetched =
                    prefetched.map(|h| h.map(|t| adopt(&self.comm, vec![t]).remove(0)));
                prefetched.unwrap_or_else(|| {
                    panic!(
                        "rank {}: `{op}`: the prefetched gather of a {:?} shard is missing",
                        self.comm.rank,
                        inner.shape().to_vec()
                    )
                })
            }
            None => all_gather(&self.comm, inner, layout, op, Category::InFlight),
        };
        if let Some(((_, next, next_layout), slot)) = found.and_then(|f| f.next) {
            self.prefetch_counts.started.fetch_add(1, Ordering::Relaxed);
            let ctx = self.clone();
            let job = move || {
                let full = all_gather(
                    &ctx.comm,
                    &next,
                    &next_layout,
                    "fsdp.prefetch",
                    Category::InFlight,
                );
                *slot.lock().unwrap() = Some(full);
            };
            self.run_in_background(job);
        }
        full
    }

    /// Forgets the buckets of the last backward, and the sums nobody claimed.
    pub(crate) fn clear_buckets(&self) {
        self.comm.wait_background();
        self.buckets.lock().unwrap().clear();
    }
}

/// What a strategy started ahead of need on the background worker (DDP's bucket
/// all-reduces, FSDP's gathers), and how many of those results were taken.
#[derive(Default)]
pub(crate) struct AheadCounts {
    /// Jobs started.
    pub(crate) started: AtomicU64,
    /// Results taken (a bucketed sum the optimizer claimed, a prefetched gather used).
    pub(crate) taken: AtomicU64,
}

impl AheadCounts {
    /// Both counts so far: `(started, taken)`.
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.started.load(Ordering::Relaxed),
            self.taken.load(Ordering::Relaxed),
        )
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
    let comm = Comm::new(rank, world_id, inner, transport, config)?;
    // The slot is taken first (empty) so that a full registry fails before anything is built.
    let index_id = registry().lock().unwrap().insert(Box::new(()))?;
    let ctx = Arc::new(RankCtx {
        comm,
        pairing: Mutex::new(Default::default()),
        gathers: Mutex::new(Default::default()),
        buckets: Mutex::new(Default::default()),
        bucket_counts: Default::default(),
        prefetch: Mutex::new(Default::default()),
        prefetch_counts: Default::default(),
        split_passes: Mutex::new(Vec::new()),
        inputs_held: AtomicBool::new(false),
        persistent: AtomicUsize::new(0),
        param_stream: AtomicU64::new(0),
        seed: AtomicU64::new(0),
        fallbacks: Mutex::new(BTreeMap::new()),
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
