//! Pairs the three backward calls of one `Linear` so that they share one ring pass.
//!
//! Burn's autodiff runs a Linear's backward as three separate backend calls, one after
//! another inside one graph node: `linear_x_backward(w, dy)`, then
//! `linear_weight_backward(x, dy)`, then `linear_bias_backward(dy)`, each only if that input
//! is tracked. The paper's backward is one trip around the ring: the weight shard rotates
//! (for dX) and the gradient buffer travels with it (for dW and db). The first call must
//! therefore compute what the later ones will ask for, and the later ones must get exactly
//! that, or compute it themselves.
//!
//! * **Forward records.** Every Linear forward leaves a record: the weight's and `x`'s
//!   identity (their charge, shared by all clones of a tensor), the layouts of the weight and
//!   the bias, and, where the weight rotates, `x` itself (autodiff keeps it alive for the
//!   backward anyway).
//! * **Routed inputs.** A forward that routed its activations (`Routing`) leaves on each owner
//!   every peer's `x` it received ([`PeerInputs`]), so that the backward computes dW from them
//!   and no `x` travels twice. Linears fed the same `x` (attention's query, key and value)
//!   share one copy: the later forwards find it by `x`'s identity and send nothing. They are
//!   released with the record's own `x`, and only the newest record of a weight keeps them (an
//!   evaluation forward on an input the caller keeps holds them until that weight's next
//!   forward at most). Where they are gone (released under activation checkpointing, or
//!   dropped), the backward sends `x` again. Every rank runs the same graph, so every rank
//!   keeps (or releases) its peers' inputs at the same points, and each knows without asking
//!   whether its owners still hold its `x`.
//! * **Released inputs.** Once nothing but records holds a record's `x`, the record lets it
//!   go and keeps only the layouts: under activation checkpointing
//!   (`Autodiff<_, BalancedCheckpointing>`) autodiff drops a memory-bound `x` after the
//!   forward and recomputes it for the backward, and holding it here would undo the saving.
//!   Of the released records of one weight only the newest stays, so a forward whose
//!   backward never comes (evaluation) leaves at most one small record per weight. The
//!   check runs at every record and guess, and whenever the rank makes a local tensor while
//!   some record holds its `x` (`RankCtx::release_inputs`), so the last Linear's input does
//!   not outlive its forward either.
//! * **The first call runs the pass.** `linear_x_backward(w, dy)` looks for a record with the
//!   same weight and `dy`'s leading dimensions (the most recent one if several). With the
//!   record's `x` it computes dX, dW and db in one pass. Without it (a released input) it
//!   computes dX, and leaves the record's layouts under `dy` for the weight's call, which
//!   then sends dW and db around the ring in a pass of their own (no weight rotates twice).
//!   `linear_weight_backward(x, dy)`, when it comes first (x not tracked), computes dW and db.
//! * **Later calls claim by identity.** dW is handed out only to the call whose `x` *and*
//!   `dy` are the very tensors it was computed from; db only to the call with the same `dy`.
//!   Anything else computes its own gradient, so a wrong guess costs a pass, never a wrong
//!   gradient. Layouts come from the record (the weight that was used), never from a shape.

use crate::state::accounting::Charge;
use crate::state::accounting::{Float, Held};
use crate::state::sharding::Layout;
use burn::tensor::backend::Backend;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Forward records kept at most: far more Linear calls than one graph of a large model holds.
const MAX_RECORDS: usize = 4096;

/// Linear forwards that may decide to rotate from the rows the ranks last agreed before they
/// agree again: an agreement synchronises every rank (about a millisecond with 4 processes on
/// 2 cores, 3% of config A's step if every forward agreed), and rotation is right whatever
/// the rows, so a stale figure costs at most a better choice for this many forwards. A
/// forward that would route agrees every time: routing needs every rank's shape.
pub(crate) const DECIDE_FROM_LAST: usize = 32;

/// Identity of a tensor: the charge all its clones share.
pub(crate) type Identity = Weak<Charge>;

/// A gradient kept for a later call: the charged inner tensor and its layout. (The pairing
/// lives in the rank's context, so it holds tensors without their handle to that context.)
pub(crate) type Placed<B> = (Held<B>, Layout);

/// What the pairing reads of a Linear's operands; the float tensor primitive implements it.
pub(crate) trait Operand<B: Backend> {
    /// Identity shared by the tensor and its clones.
    fn identity(&self) -> Identity;
    /// Logical shape.
    fn dims(&self) -> Vec<usize>;
    /// Where its elements live.
    fn layout(&self) -> &Layout;
    /// A charged handle to the tensor, for a record that keeps it.
    fn keep(&self) -> Held<B>;
}

fn same(a: &Identity, b: &Identity) -> bool {
    Weak::ptr_eq(a, b)
}

/// Every peer's `x` of a routed forward, on this rank as the owner of its weight shards: at
/// index `p` rank `p`'s `x`, charged as an activation (`None` at this rank, whose own `x` is
/// the record's).
pub(crate) type PeerInputs<B> = Arc<Vec<Option<Held<B>>>>;

/// Every rank's input shape for one Linear call, in rank order, as the ranks agreed them
/// (`backend::ops::routed::agree_dims`): the shapes a routed pass expects from each peer, and
/// the rows `Routing::Auto` decides on. Linears fed the same `x`, and the backward, reuse them.
pub(crate) type WorldDims = Arc<Vec<Vec<usize>>>;

/// What the ranks knew alike when a Linear forward that may route decided its pass: every
/// rank's input shape, where they exchanged them, and the rows per rank the pass was decided
/// on. Every rank holds the same, so the backward decides alike from it.
#[derive(Debug, Clone)]
pub(crate) struct Agreed {
    /// Every rank's shape of `x`, where the forward agreed them.
    pub world: Option<WorldDims>,
    /// Rows per rank (the mean over ranks) the forward decided on.
    pub rows: f64,
}

/// What one Linear forward leaves for its backward.
pub(crate) struct Forward<B: Backend> {
    weight: Identity,
    x_id: Identity,
    /// `x` itself, for a rotating weight (its dW is computed in the dX pass).
    x: Option<Held<B>>,
    /// The peers' `x`, when the forward routed them here; released with `x`.
    peer_x: Option<PeerInputs<B>>,
    /// What the ranks agreed for this forward, where the strategy may route.
    agreed: Option<Agreed>,
    /// Shape of `x`.
    x_dims: Vec<usize>,
    /// Logical shape of the weight.
    weight_dims: Vec<usize>,
    /// Layout of the weight that was used.
    pub weight_layout: Layout,
    /// Layout of the bias, if there was one.
    pub bias_layout: Option<Layout>,
    /// Whether a backward pass already used this record's `x` on a guess.
    guessed: bool,
}

impl<B: Backend> Forward<B> {
    /// The record of `linear(x, weight, bias)`; `keep_x` holds `x` for the dX pass.
    pub fn new<T: Operand<B>>(x: &T, weight: &T, bias: Option<&T>, keep_x: bool) -> Self {
        Self {
            weight: weight.identity(),
            x_id: x.identity(),
            x: keep_x.then(|| x.keep()),
            peer_x: None,
            agreed: None,
            x_dims: x.dims(),
            weight_dims: weight.dims(),
            weight_layout: weight.layout().clone(),
            bias_layout: bias.map(|b| b.layout().clone()),
            guessed: false,
        }
    }

    /// Whether the weight this forward used still exists: if not, no backward can use the
    /// record (the optimizer replaced it).
    fn weight_alive(&self) -> bool {
        self.weight.strong_count() > 0
    }

    /// The peers' inputs the forward routed here, while the record holds its `x`.
    pub fn peer_x(&self) -> Option<PeerInputs<B>> {
        self.x.as_ref().and(self.peer_x.clone())
    }

    /// What the ranks agreed for this forward, if it may have routed.
    pub fn agreed(&self) -> Option<Agreed> {
        self.agreed.clone()
    }
}

/// Gradients computed ahead, waiting for the call that will ask for them.
pub(crate) struct Deferred<B: Backend> {
    /// The `x` dW was computed from (`None`: dW was not computed, see `weight_layout`).
    x: Option<Identity>,
    dy: Identity,
    /// The weight whose forward record the pass used, if it came from a guess.
    weight: Option<Identity>,
    /// dW, for `linear_weight_backward(x, dy)`.
    pub dw: Option<Placed<B>>,
    /// db, for `linear_bias_backward(dy)`.
    pub db: Option<Placed<B>>,
    /// Layout of the bias of the forward `dy` belongs to.
    pub bias_layout: Option<Layout>,
    /// Layout of the weight of that forward, when dX was computed without `x` (a released
    /// input): the weight's call computes dW by it.
    pub weight_layout: Option<Layout>,
    /// What the ranks agreed for that forward, if it may have routed.
    agreed: Option<Agreed>,
}

impl<B: Backend> Deferred<B> {
    /// Gradients computed from the tensors `x` and `dy`.
    pub fn new(x: Identity, dy: Identity, bias_layout: Option<Layout>) -> Self {
        Self {
            x: Some(x),
            dy,
            weight: None,
            dw: None,
            db: None,
            bias_layout,
            weight_layout: None,
            agreed: None,
        }
    }

    /// What a dX pass without the forward's `x` leaves for the calls that follow with the
    /// same `dy`: the layouts of that forward's weight and bias, and what its ranks agreed.
    pub fn layouts(dy: Identity, guess: Guess<B>) -> Self {
        Self {
            x: None,
            dy,
            weight: None,
            dw: None,
            db: None,
            bias_layout: guess.bias_layout,
            weight_layout: Some(guess.weight_layout),
            agreed: guess.agreed,
        }
    }
}

/// What a weight's call claims after a dX pass without `x`: the forward's weight and bias
/// layouts, and what its ranks agreed.
pub(crate) type Claimed = (Layout, Option<Layout>, Option<Agreed>);

/// What `linear_x_backward` found for its weight and `dy`.
pub(crate) struct Guess<B: Backend> {
    /// The forward's `x`, with its identity, unless the record released it.
    pub x: Option<(Identity, Float<B>)>,
    /// Layout of the weight that forward used.
    pub weight_layout: Layout,
    /// Layout of its bias, if it had one.
    pub bias_layout: Option<Layout>,
    /// The peers' inputs the forward routed to this rank, if it routed them and holds `x`.
    pub peer_x: Option<PeerInputs<B>>,
    /// What the ranks agreed for the forward, if it may have routed.
    pub agreed: Option<Agreed>,
}

/// One rank's forward records and deferred gradients.
pub(crate) struct Pairing<B: Backend> {
    forwards: Vec<Forward<B>>,
    deferred: Option<Deferred<B>>,
}

impl<B: Backend> Default for Pairing<B> {
    fn default() -> Self {
        Self {
            forwards: Vec::new(),
            deferred: None,
        }
    }
}

/// One rank's Linear records: the pairing itself, whether some record holds an input, and
/// which weights ran their backward as two passes.
pub(crate) struct LinearRecords<B: Backend> {
    /// Forward records and deferred gradients.
    pub(crate) pairing: Mutex<Pairing<B>>,
    /// Whether some forward record may hold a Linear input: checked (without a lock) each
    /// time the rank makes a local tensor.
    inputs_held: AtomicBool,
    /// The weight shapes whose Linear backward ran as two passes (dX, then dW on its own),
    /// because autodiff recomputed the input: the planner's probe reads them.
    pub(crate) split_passes: Mutex<Vec<Vec<usize>>>,
    /// The rows per rank the ranks last agreed, and how many forwards have decided from
    /// them since (see [`LinearRecords::recent_rows`]).
    last_rows: Mutex<Option<(f64, usize)>>,
    /// Whether the Linear forwards are noted, for the memory planner's probe.
    observing: AtomicBool,
    /// The Linear forwards noted since the last optimizer step, and those of the step before.
    calls: Mutex<(Vec<LinearCall>, Vec<LinearCall>)>,
}

/// One Linear forward with a sharded weight, as the memory planner's probe saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LinearCall {
    /// Rows of the input.
    pub rows: usize,
    /// The weight's input features.
    pub d_in: usize,
    /// The weight's output features.
    pub d_out: usize,
    /// Whether an earlier forward took the same input (attention's key and value after its
    /// query): routed, it sends and keeps no input of its own.
    pub shares_x: bool,
}

impl<B: Backend> Default for LinearRecords<B> {
    fn default() -> Self {
        Self {
            pairing: Mutex::new(Pairing::default()),
            inputs_held: AtomicBool::new(false),
            split_passes: Mutex::new(Vec::new()),
            last_rows: Mutex::new(None),
            observing: AtomicBool::new(false),
            calls: Mutex::new((Vec::new(), Vec::new())),
        }
    }
}

impl<B: Backend> LinearRecords<B> {
    /// Records a Linear forward.
    pub(crate) fn record_forward(&self, forward: Forward<B>) {
        let mut pairing = self.pairing.lock().unwrap();
        pairing.record(forward);
        self.inputs_held
            .store(pairing.release_inputs(), Ordering::Release);
    }

    /// The rows per rank the ranks last agreed, for a forward to decide from without
    /// agreeing, while fewer than [`DECIDE_FROM_LAST`] forwards have done so; each call
    /// counts as one. Every rank runs the same forwards, so every rank gets the same answer.
    pub(crate) fn recent_rows(&self) -> Option<f64> {
        let mut last = self.last_rows.lock().unwrap();
        let (rows, used) = last.as_mut()?;
        if *used >= DECIDE_FROM_LAST {
            return None;
        }
        *used += 1;
        Some(*rows)
    }

    /// Starts noting the Linear forwards (the memory planner's probe).
    pub(crate) fn observe(&self) {
        self.observing.store(true, Ordering::Release);
    }

    /// Notes a Linear forward, while observing.
    pub(crate) fn note(&self, call: impl FnOnce() -> LinearCall) {
        if self.observing.load(Ordering::Acquire) {
            self.calls.lock().unwrap().0.push(call());
        }
    }

    /// Marks the end of a training step: its forwards become the last step's.
    pub(crate) fn end_step(&self) {
        if self.observing.load(Ordering::Acquire) {
            let mut calls = self.calls.lock().unwrap();
            calls.1 = std::mem::take(&mut calls.0);
        }
    }

    /// The Linear forwards of the last training step (or, without an optimizer step, all
    /// those noted).
    pub(crate) fn observed(&self) -> Vec<LinearCall> {
        let calls = self.calls.lock().unwrap();
        if calls.1.is_empty() {
            calls.0.clone()
        } else {
            calls.1.clone()
        }
    }

    /// Notes the rows per rank the ranks just agreed.
    pub(crate) fn agreed_rows(&self, rows: f64) {
        *self.last_rows.lock().unwrap() = Some((rows, 0));
    }

    /// Lets the records go of inputs nothing else holds; skipped while the rank is inside a
    /// pairing call (the lock is taken).
    pub(crate) fn release_inputs(&self) {
        if !self.inputs_held.load(Ordering::Acquire) {
            return;
        }
        if let Ok(mut pairing) = self.pairing.try_lock() {
            self.inputs_held
                .store(pairing.release_inputs(), Ordering::Release);
        }
    }
}

/// Whether `x` and `dy` have the same leading dimensions (rows of one Linear call).
fn rows_match(x: &[usize], dy: &[usize]) -> bool {
    x.len() == dy.len() && x[..x.len() - 1] == dy[..dy.len() - 1]
}

impl<B: Backend> Pairing<B> {
    /// Records a forward, first releasing inputs only records hold, dropping records whose
    /// weight is gone and all but the newest released record of each weight, and the oldest
    /// records beyond [`MAX_RECORDS`] (forwards whose inputs a caller keeps but never
    /// differentiates: their backward, if it ever came, would fall back to a per-rank
    /// gradient, which `RtpOptimizer` averages).
    pub fn record(&mut self, forward: Forward<B>) {
        self.release_inputs();
        self.forwards.retain(Forward::weight_alive);
        // Only the newest record of a weight keeps its peers' inputs: a forward whose
        // backward never comes (evaluation on inputs the caller keeps) must not hold `N - 1`
        // copies of its input for as long as the caller holds it. An older use's backward
        // sends its `x` again; every rank drops the same ones.
        for f in self.forwards.iter_mut() {
            if same(&f.weight, &forward.weight) {
                f.peer_x = None;
            }
        }
        // Of the released records of one weight, the newest stays (one pass, newest first:
        // a model's records number six or so a block, and this runs at every Linear).
        let mut seen = HashSet::new();
        let keep: Vec<bool> = (self.forwards.iter().rev())
            .map(|f| f.x.is_some() || seen.insert(f.weight.as_ptr()))
            .collect();
        let mut keep = keep.into_iter().rev();
        self.forwards.retain(|_| keep.next().unwrap_or(true));
        if self.forwards.len() >= MAX_RECORDS {
            self.forwards.remove(0);
        }
        self.forwards.push(forward);
    }

    /// Lets go of every kept `x` that nothing but records holds (records of Linears fed the
    /// same `x`, such as attention's query, key and value, hold it together, so each one's
    /// hold is counted). Returns whether some record still holds its `x`.
    pub fn release_inputs(&mut self) -> bool {
        // One pass to count the holds, one to release: this runs whenever the rank makes a
        // local tensor while some record holds its input.
        let mut holds: HashMap<*const Charge, usize> = HashMap::new();
        for f in self.forwards.iter().filter(|f| f.x.is_some()) {
            *holds.entry(f.x_id.as_ptr()).or_default() += 1;
        }
        let mut any = false;
        for f in self.forwards.iter_mut().filter(|f| f.x.is_some()) {
            if f.x_id.strong_count() <= holds[&f.x_id.as_ptr()] {
                f.x = None;
                f.peer_x = None;
            } else {
                any = true;
            }
        }
        any
    }

    /// For `linear_x_backward(weight, dy)`: the record of the most recent forward with this
    /// weight and `dy`'s rows, preferring records no pass has guessed yet, with its `x` if it
    /// still holds it. The record stays, so that the weight's own backward call still finds
    /// it if the guess was wrong.
    pub fn guess_x(&mut self, weight: &impl Operand<B>, dy: &impl Operand<B>) -> Option<Guess<B>> {
        self.release_inputs();
        let id = weight.identity();
        let dims = dy.dims();
        let fits = |f: &Forward<B>| same(&f.weight, &id) && rows_match(&f.x_dims, &dims);
        let pick = self
            .forwards
            .iter()
            .rposition(|f| fits(f) && !f.guessed)
            .or_else(|| self.forwards.iter().rposition(fits))?;
        let f = &mut self.forwards[pick];
        f.guessed = true;
        Some(Guess {
            x: f.x.as_ref().map(|x| (f.x_id.clone(), x.get())),
            weight_layout: f.weight_layout.clone(),
            bias_layout: f.bias_layout.clone(),
            peer_x: f.peer_x(),
            agreed: f.agreed(),
        })
    }

    /// The peers' inputs that a live record of a routed forward of this same `x` holds, for
    /// a forward that routes it again (each owner has it already).
    pub fn peer_x_of(&mut self, x: &Identity) -> Option<PeerInputs<B>> {
        self.release_inputs();
        (self.forwards.iter().rev())
            .filter(|f| same(&f.x_id, x))
            .find_map(Forward::peer_x)
    }

    /// Whether a forward before the newest took this same `x`.
    pub fn x_seen_before(&self, x: &Identity) -> bool {
        self.forwards.iter().filter(|f| same(&f.x_id, x)).count() > 1
    }

    /// Every rank's shape of `x`, as a forward of this same `x` agreed them (attention's
    /// query, key and value share one agreement).
    pub fn world_of(&mut self, x: &Identity) -> Option<WorldDims> {
        (self.forwards.iter().rev())
            .filter(|f| same(&f.x_id, x))
            .find_map(|f| f.agreed.as_ref()?.world.clone())
    }

    /// Leaves in the newest record of `x` through `weight` (the one that forward made) what
    /// the ranks agreed, and the peers' inputs a routed forward received (while the record
    /// holds `x`).
    pub fn keep_routing(
        &mut self,
        x: &Identity,
        weight: &Identity,
        agreed: Agreed,
        peer_x: Option<PeerInputs<B>>,
    ) {
        let newest =
            (self.forwards.iter_mut().rev()).find(|f| same(&f.x_id, x) && same(&f.weight, weight));
        if let Some(f) = newest {
            f.agreed = Some(agreed);
            if f.x.is_some() {
                f.peer_x = peer_x;
            }
        }
    }

    /// Stores gradients computed ahead; any older ones were never asked for and go.
    pub fn defer(&mut self, deferred: Deferred<B>) {
        self.deferred = Some(deferred);
    }

    /// Stores gradients that the pass of `weight`'s backward computed ahead from its guess.
    pub fn defer_guessed(&mut self, mut deferred: Deferred<B>, weight: &impl Operand<B>) {
        deferred.weight = Some(weight.identity());
        self.deferred = Some(deferred);
    }

    /// For `linear_weight_backward(x, dy)`: dW computed ahead from these very tensors.
    pub fn claim_weight(&mut self, x: &impl Operand<B>, dy: &impl Operand<B>) -> Option<Placed<B>> {
        let d = self.deferred.as_mut()?;
        let from_x = d.x.as_ref().is_some_and(|id| same(id, &x.identity()));
        if !(from_x && same(&d.dy, &dy.identity())) {
            return None;
        }
        let dw = d.dw.take()?;
        // The record the guess used: the same x through the same weight. (Another layer fed
        // the same x, with a weight of the same shape, keeps its own record.)
        if let Some(weight) = d.weight.clone() {
            let x_id = x.identity();
            if let Some(i) = self
                .forwards
                .iter()
                .rposition(|f| same(&f.x_id, &x_id) && same(&f.weight, &weight))
            {
                self.forwards.remove(i);
            }
        }
        Some(dw)
    }

    /// For `linear_weight_backward(x, dy)` after a dX pass without `x`: the layouts of the
    /// weight and bias of the forward `dy` belongs to, and what its ranks agreed.
    pub fn claim_layouts(&mut self, dy: &impl Operand<B>) -> Option<Claimed> {
        let d = self.deferred.as_ref()?;
        if !same(&d.dy, &dy.identity()) {
            return None;
        }
        let weight = d.weight_layout.clone()?;
        let claimed = (weight, d.bias_layout.clone(), d.agreed.clone());
        self.deferred = None;
        Some(claimed)
    }

    /// For `linear_weight_backward(x, dy)` without a deferred dW: removes and returns the
    /// record of the forward `x` went through with a weight of shape `[x_last, dy_last]`.
    pub fn take_forward(
        &mut self,
        x: &impl Operand<B>,
        dy: &impl Operand<B>,
    ) -> Option<Forward<B>> {
        let id = x.identity();
        let (xd, dd) = (x.dims(), dy.dims());
        let shape = [xd[xd.len() - 1], dd[dd.len() - 1]];
        let pick = self.forwards.iter().rposition(|f| {
            same(&f.x_id, &id) && f.weight_dims == shape && rows_match(&f.x_dims, &dd)
        })?;
        Some(self.forwards.remove(pick))
    }

    /// For `linear_bias_backward(dy)`: db computed ahead from this `dy`, or, if none was, the
    /// layout of the bias of the forward `dy` belongs to (when known). Either way the
    /// deferred gradients are done with.
    pub fn claim_bias(&mut self, dy: &impl Operand<B>) -> (Option<Placed<B>>, Option<Layout>) {
        match self.deferred.take() {
            Some(d) if same(&d.dy, &dy.identity()) => (d.db, d.bias_layout),
            other => {
                self.deferred = other;
                (None, None)
            }
        }
    }
}
