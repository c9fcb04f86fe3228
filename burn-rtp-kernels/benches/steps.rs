//! The rotation steps, fused against the compositions they replace, measured side by side.
//!
//! * On NdArray, one rotated Linear's forward and backward at N = 4: the concatenating
//!   composition burn-rtp used before (every shard's block kept, then `cat`) against the
//!   preallocated one (each shard's columns written into one output), both composed of Burn
//!   ops; then one rotated Linear's forward and weight-gradient steps on NdArray's native
//!   GEMM, with X packed once per pass against packed again by every step; then each step,
//!   NdArray's native GEMM on strided views against the composition.
//! * With `--features wgpu` (or `cuda`), each step on that backend: the fused `#[cube]` kernel against the
//!   composition of Burn ops it replaces (Burn's matmul, then slice-assign, add or a second
//!   pass for the bias). CI runs this on Mesa's lavapipe, a CPU rasteriser: its timings say
//!   little about a GPU, only that the fused path is not slower where it should not be.
//!
//! Shapes: the GPT's config A (512 tokens per rank, d_model 256, MLP 256 → 1024, vocabulary
//! 256) and d_model 1024 with 512 tokens per rank (1024 → 4096), and on CUDA also d_model 4096
//! (4096 → 16384), each at N = 4, on the last
//! shard's window (the right edge). Criterion measures each variant; then the two variants
//! of each step run in alternating rounds and the table of median times and their ratio is
//! printed. The bytes are counted from the tensors each variant must read and write (not
//! measured), in MiB. `RTP_BENCH_QUICK=1` shortens everything (CI).

use burn::backend::NdArray;
use burn::tensor::backend::Backend;
use burn::tensor::ops::ModuleOps;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use burn_rtp_kernels::generic;
use burn_rtp_kernels::{
    assemble_columns, embedding_grad_step, embedding_step, forward_step, output_for_columns,
    pack_x, weight_grad_step, x_grad_step, Float, RotationKernels, Window, XUse,
};
use criterion::Criterion;
use std::time::{Duration, Instant};

const SHARDS: usize = 4;

/// One shape of the bench.
#[derive(Clone, Copy)]
struct Dims {
    name: &'static str,
    tokens: usize,
    d_in: usize,
    d_out: usize,
    vocab: usize,
}

const SHAPES: [Dims; 2] = [
    Dims {
        name: "config A",
        tokens: 512,
        d_in: 256,
        d_out: 1024,
        vocab: 256,
    },
    Dims {
        name: "d_model 1024",
        tokens: 512,
        d_in: 1024,
        d_out: 4096,
        vocab: 1024,
    },
];

/// d_model 4096 (4096 → 16384), on GPUs only: too slow for a CPU rasteriser in CI.
#[cfg(feature = "cuda")]
const LARGE: Dims = Dims {
    name: "d_model 4096",
    tokens: 512,
    d_in: 4096,
    d_out: 16384,
    vocab: 4096,
};

fn quick() -> bool {
    std::env::var("RTP_BENCH_QUICK").is_ok_and(|v| v != "0")
}

/// Operands of every step at one shape, on one backend.
struct Inputs<B: Backend> {
    x: Float<B>,
    shards: Vec<Float<B>>,
    biases: Vec<Float<B>>,
    dy: Float<B>,
    acc: Float<B>,
    table: Float<B>,
    tokens: B::IntTensorPrimitive,
    emb_dy: Float<B>,
    d: Dims,
}

fn random<B: Backend>(dims: [usize; 2], device: &B::Device) -> Float<B> {
    Tensor::<B, 2>::random(dims, Distribution::Default, device)
        .into_primitive()
        .tensor()
}

impl<B: RotationKernels> Inputs<B> {
    fn new(d: Dims, device: &B::Device) -> Self {
        let w = d.d_out / SHARDS;
        let ids: Vec<i64> = (0..d.tokens)
            .map(|t| ((t * 7919) % d.vocab) as i64)
            .collect();
        let e = d.d_in / SHARDS;
        Inputs {
            x: random::<B>([d.tokens, d.d_in], device),
            shards: (0..SHARDS)
                .map(|_| random::<B>([d.d_in, w], device))
                .collect(),
            biases: (0..SHARDS)
                .map(|_| {
                    Tensor::<B, 1>::random([w], Distribution::Default, device)
                        .into_primitive()
                        .tensor()
                })
                .collect(),
            dy: random::<B>([d.tokens, d.d_out], device),
            acc: random::<B>([d.tokens, d.d_in], device),
            table: random::<B>([d.vocab, e], device),
            tokens: Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [8, d.tokens / 8]), device)
                .into_primitive(),
            emb_dy: Tensor::<B, 3>::random(
                [8, d.tokens / 8, d.d_in],
                Distribution::Default,
                device,
            )
            .into_primitive()
            .tensor(),
            d,
        }
    }

    fn last(&self) -> Window {
        let w = self.d.d_out / SHARDS;
        Window::new(w * (SHARDS - 1), w)
    }

    fn emb_last(&self) -> Window {
        let e = self.d.d_in / SHARDS;
        Window::new(e * (SHARDS - 1), e)
    }
}

/// A step measured two ways: the kernel path the backend dispatches to, and the composition
/// of Burn ops.
struct Step {
    name: &'static str,
    /// (read, written) bytes of the fused and of the composed variant.
    bytes: fn(Dims) -> [(usize, usize); 2],
}

const F32: usize = 4;

const STEPS: [Step; 5] = [
    Step {
        name: "forward Y[win] = X·W_j + b_j",
        bytes: |d| {
            let (m, k, w) = (d.tokens, d.d_in, d.d_out / SHARDS);
            let read = m * k + k * w + w;
            // Composed: the block is written, then read and written again into the window.
            [(read, m * w), (read + m * w, 2 * m * w)].map(|(r, wr)| (r * F32, wr * F32))
        },
    },
    Step {
        name: "input grad dX += dY[win]·W_jᵀ",
        bytes: |d| {
            let (m, k, w) = (d.tokens, d.d_in, d.d_out / SHARDS);
            let read = m * w + k * w + m * k;
            // Composed: the product is written, then read with dX and added.
            [(read, m * k), (read + m * k, 2 * m * k)].map(|(r, wr)| (r * F32, wr * F32))
        },
    },
    Step {
        name: "weight grad Xᵀ·dY[win], Σ dY[win]",
        bytes: |d| {
            let (m, k, w) = (d.tokens, d.d_in, d.d_out / SHARDS);
            let read = m * k + m * w;
            // Composed: the bias sum reads the window a second time.
            [(read, k * w + w), (read + m * w, k * w + w)].map(|(r, wr)| (r * F32, wr * F32))
        },
    },
    Step {
        name: "embedding Y[win] = W_j[ids]",
        bytes: |d| {
            let (t, e) = (d.tokens, d.d_in / SHARDS);
            [(t + t * e, t * e), (t + 2 * t * e, 2 * t * e)].map(|(r, wr)| (r * F32, wr * F32))
        },
    },
    Step {
        name: "embedding grad G_j[ids] += dY[win]",
        bytes: |d| {
            let (t, e, v) = (d.tokens, d.d_in / SHARDS, d.vocab);
            // Both zero the gradient and read the window; the composition's select-add
            // reads and rewrites the gradient.
            [(t + t * e, v * e), (t + t * e + v * e, 2 * v * e)].map(|(r, wr)| (r * F32, wr * F32))
        },
    },
];

/// Runs step `s` once, fused (`true`: through the backend's dispatch) or composed.
fn run<B: RotationKernels>(s: usize, fused: bool, i: &Inputs<B>) -> Float<B> {
    let (x, w, b) = (
        i.x.clone(),
        i.shards[SHARDS - 1].clone(),
        i.biases[SHARDS - 1].clone(),
    );
    let win = i.last();
    match (s, fused) {
        (0, true) => {
            let y = output_for_columns::<B>(&i.x, i.d.d_out);
            forward_step::<B>(y, x, w, Some(b), win.start, None).expect("fits")
        }
        (0, false) => {
            let y = output_for_columns::<B>(&i.x, i.d.d_out);
            generic::linear::forward::<B>(y, x, w, Some(b), win)
        }
        (1, true) => x_grad_step::<B>(Some(i.acc.clone()), w, i.dy.clone(), win).expect("fits"),
        (1, false) => generic::linear::x_grad::<B>(Some(i.acc.clone()), w, i.dy.clone(), win),
        (2, true) => {
            weight_grad_step::<B>(x, i.dy.clone(), win, true, None)
                .expect("fits")
                .0
        }
        (2, false) => generic::linear::weight_grad::<B>(x, i.dy.clone(), win, true).0,
        (3, f) => {
            let dims = burn::tensor::Shape::new([8, i.d.tokens / 8, i.d.d_in]);
            let device = B::float_device(&i.x);
            let y = B::float_empty(dims, &device, burn::tensor::FloatDType::F32);
            let table = i.table.clone();
            if f {
                embedding_step::<B>(y, table, i.tokens.clone(), i.emb_last().start).expect("fits")
            } else {
                generic::embedding::forward::<B>(y, table, i.tokens.clone(), i.emb_last())
            }
        }
        (_, true) => {
            embedding_grad_step::<B>(i.d.vocab, i.emb_dy.clone(), i.tokens.clone(), i.emb_last())
                .expect("fits")
        }
        (_, false) => generic::embedding::grad::<B>(
            i.d.vocab,
            i.emb_dy.clone(),
            i.tokens.clone(),
            i.emb_last(),
        ),
    }
}

/// Median seconds per call of `a` and `b`, and the median of their per-round ratios, from
/// `rounds` rounds that alternate which runs first.
fn alternate(rounds: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64, f64) {
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed().as_secs_f64()
    };
    a();
    b();
    let (mut ta, mut tb, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (x, y) = if r % 2 == 0 {
            let x = time(&mut a);
            (x, time(&mut b))
        } else {
            let y = time(&mut b);
            (time(&mut a), y)
        };
        ta.push(x);
        tb.push(y);
        ratio.push(x / y);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|p, q| p.total_cmp(q));
        v[v.len() / 2]
    };
    (median(&mut ta), median(&mut tb), median(&mut ratio))
}

fn mib(bytes: usize) -> String {
    format!("{:.2}", bytes as f64 / (1 << 20) as f64)
}

fn criterion() -> Criterion {
    let c = Criterion::default().configure_from_args();
    if quick() {
        c.sample_size(10)
            .warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_millis(800))
    } else {
        c
    }
}

/// Each step on backend `B`, fused against composed; returns the table's rows.
fn steps_on<B: RotationKernels>(
    c: &mut Criterion,
    label: &str,
    device: &B::Device,
    shapes: &[Dims],
) -> Vec<String> {
    let mut rows = Vec::new();
    for &d in shapes {
        let inputs = Inputs::<B>::new(d, device);
        let sync = || B::sync(device).expect("sync");
        for (s, step) in STEPS.iter().enumerate() {
            let only = std::env::var("RTP_BENCH_ONLY").unwrap_or_default();
            if !format!("{} {}", d.name, step.name).contains(&only) {
                continue;
            }
            let mut group = c.benchmark_group(format!("{label}/{}/{}", d.name, step.name));
            group.bench_function("fused", |b| {
                b.iter(|| {
                    let y = run(s, true, &inputs);
                    sync();
                    y
                })
            });
            group.bench_function("composed", |b| {
                b.iter(|| {
                    let y = run(s, false, &inputs);
                    sync();
                    y
                })
            });
            group.finish();
            let reps = if quick() { 3 } else { 10 };
            let (tf, tc, ratio) = alternate(
                if quick() { 5 } else { 15 },
                || {
                    for _ in 0..reps {
                        drop(run(s, true, &inputs));
                    }
                    sync();
                },
                || {
                    for _ in 0..reps {
                        drop(run(s, false, &inputs));
                    }
                    sync();
                },
            );
            let [(fr, fw), (cr, cw)] = (step.bytes)(d);
            rows.push(format!(
                "| {label} | {} | {} | {:.3} | {:.3} | **{ratio:.2}** | {} / {} | {} / {} |",
                d.name,
                step.name,
                tf * 1e3 / reps as f64,
                tc * 1e3 / reps as f64,
                mib(fr),
                mib(fw),
                mib(cr),
                mib(cw),
            ));
        }
    }
    rows
}

/// Two variants of one rotated Linear's pass on NdArray, per shape: `pass(inputs, true)` and
/// `pass(inputs, false)` measured by criterion (group `ndarray/<shape>/<what>`, functions
/// `names`), then in alternating rounds; `row(shape, ms, ms, ratio)` is the table's row.
fn ndarray_pair(
    c: &mut Criterion,
    what: &str,
    names: [&str; 2],
    pass: impl Fn(&Inputs<NdArray>, bool),
    row: impl Fn(Dims, f64, f64, f64) -> String,
) -> Vec<String> {
    let device = Default::default();
    let mut rows = Vec::new();
    for d in SHAPES {
        let i = Inputs::<NdArray>::new(d, &device);
        let mut group = c.benchmark_group(format!("ndarray/{}/{what}", d.name));
        group.bench_function(names[0], |b| b.iter(|| pass(&i, true)));
        group.bench_function(names[1], |b| b.iter(|| pass(&i, false)));
        group.finish();
        let rounds = if quick() { 5 } else { 15 };
        let (ta, tb, ratio) = alternate(rounds, || pass(&i, true), || pass(&i, false));
        rows.push(row(d, ta * 1e3, tb * 1e3, ratio));
    }
    rows
}

/// NdArray: one rotated Linear's forward and backward at N = 4, the preallocated composition
/// against the concatenating one (both composed of Burn ops, as before the native steps;
/// those are measured step by step in [`steps_on`]).
fn linear_on_ndarray(c: &mut Criterion) -> Vec<String> {
    type B = NdArray;
    let backward = |i: &Inputs<B>| {
        let w = i.d.d_out / SHARDS;
        let mut dx = None;
        let mut grads = Vec::new();
        for (j, w_j) in i.shards.iter().enumerate() {
            let win = Window::new(j * w, w);
            dx = Some(generic::linear::x_grad::<B>(
                dx,
                w_j.clone(),
                i.dy.clone(),
                win,
            ));
            grads.push(generic::linear::weight_grad::<B>(
                i.x.clone(),
                i.dy.clone(),
                win,
                true,
            ));
        }
        (dx, grads)
    };
    let pass = |i: &Inputs<B>, preallocated: bool| {
        let y = if preallocated {
            let w = i.d.d_out / SHARDS;
            let mut y = output_for_columns::<B>(&i.x, i.d.d_out);
            for (j, (w_j, b_j)) in i.shards.iter().zip(&i.biases).enumerate() {
                let (x, b_j, win) = (i.x.clone(), Some(b_j.clone()), Window::new(j * w, w));
                y = generic::linear::forward::<B>(y, x, w_j.clone(), b_j, win);
            }
            y
        } else {
            let blocks = i
                .shards
                .iter()
                .zip(&i.biases)
                .map(|(w_j, b_j)| B::linear(i.x.clone(), w_j.clone(), Some(b_j.clone())))
                .collect();
            assemble_columns::<B>(blocks, 1)
        };
        drop((y, backward(i)));
    };
    let names = ["preallocated", "concatenating"];
    ndarray_pair(
        c,
        "rotated linear forward+backward",
        names,
        pass,
        |d, tp, tc, ratio| {
            // Forward only differs: concatenating holds every block and copies them once more.
            let out = d.tokens * d.d_out * F32;
            format!(
            "| ndarray | {} | rotated Linear fwd+bwd, N = 4: preallocated vs concatenating | {tp:.3} | {tc:.3} | **{ratio:.2}** | writes {} | writes {} |",
            d.name,
            mib(2 * out),
            mib(3 * out),
        )
        },
    )
}

/// NdArray: one rotated Linear's forward and weight-gradient steps at N = 4 on the native
/// GEMM, with X packed once for each pass (`pack_x`, as the decorator does) against packed
/// again by every step (as a GEMM call does by itself).
fn packed_x_on_ndarray(c: &mut Criterion) -> Vec<String> {
    type B = NdArray;
    let pass = |i: &Inputs<B>, once: bool| {
        let (d, w) = (i.d, i.d.d_out / SHARDS);
        let packed = |use_| once.then(|| pack_x::<B>(&i.x, use_)).flatten();
        let (fwd, dw) = (packed(XUse::Forward), packed(XUse::WeightGrad));
        let mut y = output_for_columns::<B>(&i.x, d.d_out);
        let mut grads = Vec::new();
        for (j, (w_j, b_j)) in i.shards.iter().zip(&i.biases).enumerate() {
            let (x, b_j) = (i.x.clone(), Some(b_j.clone()));
            y = forward_step::<B>(y, x, w_j.clone(), b_j, j * w, fwd.as_ref()).expect("fits");
            let win = Window::new(j * w, w);
            let g = weight_grad_step::<B>(i.x.clone(), i.dy.clone(), win, true, dw.as_ref());
            grads.push(g.expect("fits"));
        }
        drop((y, grads));
    };
    let what = "rotated linear forward + weight grad (native)";
    let names = ["X packed once", "X packed per step"];
    ndarray_pair(c, what, names, pass, |d, once, each, ratio| {
        let x = mib(d.tokens * d.d_in * F32);
        format!(
            "| ndarray (native) | {} | rotated Linear fwd + dW, N = 4: X packed once vs per step | {once:.3} | {each:.3} | **{ratio:.2}** | packs {x} twice | packs {x} {} times |",
            d.name,
            2 * SHARDS,
        )
    })
}

fn main() {
    let mut c = criterion();
    let mut rows = if std::env::var("RTP_BENCH_ONLY").is_ok() {
        Vec::new()
    } else {
        let mut rows = linear_on_ndarray(&mut c);
        rows.extend(packed_x_on_ndarray(&mut c));
        rows
    };
    rows.extend(steps_on::<NdArray>(
        &mut c,
        "ndarray (native)",
        &Default::default(),
        &SHAPES,
    ));
    #[cfg(feature = "wgpu")]
    let rows = {
        use burn::backend::wgpu::{Wgpu, WgpuDevice};
        let mut rows = rows;
        let device = WgpuDevice::default();
        rows.extend(steps_on::<Wgpu>(
            &mut c,
            "wgpu (lavapipe)",
            &device,
            &SHAPES,
        ));
        rows
    };
    #[cfg(feature = "cuda")]
    let rows = {
        use burn::backend::cuda::{Cuda, CudaDevice};
        let mut rows = rows;
        let device = CudaDevice::default();
        let shapes = [SHAPES[0], SHAPES[1], LARGE];
        rows.extend(steps_on::<Cuda>(&mut c, "cuda", &device, &shapes));
        rows
    };
    c.final_summary();
    println!();
    println!("Rotation steps, side by side (median of alternating rounds; ms per call):");
    println!("| backend | shape | step | fused / new ms | composed / old ms | ratio | new MiB read / written | old MiB read / written |");
    println!("|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    println!();
    println!("Bytes are counted from the tensors each variant must read and write, not measured.");
    println!(
        "wgpu runs on Mesa's lavapipe here (a CPU rasteriser): its timings say little about a GPU."
    );
}
