//! A Linear's backward is one ring pass (N - 1 exchanges), and the pairing of Burn's three
//! backward calls never hands a gradient to the wrong call: every case is compared with
//! single-device Burn, gradient by gradient, including the input's.

mod common;

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn_rtp::{launch, RotationMode, Routing, Rtp, RtpConfig};
use common::{load_bytes, rel_close, seeded, to_bytes};

type Dist = burn::backend::Autodiff<Rtp<burn::backend::NdArray>>;
type Single = burn::backend::Autodiff<burn::backend::NdArray>;

/// Uneven for every N tested: 3, 4 and 8 do not divide 22, and 22 / 2 is odd.
const D_IN: usize = 13;
const D_OUT: usize = 22;
const ROWS: usize = 5;

#[derive(Module, Debug)]
struct Pair<B: Backend> {
    a: Linear<B>,
    b: Linear<B>,
}

impl<B: Backend> Pair<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            a: LinearConfig::new(D_IN, D_OUT).init(device),
            b: LinearConfig::new(D_IN, D_OUT).init(device),
        }
    }
}

/// How the layers are used, and what is frozen or untracked.
#[derive(Debug, Clone, Copy)]
enum Case {
    /// `a(x1)`.
    One,
    /// `a(x1)` and `a(x2)`: one weight, two inputs.
    SharedWeight,
    /// `3 a(2 x2) + a(x1)`: the first use is deeper in the graph, so its backward comes
    /// first although its forward was not the latest: the pass guesses the wrong `x`, and
    /// only the identity check keeps its dW from the wrong call.
    SharedWeightOutOfOrder,
    /// `b(x1) * a(x1)` with `a` computed first: one input, two weights of the same shape.
    SharedInput,
    /// `a(x1)` with `a` frozen (weight and bias) and `x1` tracked.
    FrozenLayer,
    /// `a(x1)` with only `a`'s weight frozen.
    FrozenWeight,
    /// `a(x1)` with `x1` not tracked.
    UntrackedInput,
}

fn input<B: Backend>(seed: usize, device: &B::Device) -> Tensor<B, 2> {
    let values = (0..ROWS * D_IN)
        .map(|i| (((i * 7 + seed * 13) % 17) as f32 - 8.0) / 8.0)
        .collect::<Vec<_>>();
    Tensor::from_data(TensorData::new(values, [ROWS, D_IN]), device)
}

/// Every gradient the case produces, in a fixed order, as plain vectors.
/// Also returns what `exchanges` counted across the backward alone.
fn gradients<B: burn::tensor::backend::AutodiffBackend>(
    case: Case,
    model: Pair<B>,
    device: &B::Device,
    exchanges: impl Fn() -> u64,
) -> (Vec<Vec<f32>>, u64) {
    let mut model = model;
    match case {
        Case::FrozenLayer => model.a = model.a.no_grad(),
        Case::FrozenWeight => model.a.weight = model.a.weight.set_require_grad(false),
        _ => {}
    }
    let track = !matches!(case, Case::UntrackedInput);
    let x1 = input::<B>(1, device).set_require_grad(track);
    let x2 = input::<B>(2, device).require_grad();
    let square = |y: Tensor<B, 2>| (y.clone() * y).sum();
    let loss = match case {
        Case::SharedWeight => {
            square(model.a.forward(x1.clone()) + model.a.forward(x2.clone()) * 2.0)
        }
        Case::SharedWeightOutOfOrder => {
            let deeper = model.a.forward(x2.clone() * 2.0);
            // Scaled so that the two uses' output gradients differ.
            square(deeper * 3.0 + model.a.forward(x1.clone()))
        }
        Case::SharedInput => {
            // `a` runs first but is the right operand, so its backward also runs first, while
            // `b`'s forward record is the more recent one with the same x.
            let first = model.a.forward(x1.clone());
            let second = model.b.forward(x1.clone());
            square(second * first)
        }
        _ => square(model.a.forward(x1.clone())),
    };
    let before = exchanges();
    let grads = loss.backward();
    let during = exchanges() - before;
    let flat =
        |t: Option<Tensor<B::InnerBackend, 2>>| t.map(|t| t.into_data().to_vec::<f32>().unwrap());
    let flat1 =
        |t: Option<Tensor<B::InnerBackend, 1>>| t.map(|t| t.into_data().to_vec::<f32>().unwrap());
    let all = [
        flat(x1.grad(&grads)),
        flat(x2.grad(&grads)),
        flat(model.a.weight.grad(&grads)),
        model.a.bias.as_ref().and_then(|b| flat1(b.grad(&grads))),
        flat(model.b.weight.grad(&grads)),
        model.b.bias.as_ref().and_then(|b| flat1(b.grad(&grads))),
    ]
    .into_iter()
    .map(|g| g.unwrap_or_default())
    .collect();
    (all, during)
}

fn weights() -> Vec<u8> {
    to_bytes(seeded(
        Pair::<burn::backend::NdArray>::new(&Default::default()),
        11,
    ))
}

fn reference(case: Case) -> Vec<Vec<f32>> {
    let device = Default::default();
    let model = load_bytes(Pair::<Single>::new(&device), &weights(), &device);
    gradients(case, model, &device, || 0).0
}

/// Each rank's gradients and the exchanges its backward made.
fn distributed(case: Case, n: usize, mode: RotationMode) -> Vec<(Vec<Vec<f32>>, u64)> {
    let bytes = weights();
    launch(
        // The weights rotating: the exchanges counted are rotation's ring passes.
        RtpConfig::new(n)
            .with_shard_threshold(0)
            .with_rotation(mode)
            .with_routing(Routing::Weights),
        move |device| {
            let model = load_bytes(Pair::<Dist>::new(&device), &bytes, &device);
            gradients(case, model, &device, || device.exchanges())
        },
    )
    .expect("every rank runs")
}

const NAMES: [&str; 6] = ["dx1", "dx2", "dWa", "dba", "dWb", "dbb"];

fn check(case: Case, n: usize, mode: RotationMode) -> Vec<u64> {
    let want = reference(case);
    let runs = distributed(case, n, mode);
    for (rank, (got, _)) in runs.iter().enumerate() {
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.len(),
                w.len(),
                "{case:?} N={n} {mode:?} rank {rank}: {} has {} values, single-device {}",
                NAMES[k],
                g.len(),
                w.len()
            );
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                assert!(
                    rel_close(*a, *b, 1e-4),
                    "{case:?} N={n} {mode:?} rank {rank}: {} element {i}: {a} vs single-device {b}",
                    NAMES[k]
                );
            }
        }
    }
    runs.into_iter().map(|(_, e)| e).collect()
}

#[test]
fn every_pairing_case_equals_single_device_at_every_n() {
    for case in [
        Case::One,
        Case::SharedWeight,
        Case::SharedWeightOutOfOrder,
        Case::SharedInput,
        Case::FrozenLayer,
        Case::FrozenWeight,
        Case::UntrackedInput,
    ] {
        for n in [1, 2, 3, 4, 8] {
            for mode in [RotationMode::OutOfPlace, RotationMode::InPlace] {
                check(case, n, mode);
            }
        }
    }
}

#[test]
fn one_linear_backward_makes_n_minus_one_exchanges() {
    for n in [2, 3, 4, 8] {
        for mode in [RotationMode::OutOfPlace, RotationMode::InPlace] {
            // x tracked (dX, dW, db in one pass), x untracked (dW and db in one pass), and one
            // x into two layers of the same shape (one pass each: neither takes the other's
            // forward record).
            for (case, layers) in [
                (Case::One, 1),
                (Case::UntrackedInput, 1),
                (Case::SharedInput, 2),
            ] {
                let exchanges = check(case, n, mode);
                for (rank, e) in exchanges.iter().enumerate() {
                    assert_eq!(
                        *e,
                        layers * (n - 1) as u64,
                        "{case:?} N={n} {mode:?} rank {rank}: the backward of {layers} Linear(s) made {e} exchanges; one ring pass each makes N-1"
                    );
                }
            }
        }
    }
}

/// Per-column weights, so that every gain gets a different gradient.
fn column_weights<B: Backend>(device: &B::Device) -> Tensor<B, 2> {
    let values = (0..D_IN).map(|i| i as f32).collect::<Vec<_>>();
    Tensor::from_data(TensorData::new(values, [1, D_IN]), device)
}

#[test]
fn gradients_used_outside_rotated_ops_reach_their_shard_by_reduce_scatter() {
    use burn::nn::LayerNormConfig;
    use burn::optim::GradientsParams;
    for n in [2, 3, 4] {
        // Single-device reference: the gradient of the mean of the ranks' losses.
        let device = Default::default();
        let bytes = to_bytes(LayerNormConfig::new(D_IN).init::<burn::backend::NdArray>(&device));
        let ln = load_bytes(
            LayerNormConfig::new(D_IN).init::<Single>(&device),
            &bytes,
            &device,
        );
        let total = (0..n)
            .map(|r| {
                let y = ln.forward(input::<Single>(r + 3, &device));
                (y.clone() * y * column_weights::<Single>(&device)).sum()
            })
            .reduce(|a, b| a + b)
            .unwrap()
            / n as f32;
        let grads = total.backward();
        let want = ln
            .gamma
            .grad(&grads)
            .unwrap()
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let runs = launch(RtpConfig::new(n).with_shard_threshold(0), move |device| {
            let ln = load_bytes(
                LayerNormConfig::new(D_IN).init::<Dist>(&device),
                &bytes,
                &device,
            );
            let y = ln.forward(input::<Dist>(device.rank() + 3, &device));
            let loss = (y.clone() * y * column_weights::<Dist>(&device)).sum();
            let mut grads = GradientsParams::from_grads(loss.backward(), &ln);
            let before = device.exchanges();
            burn_rtp::sync_gradients::<_, Dist, burn::backend::NdArray>(&ln, &mut grads);
            let used = device.exchanges() - before;
            let g = grads
                .get::<Rtp<burn::backend::NdArray>, 1>(ln.gamma.id)
                .expect("gamma has a gradient");
            (g.into_data().to_vec::<f32>().unwrap(), used)
        })
        .expect("every rank runs");
        for (rank, (got, used)) in runs.iter().enumerate() {
            // gamma and beta: one reduce-scatter each, N - 1 exchanges apiece.
            assert_eq!(
                *used,
                2 * (n as u64 - 1),
                "N={n} rank {rank}: {used} exchanges"
            );
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    rel_close(*a, *b, 1e-4),
                    "N={n} rank {rank}: gamma grad {i}: {a} vs {b}"
                );
            }
        }
    }
}
