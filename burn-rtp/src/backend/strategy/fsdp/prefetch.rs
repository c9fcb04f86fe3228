//! FSDP's prefetch: while a layer computes with its gathered weight, the next weight's
//! all-gather runs on the rank's background worker, in the forward and in the backward.
//!
//! Which weight comes next is learned, not guessed: the optimizer step registers the new
//! parameters in the module's order, each gather of a registered parameter is recorded by its
//! position, and a step that has so far gathered exactly what the last step gathered prefetches
//! what the last step gathered next. The first step after a change of program prefetches
//! nothing, and a step that departs from the last one stops prefetching; a prefetched gather
//! that is not asked for is dropped. A prefetch is handed over only for the very parameter it
//! gathered (its charge, which the registry holds), so a wrong prediction costs a gather,
//! never a wrong weight. Every rank runs the same program, so every rank makes the same
//! predictions and starts the same gathers.

use crate::backend::strategy::Param;
use crate::state::accounting::{Charge, Held};
use burn::tensor::backend::Backend;
use std::sync::{Arc, Mutex};

/// Where the worker leaves a prefetched gather.
pub(crate) type Slot<B> = Arc<Mutex<Option<Held<B>>>>;

/// One rank's prefetch state.
pub(crate) struct Prefetch<B: Backend> {
    /// This step's parameters, in the module's order.
    params: Vec<Param<B>>,
    /// The parameters the last step gathered, by position, in order.
    last: Vec<usize>,
    /// The parameters this step has gathered so far.
    now: Vec<usize>,
    /// Whether `now` is still a prefix of `last`.
    on_track: bool,
    /// The gather in flight or done ahead: the parameter's position and its slot.
    ahead: Option<(usize, Slot<B>)>,
}

impl<B: Backend> Default for Prefetch<B> {
    fn default() -> Self {
        Self {
            params: Vec::new(),
            last: Vec::new(),
            now: Vec::new(),
            on_track: true,
            ahead: None,
        }
    }
}

/// What a gather of a registered parameter finds: its prefetched gather, if one was started
/// for it, and the parameter to prefetch next, if the step is on track.
pub(crate) struct OnGather<B: Backend> {
    /// The slot of this parameter's prefetched gather.
    pub ready: Option<Slot<B>>,
    /// The next parameter to gather ahead, with the slot its gather fills.
    pub next: Option<(Param<B>, Slot<B>)>,
}

impl<B: Backend> Prefetch<B> {
    /// Forgets the parameters (before the optimizer replaces them, so that the registry does
    /// not hold the old shards while the update writes the new ones), keeping the order.
    pub(crate) fn release(&mut self) {
        self.params.clear();
        self.ahead = None;
    }

    /// Registers the parameters of the next step, in the module's order; the step that just
    /// ended becomes the order the next one follows.
    pub(crate) fn register(&mut self, params: Vec<Param<B>>) {
        if !self.now.is_empty() {
            self.last = std::mem::take(&mut self.now);
        }
        self.params = params;
        self.on_track = true;
        self.ahead = None;
    }

    /// Records a gather of the parameter with identity `charge` (`None` if it is not
    /// registered: nothing is recorded or prefetched).
    pub(crate) fn on_gather(&mut self, charge: &Arc<Charge>) -> Option<OnGather<B>> {
        let i = self.params.iter().position(|p| Arc::ptr_eq(&p.0, charge))?;
        let ready = match self.ahead.take() {
            Some((j, slot)) if j == i => Some(slot),
            _ => None,
        };
        let at = self.now.len();
        self.now.push(i);
        self.on_track &= self.last.get(at) == Some(&i);
        let next = match self.last.get(at + 1) {
            Some(&j) if self.on_track => {
                let slot = Slot::<B>::default();
                self.ahead = Some((j, slot.clone()));
                Some((self.params[j].clone(), slot))
            }
            _ => None,
        };
        Some(OnGather { ready, next })
    }
}
