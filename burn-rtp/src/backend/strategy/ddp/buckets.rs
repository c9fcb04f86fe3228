//! DDP's gradient buckets: the gradients of replicated weights, in the order the backward
//! produces them, grouped until a bucket holds its size in bytes; each full bucket is
//! all-reduced on the rank's background worker while the rest of the backward computes.
//!
//! A bucket only ever computes ahead. The optimizer claims a sum by the identity of the very
//! gradient it was computed from (the charge all its clones share); a gradient autodiff
//! changed afterwards (a weight used twice has its contributions added into a new tensor) is
//! not claimed, and is all-reduced in the step as without buckets. The bucket keeps a handle
//! to each gradient, so no op can reuse its charge for a different tensor meanwhile. Every
//! rank runs the same program, so every rank starts the same buckets and claims the same sums.

use crate::state::accounting::{Charge, Float, Held};
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;
use std::sync::{Arc, Mutex};

/// The sums of one launched bucket, in its gradients' order; filled by the worker, and each
/// taken by its claim.
pub(crate) type Sums<B> = Arc<Mutex<Option<Vec<Option<Held<B>>>>>>;

/// A gradient waiting in the open bucket: its identity and its tensor.
pub(crate) type Waiting<B> = (Arc<Charge>, Float<B>);

/// A bucket handed to the worker.
struct Launched<B: Backend> {
    grads: Vec<Arc<Charge>>,
    sums: Sums<B>,
}

/// One rank's buckets.
pub(crate) struct Buckets<B: Backend> {
    open: Vec<Waiting<B>>,
    open_bytes: usize,
    launched: Vec<Launched<B>>,
}

impl<B: Backend> Default for Buckets<B> {
    fn default() -> Self {
        Self {
            open: Vec::new(),
            open_bytes: 0,
            launched: Vec::new(),
        }
    }
}

impl<B: Backend> Buckets<B> {
    /// Adds a gradient to the open bucket; returns the bucket when it reached `cap` bytes.
    pub(crate) fn add(&mut self, grad: Waiting<B>, cap: usize) -> Option<Vec<Waiting<B>>> {
        self.open_bytes += grad.1.shape().num_elements() * grad.1.dtype().size();
        self.open.push(grad);
        (self.open_bytes >= cap).then(|| self.take_open()).flatten()
    }

    /// The open bucket, if it holds anything (the last, partial one, at the step).
    pub(crate) fn take_open(&mut self) -> Option<Vec<Waiting<B>>> {
        self.open_bytes = 0;
        (!self.open.is_empty()).then(|| std::mem::take(&mut self.open))
    }

    /// Records a bucket handed to the worker, whose sums will land in `sums`.
    pub(crate) fn launched(&mut self, grads: Vec<Arc<Charge>>, sums: Sums<B>) {
        self.launched.push(Launched { grads, sums });
    }

    /// Whether some bucket was launched since the last [`Buckets::clear`].
    pub(crate) fn any_launched(&self) -> bool {
        !self.launched.is_empty()
    }

    /// The sum of the gradient with identity `grad`, if a finished bucket holds it.
    pub(crate) fn claim(&mut self, grad: &Arc<Charge>) -> Option<Held<B>> {
        for bucket in &self.launched {
            if let Some(i) = bucket.grads.iter().position(|g| Arc::ptr_eq(g, grad)) {
                // Taken out, so a second claim of the same gradient finds nothing.
                return bucket.sums.lock().unwrap().as_mut()?.get_mut(i)?.take();
            }
        }
        None
    }

    /// Forgets every bucket, open or launched, and the sums nobody claimed.
    pub(crate) fn clear(&mut self) {
        self.open.clear();
        self.open_bytes = 0;
        self.launched.clear();
    }
}
