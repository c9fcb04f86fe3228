//! Gathered copies of small sharded tensors (a LayerNorm's gain and bias), kept while the
//! shard they were gathered from lives, so that using the same parameter again gathers
//! nothing.
//!
//! A LayerNorm's gain is gathered for its forward and again for its backward; under
//! activation checkpointing (`Autodiff<_, BalancedCheckpointing>`) the normalisation is
//! recomputed in the backward pass, which would gather the gain and bias a third and fourth
//! time. Each gather is an exchange with every peer, a synchronisation that costs more than
//! the few kilobytes it moves.
//!
//! * **Which.** Only tensors whose full size is at most [`MAX_CACHED_BYTES`]: the copies
//!   are the replication the shard threshold would have chosen for them, and a large weight
//!   gathered by a fallback op must not stay whole.
//! * **Valid while the source lives.** An entry holds its source shard (its charge), so the
//!   source's identity cannot pass to another tensor: an op on a uniquely held tensor may
//!   reuse its charge for its result (`RtpTensor::derive`), which a weak key would mistake
//!   for the old value. An entry whose source nothing else holds any more (the optimizer
//!   replaced the parameter) is dropped at the next lookup, with its copy.
//! * **Through reshapes.** Burn reshapes a gain before it multiplies (`[d]` to `[1, 1, d]`),
//!   a new tensor each time, and a recomputed forward reshapes it again. A reshape of a small
//!   sharded tensor along its kept last dimension shares its charge (its identity and its
//!   bytes, as a view does), and copies are kept by that identity and the logical layout, so
//!   every reshape of one parameter to one shape finds the same copy.
//! * **Counted, and gone with the step.** The copies stay charged to the ledger (as local
//!   bytes) while kept. `RtpOptimizer` drops them all before its update, when every source
//!   is about to be replaced, so no old parameter outlives its step here.

use crate::state::accounting::Held;
use crate::state::sharding::Layout;
use burn::tensor::backend::Backend;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Largest full tensor, in bytes, whose gathered copy is kept.
pub(crate) const MAX_CACHED_BYTES: usize = 256 << 10;

/// A kept copy: the source it was gathered from, the logical layout it was gathered as.
struct Entry<B: Backend> {
    /// The sharded source, held so that its identity stays its own.
    source: Held<B>,
    layout: Layout,
    full: Held<B>,
}

/// One rank's kept gathers.
pub(crate) struct Gathers<B: Backend> {
    entries: Vec<Entry<B>>,
}

impl<B: Backend> Default for Gathers<B> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

/// The gather fallback of one rank: how often each op without a shard-wise rule gathered,
/// and the copies kept for small tensors.
pub(crate) struct GatherFallback<B: Backend> {
    /// Kept copies of small sharded tensors.
    pub(crate) kept: Mutex<Gathers<B>>,
    counts: Mutex<BTreeMap<String, u64>>,
}

impl<B: Backend> Default for GatherFallback<B> {
    fn default() -> Self {
        Self {
            kept: Mutex::new(Gathers::default()),
            counts: Mutex::new(BTreeMap::new()),
        }
    }
}

impl<B: Backend> GatherFallback<B> {
    /// Counts one more fallback of `op`; returns its count so far.
    pub(crate) fn count(&self, op: &str) -> u64 {
        let mut counts = self.counts.lock().unwrap();
        let count = counts.entry(op.to_string()).or_insert(0);
        *count += 1;
        *count
    }

    /// Every op's count so far.
    pub(crate) fn counts(&self) -> BTreeMap<String, u64> {
        self.counts.lock().unwrap().clone()
    }
}

/// Whether a sharded tensor of logical `layout` with `elem`-byte elements is small enough
/// to keep whole.
pub(crate) fn small(layout: &Layout, elem: usize) -> bool {
    match layout {
        Layout::Sharded(spec) => spec.full.num_elements() * elem <= MAX_CACHED_BYTES,
        _ => false,
    }
}

impl<B: Backend> Gathers<B> {
    /// The kept full copy of `source` (of logical `layout`), if any: the same tensor under
    /// the same charge. Copies whose source nothing else holds any more go first.
    pub(crate) fn find(&mut self, source: &Held<B>, layout: &Layout) -> Option<Held<B>> {
        self.entries.retain(|e| !e.source.alone());
        self.entries
            .iter()
            .find(|e| e.source.same_as(source) && &e.layout == layout)
            .map(|e| e.full.share())
    }

    /// Keeps `full`, gathered from `source` (of logical `layout`), if it is small enough.
    pub(crate) fn keep(&mut self, source: &Held<B>, layout: &Layout, full: &Held<B>) {
        if crate::state::accounting::bytes_of(&**full) > MAX_CACHED_BYTES {
            return;
        }
        self.entries.push(Entry {
            source: source.share(),
            layout: layout.clone(),
            full: full.share(),
        });
    }

    /// Drops every kept copy (the optimizer is about to replace their sources).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// How many copies are kept, once those whose source is gone are dropped (for tests).
    #[cfg(test)]
    pub(crate) fn len(&mut self) -> usize {
        self.entries.retain(|e| !e.source.alone());
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::accounting::{Category, Ledger};
    use crate::state::sharding::ShardSpec;
    use burn::backend::NdArray;
    use burn::tensor::{Shape, TensorData, TensorMetadata};
    use std::sync::Arc;

    type B = NdArray;

    fn held(ledger: &Arc<Ledger>, n: usize) -> Held<B> {
        let t = <B as burn::tensor::ops::FloatTensorOps<B>>::float_from_data(
            TensorData::new(vec![1f32; n], [n]),
            &Default::default(),
        );
        Held::new(ledger, t, Category::Local)
    }

    fn sharded(full: usize) -> Layout {
        Layout::Sharded(ShardSpec {
            full: Shape::from(vec![full]),
            world: 2,
        })
    }

    #[test]
    fn a_copy_is_found_while_its_parameter_lives() {
        let ledger = Ledger::new();
        let mut gathers = Gathers::<B>::default();
        let param = held(&ledger, 8);
        let full = held(&ledger, 16);
        gathers.keep(&param, &sharded(16), &full);
        drop(full);
        // A view under the parameter's charge (a reshape of a small parameter) finds it.
        let view = param.share();
        let found = gathers.find(&view, &sharded(16)).expect("kept");
        assert_eq!(found.get().shape().num_elements(), 16);
        // Another logical layout is another copy; another tensor finds nothing.
        assert!(gathers.find(&view, &sharded(17)).is_none());
        assert!(gathers.find(&held(&ledger, 8), &sharded(16)).is_none());
        drop((found, view));
        assert_eq!(gathers.len(), 1);
        // Once nothing but the cache holds the parameter, its copy goes, and its bytes with it.
        drop(param);
        assert_eq!(gathers.len(), 0);
        assert_eq!(ledger.live().total, 0);
        // `clear` drops what is kept at once.
        let param = held(&ledger, 8);
        gathers.keep(&param, &sharded(16), &held(&ledger, 16));
        gathers.clear();
        drop(param);
        assert_eq!(ledger.live().total, 0);
    }

    #[test]
    fn large_copies_are_not_kept() {
        let ledger = Ledger::new();
        let mut gathers = Gathers::<B>::default();
        let n = MAX_CACHED_BYTES / 4 + 1;
        let (source, full) = (held(&ledger, n / 2 + 1), held(&ledger, n));
        gathers.keep(&source, &sharded(n), &full);
        assert!(gathers.find(&source, &sharded(n)).is_none());
        assert!(!small(&sharded(n), 4));
        assert!(small(&sharded(n - 1), 4));
    }
}
