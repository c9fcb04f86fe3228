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
//!   backward anyway; a record whose `x` nobody else holds is dropped).
//! * **The first call runs the pass.** `linear_x_backward(w, dy)` looks for a record with the
//!   same weight whose `x` has `dy`'s leading dimensions (the most recent one if several) and
//!   computes dX, dW and db in one pass. `linear_weight_backward(x, dy)`, when it comes first
//!   (x not tracked), computes dW and db.
//! * **Later calls claim by identity.** dW is handed out only to the call whose `x` *and*
//!   `dy` are the very tensors it was computed from; db only to the call with the same `dy`.
//!   Anything else computes its own gradient, so a wrong guess costs a pass, never a wrong
//!   gradient. Layouts come from the record (the weight that was used), never from a shape.

use crate::state::accounting::Charge;
use crate::state::accounting::{Float, Held};
use crate::state::sharding::Layout;
use burn::tensor::backend::Backend;
use std::sync::Weak;

/// Forward records kept at most: far more Linear calls than one graph of a large model holds.
const MAX_RECORDS: usize = 4096;

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

/// What one Linear forward leaves for its backward.
pub(crate) struct Forward<B: Backend> {
    weight: Identity,
    x_id: Identity,
    /// `x` itself, for a rotating weight (its dW is computed in the dX pass).
    x: Option<Held<B>>,
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
            x_dims: x.dims(),
            weight_dims: weight.dims(),
            weight_layout: weight.layout().clone(),
            bias_layout: bias.map(|b| b.layout().clone()),
            guessed: false,
        }
    }

    /// Whether anyone but this record still holds `x`: if not, its backward can never come.
    fn alive(&self) -> bool {
        match &self.x {
            Some(_) => self.x_id.strong_count() > 1,
            None => self.x_id.strong_count() > 0,
        }
    }
}

/// Gradients computed ahead, waiting for the call that will ask for them.
pub(crate) struct Deferred<B: Backend> {
    x: Identity,
    dy: Identity,
    /// The weight whose forward record the pass used, if it came from a guess.
    weight: Option<Identity>,
    /// dW, for `linear_weight_backward(x, dy)`.
    pub dw: Option<Placed<B>>,
    /// db, for `linear_bias_backward(dy)`.
    pub db: Option<Placed<B>>,
    /// Layout of the bias of the forward `dy` belongs to.
    pub bias_layout: Option<Layout>,
}

impl<B: Backend> Deferred<B> {
    /// Gradients computed from the tensors `x` and `dy`.
    pub fn new(x: Identity, dy: Identity, bias_layout: Option<Layout>) -> Self {
        Self {
            x,
            dy,
            weight: None,
            dw: None,
            db: None,
            bias_layout,
        }
    }
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

/// Whether `x` and `dy` have the same leading dimensions (rows of one Linear call).
fn rows_match(x: &[usize], dy: &[usize]) -> bool {
    x.len() == dy.len() && x[..x.len() - 1] == dy[..dy.len() - 1]
}

impl<B: Backend> Pairing<B> {
    /// Records a forward, dropping records whose backward can no longer come, and the
    /// oldest ones beyond [`MAX_RECORDS`] (forwards whose inputs a caller keeps but never
    /// differentiates: their backward, if it ever came, would fall back to a per-rank
    /// gradient, which `RtpOptimizer` averages).
    pub fn record(&mut self, forward: Forward<B>) {
        self.forwards.retain(Forward::alive);
        if self.forwards.len() >= MAX_RECORDS {
            self.forwards.remove(0);
        }
        self.forwards.push(forward);
    }

    /// For `linear_x_backward(weight, dy)`: the `x` of the most recent forward with this
    /// weight and `dy`'s rows, preferring records no pass has guessed yet. The record stays,
    /// so that the weight's own backward call still finds it if the guess was wrong.
    pub fn guess_x(
        &mut self,
        weight: &impl Operand<B>,
        dy: &impl Operand<B>,
    ) -> Option<(Identity, Float<B>, Option<Layout>)> {
        let id = weight.identity();
        let dims = dy.dims();
        let fits =
            |f: &Forward<B>| same(&f.weight, &id) && f.x.is_some() && rows_match(&f.x_dims, &dims);
        let pick = self
            .forwards
            .iter()
            .rposition(|f| fits(f) && !f.guessed)
            .or_else(|| self.forwards.iter().rposition(fits))?;
        let f = &mut self.forwards[pick];
        f.guessed = true;
        let x = f.x.as_ref().map(Held::get)?;
        Some((f.x_id.clone(), x, f.bias_layout.clone()))
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
        if !(same(&d.x, &x.identity()) && same(&d.dy, &dy.identity())) {
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
