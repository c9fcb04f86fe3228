//! FSDP: each rank holds 1/N of every sharded parameter; a module op all-gathers the whole
//! weight for its compute and reduce-scatters the gradient. The next weight's gather runs
//! ahead on the background worker while a layer computes.

mod prefetch;

use super::WeightUse;
use super::{run_in_background, AheadCounts, Buffers, ModelShapes, Param, RankStrategy, Rules};
use crate::comm::collectives::all_gather;
use crate::comm::context::Comm;
use crate::comm::p2p::adopt;
use crate::state::accounting::{Category, Charge, Float, Held};
use crate::state::sharding::Layout;
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use prefetch::Prefetch;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// FSDP's rules: sharded weights are gathered whole for each op.
pub(crate) struct Fsdp;

impl Rules for Fsdp {
    fn shards(&self) -> bool {
        true
    }

    fn weight_use(&self, layout: &Layout) -> WeightUse {
        match layout {
            Layout::Sharded(spec) => WeightUse::Gathered(spec.clone()),
            _ => WeightUse::Whole,
        }
    }

    fn in_flight(&self, model: &ModelShapes<'_>, world: usize) -> Buffers {
        // Forward: a layer's gathered weight and bias while it computes (the next layer's,
        // gathered ahead, replaces it as the last layer's output becomes the activations'
        // peak). Backward: those, while the parts of the next gather (or the chunks of the
        // gradient's reduce-scatter) arrive, and the next weight gathered ahead. The backward
        // gathers a weight for dX in every layer but the first (whose input is the data), so
        // it has a next weight to gather ahead only in a model of three weights or more.
        let full = model.largest_bundle(self, world, &|s| model.full(s), &|_| true);
        let weights = model
            .shapes
            .iter()
            .filter(|s| s.num_dims() >= 2 && self.placement(s, world, model.threshold).is_some())
            .count();
        let ahead = if weights >= 3 { full } else { 0 };
        Buffers {
            forward: full,
            backward: (full as f64 * (2.0 - 1.0 / world as f64)).round() as u64 + ahead,
            update: 0,
        }
    }
}

/// One rank's FSDP: its prefetch, when there is a peer to gather from.
pub(crate) struct FsdpRank<B: Backend> {
    /// Whether gathers are started ahead (more than one rank).
    prefetches: bool,
    prefetch: Mutex<Prefetch<B>>,
    counts: AheadCounts,
}

impl<B: Backend> FsdpRank<B> {
    /// FSDP on one of `world` ranks.
    pub(crate) fn new(world: usize) -> Self {
        Self {
            prefetches: world > 1,
            prefetch: Mutex::new(Prefetch::default()),
            counts: AheadCounts::default(),
        }
    }
}

impl<B: Backend> RankStrategy<B> for FsdpRank<B> {
    fn rules(&self) -> &'static dyn Rules {
        &Fsdp
    }

    fn wants_params(&self) -> bool {
        self.prefetches
    }

    fn register_params(&self, params: Vec<Param<B>>) {
        if self.prefetches {
            self.prefetch.lock().unwrap().register(params);
        }
    }

    fn release_params(&self) {
        self.prefetch.lock().unwrap().release();
    }

    /// Takes the parameter from its prefetched gather when one was started for it, else
    /// gathers it now; then starts, on the background worker, the gather the last step made
    /// next.
    fn gather_param(
        &self,
        comm: &Arc<Comm<B>>,
        charge: &Arc<Charge>,
        inner: &Float<B>,
        layout: &Layout,
        op: &'static str,
    ) -> Held<B> {
        let found = self.prefetch.lock().unwrap().on_gather(charge);
        let ready = found.as_ref().and_then(|f| f.ready.clone());
        let full = match ready {
            Some(slot) => {
                comm.wait_background();
                let prefetched = slot.lock().unwrap().take();
                self.counts.taken.fetch_add(1, Ordering::Relaxed);
                // Gathered on the worker's stream: taken over onto this rank's.
                let prefetched = prefetched.map(|h| h.map(|t| adopt(comm, vec![t]).remove(0)));
                prefetched.unwrap_or_else(|| {
                    panic!(
                        "rank {}: `{op}`: the prefetched gather of a {:?} shard is missing",
                        comm.rank,
                        inner.shape().to_vec()
                    )
                })
            }
            None => all_gather(comm, inner, layout, op, Category::InFlight),
        };
        if let Some(((_, next, next_layout), slot)) = found.and_then(|f| f.next) {
            self.counts.started.fetch_add(1, Ordering::Relaxed);
            let worker = comm.clone();
            let job = move || {
                let full = all_gather(
                    &worker,
                    &next,
                    &next_layout,
                    "fsdp.prefetch",
                    Category::InFlight,
                );
                *slot.lock().unwrap() = Some(full);
            };
            run_in_background(comm, job);
        }
        full
    }

    fn ahead(&self) -> (u64, u64) {
        self.counts.get()
    }
}
