//! DDP: every rank holds every parameter whole, computes on its own batch, and the optimizer
//! all-reduces each gradient. With buckets (the default), gradients are summed in groups on
//! the background worker while the rest of the backward computes.

mod buckets;

use super::{run_in_background, AheadCounts, Buffers, ModelShapes, RankStrategy, Rules, WeightUse};
use crate::comm::collectives::all_reduce_bucket;
use crate::comm::context::Comm;
use crate::comm::p2p::adopt;
use crate::state::accounting::{Charge, Float};
use crate::state::sharding::Layout;
use buckets::{Buckets, Sums, Waiting};
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// DDP's rules: nothing sharded.
pub(crate) struct Ddp;

impl Rules for Ddp {
    fn shards(&self) -> bool {
        false
    }

    fn weight_use(&self, layout: &Layout) -> WeightUse {
        match layout {
            // DDP places nothing sharded; a sharded weight that reaches it anyway (a tensor
            // made by hand with a sharded layout) is still computed exactly, by rotation.
            Layout::Sharded(spec) => WeightUse::Rotated(spec.clone()),
            _ => WeightUse::Whole,
        }
    }

    fn in_flight(&self, model: &ModelShapes<'_>, world: usize) -> Buffers {
        if model.bucket_bytes > 0 {
            // With buckets, the step starts with the sum of every bucketed gradient beside
            // the gradient itself (each one at least N elements; the few others, such as
            // LayerNorm gains, are counted too, a slight overestimate), while the last
            // bucket's chunks arrive.
            let bucketed: u64 = model
                .shapes
                .iter()
                .filter(|s| s.num_elements() >= world)
                .map(|s| model.full(s))
                .sum();
            let last = bucketed.min(model.bucket_bytes as u64);
            Buffers {
                forward: 0,
                backward: 0,
                update: bucketed + last.div_ceil(world as u64),
            }
        } else {
            // The update all-reduces each gradient in chunks of 1/N, one in flight at a
            // time (a received chunk is copied into its window of the sum, not into a
            // block of its own), and assembles its sum in a full-size buffer.
            let largest = model.shapes.iter().map(|s| model.full(s)).max();
            let largest = largest.unwrap_or(0);
            Buffers {
                forward: 0,
                backward: 0,
                update: largest.div_ceil(world as u64) + largest,
            }
        }
    }
}

/// One rank's DDP: its gradient buckets, when buckets are on and there is a peer to sum with.
pub(crate) struct DdpRank<B: Backend> {
    /// The bucket size in bytes; 0 when gradients are all-reduced in the step.
    bucket_bytes: usize,
    world: usize,
    buckets: Mutex<Buckets<B>>,
    counts: AheadCounts,
}

impl<B: Backend> DdpRank<B> {
    /// DDP on one of `world` ranks, with buckets of `bucket_bytes` (0: none).
    pub(crate) fn new(bucket_bytes: usize, world: usize) -> Self {
        let bucket_bytes = if world > 1 { bucket_bytes } else { 0 };
        Self {
            bucket_bytes,
            world,
            buckets: Mutex::new(Buckets::default()),
            counts: AheadCounts::default(),
        }
    }

    /// Starts a full bucket's all-reduce on the background worker.
    fn launch(&self, comm: &Arc<Comm<B>>, bucket: Vec<Waiting<B>>) {
        let (grads, tensors): (Vec<_>, Vec<_>) = bucket.into_iter().unzip();
        self.counts.started.fetch_add(1, Ordering::Relaxed);
        let sums: Sums<B> = Arc::default();
        self.buckets.lock().unwrap().launched(grads, sums.clone());
        let worker = comm.clone();
        let job = move || {
            let out = all_reduce_bucket(&worker, "ddp.all_reduce_bucket", tensors);
            *sums.lock().unwrap() = Some(out.into_iter().map(Some).collect());
        };
        run_in_background(comm, job);
    }
}

impl<B: Backend> RankStrategy<B> for DdpRank<B> {
    fn rules(&self) -> &'static dyn Rules {
        &Ddp
    }

    /// Adds the gradient to the open bucket, and starts the bucket's all-reduce once it is
    /// full. A gradient of fewer elements than ranks is left to the optimizer step.
    fn on_gradient(&self, comm: &Arc<Comm<B>>, charge: &Arc<Charge>, grad: &Float<B>) {
        if self.bucket_bytes == 0 || grad.shape().num_elements() < self.world {
            return;
        }
        let full = self
            .buckets
            .lock()
            .unwrap()
            .add((charge.clone(), grad.clone()), self.bucket_bytes);
        if let Some(bucket) = full {
            self.launch(comm, bucket);
        }
    }

    /// Starts the open, partial bucket.
    fn before_sync(&self, comm: &Arc<Comm<B>>) {
        let open = self.buckets.lock().unwrap().take_open();
        if let Some(bucket) = open {
            self.launch(comm, bucket);
        }
    }

    /// Waits for the buckets in flight, then takes the gradient's sum if a bucket holds it.
    fn claim_reduced(&self, comm: &Comm<B>, charge: &Arc<Charge>) -> Option<Float<B>> {
        if !self.buckets.lock().unwrap().any_launched() {
            return None;
        }
        comm.wait_background();
        let sum = self.buckets.lock().unwrap().claim(charge)?;
        self.counts.taken.fetch_add(1, Ordering::Relaxed);
        // Computed on the worker's stream: taken over onto this rank's.
        Some(adopt(comm, vec![sum.consume(|t| t)]).remove(0))
    }

    /// Forgets the buckets of the last backward, and the sums nobody claimed.
    fn after_sync(&self, comm: &Comm<B>) {
        comm.wait_background();
        self.buckets.lock().unwrap().clear();
    }

    fn ahead(&self) -> (u64, u64) {
        self.counts.get()
    }
}
