//! What routing the activations changes in a plan (RTP under `Routing::Activations`, or
//! `Auto` where it routes): which Linear passes route at a world size and batch, the peers'
//! inputs their owners keep from the forward to the backward, and the routed passes' buffers.
//!
//! The probe notes every Linear forward of its last step (rows, features, and whether it took
//! an input an earlier forward took). At `N` ranks and `b` samples per rank each pass is
//! decided as the ranks decide it (`backend::strategy::rtp::routes`, on `b` times the rows
//! per sample), and:
//!
//! * a routed forward's owner keeps its `N - 1` peers' inputs, `(N - 1) · rows · d_in`
//!   elements, until the backward (once per input: Linears fed the same one share it); all
//!   are alive at the end of the forward and the start of the backward. Under activation
//!   checkpointing an input autodiff recomputes (its weight's backward ran as two passes in
//!   the probe) is released with its peers' copies, and the backward receives it again;
//! * a routed forward holds the column blocks it computes for every rank and those it
//!   receives, about `(2 - 1/N) · rows · d_out`. A routed backward first holds `dy`'s columns
//!   received, `(N - 1)/N · rows · d_out`, the inputs received where the owner no longer
//!   holds them, `(N - 1) · rows · d_in`, and the dX partials it computes for every rank,
//!   `N · rows · d_in`; then those partials and the ones it receives, `(2N - 1) · rows · d_in`;
//! * a weight whose every pass routes never rotates, so it leaves rotation's buffers.
//!
//! Every backward is taken to compute dX and dW (a model's first Linear, fed data, computes
//! dW only, and may decide otherwise). The probe's step must step through
//! [`RtpOptimizer`](crate::RtpOptimizer), which marks where a step ends: otherwise it sees
//! every step's forwards, and counts each input as often.

use super::*;
use crate::backend::pairing::LinearCall;
use crate::backend::strategy::rtp::routes;
use crate::backend::strategy::LinearPass;
use crate::config::Routing;

/// Which passes of a Linear of `d_in x d_out` route its activations under `routing`, at
/// `rows` rows per rank (the mean over ranks) on `world` ranks, as every rank decides them:
/// `(forward, backward)`, the backward computing dX and dW after a forward that routed as
/// this one does. (`Routing::Auto` may decide from rows agreed up to 32 forwards before.)
pub fn linear_routes(
    routing: Routing,
    world: usize,
    rows: f64,
    d_in: usize,
    d_out: usize,
) -> (bool, bool) {
    let pass = |backward, x_on_owners| LinearPass {
        rows,
        d_in,
        d_out,
        backward,
        x_on_owners,
    };
    let forward = world > 1 && routes(routing, &pass(None, false), world);
    let backward = world > 1 && routes(routing, &pass(Some((true, true)), forward), world);
    (forward, backward)
}

/// A Linear forward the probe saw, its rows per sample of the batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ProbedCall {
    /// Rows of the input per sample.
    rows_per_sample: f64,
    /// The weight's input features.
    d_in: usize,
    /// The weight's output features.
    d_out: usize,
    /// Whether an earlier forward took the same input.
    shares_x: bool,
}

impl ProbedCall {
    /// `call`, seen at `batch` samples.
    pub(super) fn new(call: &LinearCall, batch: usize) -> Self {
        Self {
            rows_per_sample: call.rows as f64 / batch.max(1) as f64,
            d_in: call.d_in,
            d_out: call.d_out,
            shares_x: call.shares_x,
        }
    }
}

/// What routing adds to one prediction.
#[derive(Debug, Default)]
pub(super) struct RoutedPasses {
    /// Bytes of the peers' inputs the owners keep from the forward to the backward.
    pub kept: u64,
    /// The largest routed forward's buffers.
    pub forward: u64,
    /// The largest routed backward's buffers.
    pub backward: u64,
    /// The weights whose every pass routes: they never rotate.
    pub weights: Vec<Shape>,
}

impl Planner {
    /// What routing adds under `strategy` at `world` ranks and `batch` samples per rank,
    /// where the weights of shapes `recomputed` have their input recomputed (activation
    /// checkpointing).
    pub(super) fn routed(
        &self,
        strategy: Strategy,
        world: usize,
        batch: usize,
        recomputed: &[Shape],
    ) -> RoutedPasses {
        let mut out = RoutedPasses::default();
        let routing = self.config.routing;
        if strategy != Strategy::Rtp || world < 2 || routing == Routing::Weights {
            return out;
        }
        let (n, elem) = (world as f64, self.elem as f64);
        let bytes = |elements: f64| (elements * elem).round() as u64;
        // Whether the input of the current group (a forward and those sharing its input) is
        // on the owners already.
        let mut group_routed = false;
        let mut rotating: Vec<Shape> = Vec::new();
        for c in &self.calls {
            let rows = c.rows_per_sample * batch as f64;
            let (d_in, d_out) = (c.d_in as f64, c.d_out as f64);
            let pass = |backward, x_on_owners| LinearPass {
                rows,
                d_in: c.d_in,
                d_out: c.d_out,
                backward,
                x_on_owners,
            };
            let shape = Shape::new([c.d_in, c.d_out]);
            let released = recomputed.contains(&shape);
            let on_owners = c.shares_x && group_routed;
            let forward = routes(routing, &pass(None, on_owners), world);
            let kept = forward && !released;
            let backward = routes(routing, &pass(Some((true, true)), kept), world);
            if forward && !on_owners && !released {
                out.kept += bytes((n - 1.0) * rows * d_in);
            }
            group_routed = forward || on_owners;
            if forward {
                out.forward = out.forward.max(bytes((2.0 - 1.0 / n) * rows * d_out));
            }
            if backward {
                let x_in = if kept { 0.0 } else { (n - 1.0) * rows * d_in };
                let received = (n - 1.0) / n * rows * d_out + x_in + n * rows * d_in;
                let exchanged = (2.0 * n - 1.0) * rows * d_in;
                out.backward = out.backward.max(bytes(received.max(exchanged)));
            }
            let list = if forward && backward {
                &mut out.weights
            } else {
                &mut rotating
            };
            if !list.contains(&shape) {
                list.push(shape);
            }
        }
        out.weights.retain(|s| !rotating.contains(s));
        out
    }
}
