//! GELU through the decorator on NdArray. With the one-pass steps (the default), forward and
//! backward agree with single-device Burn within burn-rtp-kernels' stated bound, on a local
//! tensor and behind a Linear whose weight is sharded, at N = 1, 2 and 3 on dimensions that N
//! does not divide. With `with_fused_activations(false)` they are Burn's bits.

use burn::backend::{Autodiff, NdArray};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::gelu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use burn_rtp::{launch, Rtp, RtpConfig};

type RefB = Autodiff<NdArray>;
type Dist = Autodiff<Rtp<NdArray>>;

const ROWS: usize = 7;
const D_IN: usize = 11;
const D_OUT: usize = 13;

/// Inputs spanning GELU's curved region and both tails, with every mantissa bit in use.
fn inputs() -> TensorData {
    let values: Vec<f32> = (0..ROWS * D_IN)
        .map(|i| ((i as f32 * 0.618_034).fract() - 0.5) * 13.0 + i as f32 * 1e-4)
        .collect();
    TensorData::new(values, [ROWS, D_IN])
}

/// GELU's output, the input's gradient of its sum, and the gradient of a Linear's weight
/// (sharded when N > 1) through the sum of `gelu(x W + b)`, all as plain values.
struct Run {
    out: Vec<f32>,
    x_grad: Vec<f32>,
    w_grad: Vec<f32>,
}

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().expect("f32 values")
}

fn run<B: AutodiffBackend>(device: &B::Device, weights: TensorData, bias: TensorData) -> Run {
    let x = Tensor::<B, 2>::from_data(inputs(), device).require_grad();
    let mut linear: Linear<B> = LinearConfig::new(D_IN, D_OUT).init(device);
    linear.weight = linear
        .weight
        .map(|_| Tensor::from_data(weights, device).require_grad());
    if let Some(b) = linear.bias.take() {
        linear.bias = Some(b.map(|_| Tensor::from_data(bias, device).require_grad()));
    }
    let out = gelu(x.clone());
    // The input is detached here, so its gradient is GELU's derivative alone.
    let through = gelu(linear.forward(x.clone().detach()));
    let loss = out.clone().sum() + through.sum();
    let grads = loss.backward();
    let x_grad = x.grad(&grads).expect("x is tracked");
    let w_grad = linear.weight.grad(&grads).expect("the weight is tracked");
    Run {
        out: values(out),
        x_grad: values(x_grad),
        w_grad: values(w_grad),
    }
}

/// Weights and bias from a formula (not Burn's seeded generator, which tests running in
/// parallel share), so every run starts from the same Linear.
fn linear_data() -> (TensorData, TensorData) {
    let wave = |i: usize, k: f32| ((i as f32 * k).sin() * 1.7).clamp(-1.5, 1.5);
    let w: Vec<f32> = (0..D_IN * D_OUT).map(|i| wave(i, 0.37)).collect();
    let b: Vec<f32> = (0..D_OUT).map(|i| wave(i, 1.3)).collect();
    (
        TensorData::new(w, [D_IN, D_OUT]),
        TensorData::new(b, [D_OUT]),
    )
}

fn reference() -> Run {
    let (w, b) = linear_data();
    run::<RefB>(&Default::default(), w, b)
}

fn distributed(config: RtpConfig) -> Vec<Run> {
    let (w, b) = linear_data();
    launch(config, |device| run::<Dist>(&device, w.clone(), b.clone())).expect("the world runs")
}

/// The elements whose difference exceeds `bound(index, want)`.
fn beyond(got: &[f32], want: &[f32], bound: impl Fn(usize, f32) -> f32) -> Vec<(usize, f32, f32)> {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .enumerate()
        .filter(|(i, (g, w))| (*g - *w).abs() > bound(*i, **w))
        .map(|(i, (g, w))| (i, *g, *w))
        .collect()
}

#[test]
fn the_one_pass_gelu_matches_burn_within_its_bound() {
    let want = reference();
    let x = inputs().to_vec::<f32>().expect("f32 inputs");
    let eps = f32::EPSILON;
    let largest = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    for n in [1, 2, 3] {
        for (rank, got) in distributed(RtpConfig::new(n).with_shard_threshold(0))
            .into_iter()
            .enumerate()
        {
            let what = format!("N={n}, rank {rank}");
            // burn-rtp-kernels' bounds: 2 epsilons of max(|y|, |x|/2) forward, 5 of
            // max(|y'|, 1) backward.
            let forward = beyond(&got.out, &want.out, |i, w| {
                2.0 * eps * w.abs().max(x[i].abs() / 2.0)
            });
            assert!(forward.is_empty(), "{what}: forward {forward:?}");
            let backward = beyond(&got.x_grad, &want.x_grad, |_, w| {
                5.0 * eps * w.abs().max(1.0)
            });
            assert!(backward.is_empty(), "{what}: backward {backward:?}");
            // A weight's gradient sums 7 rows of x times GELU's derivative, in the same order
            // on both sides: each term within the derivative's bound (|y'| < 1.13), plus the
            // sum's own rounding.
            let sum_bound = 6.0 * eps * 1.13 * largest * ROWS as f32;
            let weight = beyond(&got.w_grad, &want.w_grad, |_, _| sum_bound);
            assert!(weight.is_empty(), "{what}: weight gradient {weight:?}");
        }
    }
}

#[test]
fn without_the_one_pass_gelu_the_bits_are_burns() {
    let want = reference();
    for n in [1, 3] {
        let config = RtpConfig::new(n)
            .with_shard_threshold(0)
            .with_fused_activations(false);
        for (rank, got) in distributed(config).into_iter().enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got.out),
                bits(&want.out),
                "N={n}, rank {rank}: forward"
            );
            assert_eq!(
                bits(&got.x_grad),
                bits(&want.x_grad),
                "N={n}, rank {rank}: backward"
            );
        }
    }
}
