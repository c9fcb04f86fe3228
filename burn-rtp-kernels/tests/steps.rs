//! Every rotation step against a plain CPU reference (f64 loops over `Vec`s), on NdArray
//! (its native GEMMs on strided views for the Linear, the generic compositions for the
//! embedding; the native steps are also checked bit for bit against the compositions) and, with `--features wgpu` or `--features cuda`, on that cube
//! backend (the fused `#[cube]` kernels; wgpu runs on Mesa's lavapipe in CI). Shapes are
//! multiples of no tile size: 1 × 1, a window at the right edge, w = 1, d = 1000,
//! three-dimensional inputs.
//!
//! On cube backends each case also asserts that fused kernels ran (the launch counter moved), so a
//! kernel silently replaced by the generic path fails here.

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};
use burn_rtp_kernels::{
    embedding_grad_step, embedding_step, forward_step, fused_launches_on_this_thread, pack_x,
    weight_grad_step, weight_grad_summed, x_grad_step, ColumnError, Float, KernelPath,
    RotationKernels, Window, XUse,
};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn float<B: RotationKernels>(v: &[f32], shape: &[usize], device: &B::Device) -> Float<B> {
    let data = TensorData::new(v.to_vec(), shape.to_vec());
    match shape.len() {
        1 => Tensor::<B, 1>::from_data(data, device)
            .into_primitive()
            .tensor(),
        2 => Tensor::<B, 2>::from_data(data, device)
            .into_primitive()
            .tensor(),
        3 => Tensor::<B, 3>::from_data(data, device)
            .into_primitive()
            .tensor(),
        d => panic!("no {d}-d tensors here"),
    }
}

fn ints<B: RotationKernels>(
    v: &[i64],
    shape: &[usize],
    device: &B::Device,
) -> B::IntTensorPrimitive {
    let data = TensorData::new(v.to_vec(), shape.to_vec());
    match shape.len() {
        1 => Tensor::<B, 1, Int>::from_data(data, device).into_primitive(),
        2 => Tensor::<B, 2, Int>::from_data(data, device).into_primitive(),
        d => panic!("no {d}-d indices here"),
    }
}

fn read<B: RotationKernels>(t: Float<B>) -> Vec<f32> {
    Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t))
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 data")
}

fn flat<B: RotationKernels>(t: Float<B>) -> Vec<f32> {
    use burn::tensor::TensorMetadata;
    let n = t.shape().num_elements();
    read::<B>(B::float_reshape(t, burn::tensor::Shape::new([n])))
}

/// `got` equals `want` within f32 rounding of sums of `scale[i]` in magnitude.
fn assert_close(what: &str, got: &[f32], want: &[f64], scale: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-5 + 2e-6 * scale[i];
        assert!(
            (*g as f64 - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w} (tolerance {tol})"
        );
    }
}

/// Runs `f`, asserting that it ran on this crate's own kernels (this thread's launch counter
/// moved, which steps of tests running beside it on other threads cannot do) when `own` says
/// the backend has them for this step.
fn fused<T>(what: &str, own: bool, f: impl FnOnce() -> T) -> T {
    let before = fused_launches_on_this_thread();
    let out = f();
    if own {
        assert!(
            fused_launches_on_this_thread() > before,
            "{what}: no kernel of ours ran"
        );
    }
    out
}

/// One forward case: x `[lead.., d_in]`, a window of `w` columns at `start` of `cols`.
fn forward_case<B: RotationKernels>(
    lead: &[usize],
    d_in: usize,
    w: usize,
    cols: usize,
    start: usize,
    bias: bool,
    device: &B::Device,
) {
    let rows: usize = lead.iter().product();
    let xs: Vec<usize> = lead.iter().copied().chain([d_in]).collect();
    let (x, wt, b) = (values(rows * d_in, 1), values(d_in * w, 2), values(w, 3));
    let y0 = values(rows * cols, 4);
    let ys: Vec<usize> = lead.iter().copied().chain([cols]).collect();
    let what = format!(
        "forward {lead:?}x{d_in} · {d_in}x{w} into {start}..{} of {cols}",
        start + w
    );
    let got = fused(&what, B::kernel_path().linear_in_place(), || {
        forward_step::<B>(
            float::<B>(&y0, &ys, device),
            float::<B>(&x, &xs, device),
            float::<B>(&wt, &[d_in, w], device),
            bias.then(|| float::<B>(&b, &[w], device)),
            start,
            None,
        )
        .expect("fits")
    });
    let mut want: Vec<f64> = y0.iter().map(|v| *v as f64).collect();
    let mut scale = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..w {
            let mut s: f64 = if bias { b[c] as f64 } else { 0.0 };
            let mut m = s.abs();
            for k in 0..d_in {
                let t = x[r * d_in + k] as f64 * wt[k * w + c] as f64;
                s += t;
                m += t.abs();
            }
            want[r * cols + start + c] = s;
            scale[r * cols + start + c] = m;
        }
    }
    assert_close(&what, &flat::<B>(got), &want, &scale);
}

fn x_grad_case<B: RotationKernels>(
    rows: usize,
    d_in: usize,
    w: usize,
    cols: usize,
    start: usize,
    acc: bool,
    device: &B::Device,
) {
    let (wt, dy, a) = (
        values(d_in * w, 5),
        values(rows * cols, 6),
        values(rows * d_in, 7),
    );
    let what = format!(
        "x grad {rows}x{cols}[{start}..{}] · ({d_in}x{w})ᵀ, acc {acc}",
        start + w
    );
    let got = fused(&what, B::kernel_path().linear_in_place(), || {
        x_grad_step::<B>(
            acc.then(|| float::<B>(&a, &[rows, d_in], device)),
            float::<B>(&wt, &[d_in, w], device),
            float::<B>(&dy, &[rows, cols], device),
            Window::new(start, w),
        )
        .expect("fits")
    });
    let mut want = vec![0.0; rows * d_in];
    let mut scale = vec![0.0; rows * d_in];
    for r in 0..rows {
        for i in 0..d_in {
            let mut s = if acc { a[r * d_in + i] as f64 } else { 0.0 };
            let mut m = s.abs();
            for c in 0..w {
                let t = dy[r * cols + start + c] as f64 * wt[i * w + c] as f64;
                s += t;
                m += t.abs();
            }
            want[r * d_in + i] = s;
            scale[r * d_in + i] = m;
        }
    }
    assert_close(&what, &flat::<B>(got), &want, &scale);
}

fn weight_grad_case<B: RotationKernels>(
    lead: &[usize],
    d_in: usize,
    w: usize,
    cols: usize,
    start: usize,
    bias: bool,
    device: &B::Device,
) {
    let rows: usize = lead.iter().product();
    let (x, dy) = (values(rows * d_in, 8), values(rows * cols, 9));
    let xs: Vec<usize> = lead.iter().copied().chain([d_in]).collect();
    let ds: Vec<usize> = lead.iter().copied().chain([cols]).collect();
    let what = format!(
        "weight grad ({lead:?}x{d_in})ᵀ · dy[{start}..{}] of {cols}, bias {bias}",
        start + w
    );
    let (g, db) = fused(&what, B::kernel_path().linear_in_place(), || {
        weight_grad_step::<B>(
            float::<B>(&x, &xs, device),
            float::<B>(&dy, &ds, device),
            Window::new(start, w),
            bias,
            None,
        )
        .expect("fits")
    });
    let mut want = vec![0.0; d_in * w];
    let mut scale = vec![0.0; d_in * w];
    for i in 0..d_in {
        for c in 0..w {
            for r in 0..rows {
                let t = x[r * d_in + i] as f64 * dy[r * cols + start + c] as f64;
                want[i * w + c] += t;
                scale[i * w + c] += t.abs();
            }
        }
    }
    assert_close(&what, &flat::<B>(g), &want, &scale);
    assert_eq!(db.is_some(), bias, "{what}: bias gradient presence");
    if let Some(db) = db {
        let mut want = vec![0.0; w];
        let mut scale = vec![0.0; w];
        for c in 0..w {
            for r in 0..rows {
                want[c] += dy[r * cols + start + c] as f64;
                scale[c] += (dy[r * cols + start + c] as f64).abs();
            }
        }
        assert_close(&format!("{what} (bias)"), &flat::<B>(db), &want, &scale);
    }
}

fn embedding_case<B: RotationKernels>(
    tokens: &[usize],
    n: usize,
    w: usize,
    cols: usize,
    start: usize,
    device: &B::Device,
) {
    let rows: usize = tokens.iter().product();
    // Repeated indices, so the scatter must add.
    let idx: Vec<i64> = (0..rows).map(|r| ((r * 7 + 3) % n) as i64).collect();
    let (table, y0, dy) = (
        values(n * w, 10),
        values(rows * cols, 11),
        values(rows * cols, 12),
    );
    let ys: Vec<usize> = tokens.iter().copied().chain([cols]).collect();
    let what = format!(
        "embedding {tokens:?} of {n}x{w} into {start}..{} of {cols}",
        start + w
    );
    let got = fused(&what, B::kernel_path().embedding_in_place(), || {
        embedding_step::<B>(
            float::<B>(&y0, &ys, device),
            float::<B>(&table, &[n, w], device),
            ints::<B>(&idx, tokens, device),
            start,
        )
        .expect("fits")
    });
    let mut want: Vec<f64> = y0.iter().map(|v| *v as f64).collect();
    for r in 0..rows {
        for c in 0..w {
            want[r * cols + start + c] = table[idx[r] as usize * w + c] as f64;
        }
    }
    assert_close(&what, &flat::<B>(got), &want, &vec![0.0; want.len()]);

    let g = fused(
        &format!("{what} (grad)"),
        B::kernel_path().embedding_in_place(),
        || {
            embedding_grad_step::<B>(
                n,
                float::<B>(&dy, &ys, device),
                ints::<B>(&idx, tokens, device),
                Window::new(start, w),
            )
            .expect("fits")
        },
    );
    let mut want = vec![0.0; n * w];
    let mut scale = vec![0.0; n * w];
    for r in 0..rows {
        for c in 0..w {
            want[idx[r] as usize * w + c] += dy[r * cols + start + c] as f64;
            scale[idx[r] as usize * w + c] += (dy[r * cols + start + c] as f64).abs();
        }
    }
    assert_close(&format!("{what} (grad)"), &flat::<B>(g), &want, &scale);
}

fn all_cases<B: RotationKernels>(device: &B::Device) {
    for bias in [false, true] {
        forward_case::<B>(&[1], 1, 1, 1, 0, bias, device);
        forward_case::<B>(&[5], 7, 3, 10, 7, bias, device);
        forward_case::<B>(&[33], 17, 1, 5, 2, bias, device);
        forward_case::<B>(&[2, 3], 19, 11, 30, 0, bias, device);
        forward_case::<B>(&[70], 1000, 13, 40, 27, bias, device);
        forward_case::<B>(&[9], 21, 333, 1000, 667, bias, device);
    }
    aligned_cases::<B>(device);
    for acc in [false, true] {
        x_grad_case::<B>(1, 1, 1, 1, 0, acc, device);
        x_grad_case::<B>(5, 7, 3, 10, 7, acc, device);
        x_grad_case::<B>(33, 17, 1, 5, 4, acc, device);
        x_grad_case::<B>(70, 1000, 13, 40, 27, acc, device);
        x_grad_case::<B>(9, 21, 333, 1000, 667, acc, device);
    }
    for bias in [false, true] {
        weight_grad_case::<B>(&[1], 1, 1, 1, 0, bias, device);
        weight_grad_case::<B>(&[5], 7, 3, 10, 7, bias, device);
        weight_grad_case::<B>(&[33], 17, 1, 5, 4, bias, device);
        weight_grad_case::<B>(&[2, 35], 19, 11, 30, 19, bias, device);
        weight_grad_case::<B>(&[1000], 9, 13, 40, 27, bias, device);
        weight_grad_case::<B>(&[9], 1000, 5, 1000, 995, bias, device);
    }
    embedding_case::<B>(&[1, 1], 1, 1, 1, 0, device);
    embedding_case::<B>(&[3, 5], 4, 3, 10, 7, device);
    embedding_case::<B>(&[33, 1], 67, 1, 5, 4, device);
    embedding_case::<B>(&[2, 64], 1000, 17, 100, 83, device);
}

/// Shapes whose operands all move in vectors of 4 on cube backends (offsets, strides and
/// extents multiples of 4), over several blocks of rows and columns and a partial K slice,
/// each beside one whose window start is not a multiple of 4 (scalar loads and stores).
fn aligned_cases<B: RotationKernels>(device: &B::Device) {
    for flag in [false, true] {
        forward_case::<B>(&[300], 100, 200, 400, 200, flag, device);
        forward_case::<B>(&[2, 65], 36, 12, 40, 6, flag, device);
        x_grad_case::<B>(300, 100, 200, 400, 200, flag, device);
        x_grad_case::<B>(70, 36, 12, 40, 6, flag, device);
        weight_grad_case::<B>(&[300], 100, 200, 400, 200, flag, device);
        weight_grad_case::<B>(&[2, 35], 36, 12, 40, 6, flag, device);
    }
}

/// Windows and shapes that do not fit are refused before anything runs.
fn refusals<B: RotationKernels>(device: &B::Device) {
    let y = float::<B>(&values(20, 1), &[4, 5], device);
    let x = float::<B>(&values(12, 2), &[4, 3], device);
    let w = float::<B>(&values(6, 3), &[3, 2], device);
    let past_edge = forward_step::<B>(y.clone(), x.clone(), w.clone(), None, 4, None);
    assert!(
        matches!(
            past_edge,
            Err(ColumnError::OutOfBounds {
                start: 4,
                end: 6,
                columns: 5,
                ..
            })
        ),
        "{past_edge:?}"
    );
    let w_bad = float::<B>(&values(8, 3), &[4, 2], device);
    let inner = forward_step::<B>(y.clone(), x.clone(), w_bad, None, 0, None);
    assert!(
        matches!(inner, Err(ColumnError::Mismatch { .. })),
        "{inner:?}"
    );
    let dx = x_grad_step::<B>(None, w.clone(), y.clone(), Window::new(4, 2));
    assert!(matches!(dx, Err(ColumnError::OutOfBounds { .. })), "{dx:?}");
    let dw = weight_grad_step::<B>(
        x.clone(),
        float::<B>(&values(15, 4), &[3, 5], device),
        Window::new(0, 2),
        true,
        None,
    );
    assert!(matches!(dw, Err(ColumnError::Mismatch { .. })), "{dw:?}");
    let idx = ints::<B>(&[0, 1, 2, 0], &[1, 4], device);
    let y3 = float::<B>(&values(20, 1), &[1, 4, 5], device);
    let emb = embedding_step::<B>(y3.clone(), w.clone(), idx.clone(), 4);
    assert!(
        matches!(emb, Err(ColumnError::OutOfBounds { .. })),
        "{emb:?}"
    );
    let flat_idx = ints::<B>(&[0, 1, 2, 0], &[4], device);
    let emb = embedding_step::<B>(y, w.clone(), flat_idx, 0);
    assert!(matches!(emb, Err(ColumnError::Mismatch { .. })), "{emb:?}");
    let eg = embedding_grad_step::<B>(3, y3, idx, Window::new(0, 6));
    assert!(matches!(eg, Err(ColumnError::OutOfBounds { .. })), "{eg:?}");
}

#[test]
fn native_steps_match_the_reference_on_ndarray() {
    assert_eq!(
        <NdArray as RotationKernels>::kernel_path(),
        KernelPath::Native
    );
    all_cases::<NdArray>(&Default::default());
}

/// NdArray's native steps give the generic compositions' bits: the forward always, the
/// gradients while the summed dimension fits in one of matrixmultiply's K blocks (256 for
/// f32), which every case here does. Windows start inside the output, operands are 2- and
/// 3-dimensional, biases on and off.
#[test]
fn native_steps_equal_the_compositions_bit_for_bit_on_ndarray() {
    use burn_rtp_kernels::generic::linear as generic;
    type B = NdArray;
    let device = Default::default();
    let bits = |t: Float<B>| flat::<B>(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let t = |v: &[f32], shape: &[usize]| float::<B>(v, shape, &device);
    for (lead, d_in, w, cols, start) in [
        (vec![5usize], 7usize, 3usize, 10usize, 7usize),
        (vec![4, 9], 33, 70, 200, 101),
        (vec![2, 64], 256, 64, 256, 128),
        (vec![3, 20], 300, 250, 600, 1),
    ] {
        let rows: usize = lead.iter().product();
        let xs: Vec<usize> = lead.iter().copied().chain([d_in]).collect();
        let ys: Vec<usize> = lead.iter().copied().chain([cols]).collect();
        let (x, wt, b) = (values(rows * d_in, 21), values(d_in * w, 22), values(w, 23));
        let (y0, dy, acc) = (
            values(rows * cols, 24),
            values(rows * cols, 25),
            values(rows * d_in, 26),
        );
        let win = Window::new(start, w);
        let what = format!("{lead:?} x {d_in} -> {w} at {start} of {cols}");
        // X packed once per pass (where this CPU's GEMM packs), read by every step, and not.
        let x_in = t(&x, &xs);
        let packed_fwd = pack_x::<B>(&x_in, XUse::Forward);
        let packed_dw = pack_x::<B>(&x_in, XUse::WeightGrad);
        assert_eq!(packed_fwd.is_some(), packed_dw.is_some(), "{what}");
        for (bias, packed) in [(false, false), (true, false), (false, true), (true, true)] {
            let b_j = || bias.then(|| t(&b, &[w]));
            let (fwd, dw_packed) = match packed {
                true => (packed_fwd.as_ref(), packed_dw.as_ref()),
                false => (None, None),
            };
            let what = format!("{what}, bias {bias}, packed {}", fwd.is_some());
            let native = forward_step::<B>(
                t(&y0, &ys),
                x_in.clone(),
                t(&wt, &[d_in, w]),
                b_j(),
                start,
                fwd,
            );
            let composed =
                generic::forward::<B>(t(&y0, &ys), t(&x, &xs), t(&wt, &[d_in, w]), b_j(), win);
            assert_eq!(
                bits(native.expect("fits")),
                bits(composed),
                "forward {what}"
            );
            let (dw, db) = weight_grad_step::<B>(x_in.clone(), t(&dy, &ys), win, bias, dw_packed)
                .expect("fits");
            let (dw0, db0) = generic::weight_grad::<B>(t(&x, &xs), t(&dy, &ys), win, bias);
            assert_eq!(bits(dw), bits(dw0), "weight grad {what}");
            assert_eq!(db.map(bits), db0.map(bits), "bias grad {what}");
        }
        for with_acc in [false, true] {
            let a = || with_acc.then(|| t(&acc, &xs));
            let native = x_grad_step::<B>(a(), t(&wt, &[d_in, w]), t(&dy, &ys), win).expect("fits");
            let composed = generic::x_grad::<B>(a(), t(&wt, &[d_in, w]), t(&dy, &ys), win);
            assert_eq!(
                bits(native),
                bits(composed),
                "x grad {what}, acc {with_acc}"
            );
        }
    }
}

/// The per-sample sum holds one product at a time, yet gives Burn's own `linear_weight_backward`
/// bit for bit: the single-device reference the equivalence suite compares with uses Burn's.
#[test]
fn summed_weight_gradient_equals_burns_bit_for_bit_on_ndarray() {
    use burn::tensor::ops::ModuleOps;
    let device = Default::default();
    for (batch, rows, d_in, d_out) in [(1, 3, 5, 7), (4, 9, 33, 70), (7, 1, 130, 3)] {
        let x = values(batch * rows * d_in, 11);
        let dy = values(batch * rows * d_out, 12);
        let x = float::<NdArray>(&x, &[batch, rows, d_in], &device);
        let dy = float::<NdArray>(&dy, &[batch, rows, d_out], &device);
        let burns = <NdArray as ModuleOps<NdArray>>::linear_weight_backward(x.clone(), dy.clone());
        let ours = weight_grad_summed::<NdArray>(x, dy);
        let bits = |t| {
            flat::<NdArray>(t)
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            bits(ours),
            bits(burns),
            "batch {batch}, {rows} x {d_in} -> {d_out}"
        );
    }
}

/// DDP's and FSDP's Linear on NdArray (the native GEMM, one window over every column) gives
/// Burn's own ops bit for bit, past one K block too where nothing accumulates: the strategies
/// RTP is measured against change speed, not results.
#[test]
fn whole_weight_linear_equals_burns_bit_for_bit_on_ndarray() {
    use burn::tensor::ops::ModuleOps;
    use burn_rtp_kernels::{forward_whole, weight_grad_whole, x_grad_whole};
    type B = NdArray;
    let device = Default::default();
    let bits = |t: Float<B>| flat::<B>(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let t = |v: &[f32], shape: &[usize]| float::<B>(v, shape, &device);
    for (lead, d_in, d_out) in [
        (vec![5usize], 7usize, 3usize),
        (vec![4, 9], 33, 70),
        (vec![3, 20], 300, 270),
        (vec![2, 64], 256, 600),
    ] {
        let rows: usize = lead.iter().product();
        let xs: Vec<usize> = lead.iter().copied().chain([d_in]).collect();
        let ys: Vec<usize> = lead.iter().copied().chain([d_out]).collect();
        let (x, w, b) = (
            values(rows * d_in, 31),
            values(d_in * d_out, 32),
            values(d_out, 33),
        );
        let dy = values(rows * d_out, 34);
        let what = format!("{lead:?} x {d_in} -> {d_out}");
        for bias in [false, true] {
            let b_ = || bias.then(|| t(&b, &[d_out]));
            let ours = fused(&what, true, || {
                forward_whole::<B>(t(&x, &xs), t(&w, &[d_in, d_out]), b_())
            });
            let burns = B::linear(t(&x, &xs), t(&w, &[d_in, d_out]), b_());
            assert_eq!(bits(ours), bits(burns), "forward {what}, bias {bias}");
        }
        let ours = fused(&what, true, || {
            x_grad_whole::<B>(t(&w, &[d_in, d_out]), t(&dy, &ys))
        });
        let burns = B::linear_x_backward(t(&w, &[d_in, d_out]), t(&dy, &ys));
        assert_eq!(bits(ours), bits(burns), "x grad {what}");
        let ours = fused(&what, true, || {
            weight_grad_whole::<B>(t(&x, &xs), t(&dy, &ys))
        });
        let burns = B::linear_weight_backward(t(&x, &xs), t(&dy, &ys));
        assert_eq!(bits(ours), bits(burns), "weight grad {what}");
    }
}

#[test]
fn refusals_on_ndarray() {
    refusals::<NdArray>(&Default::default());
}

/// The fused kernels' tests on one cube backend, behind its cargo feature.
macro_rules! on_cube_backend {
    ($feature:literal, $name:ident, $backend:ty, $device:expr) => {
        #[cfg(feature = $feature)]
        mod $name {
            use super::*;

            /// Every case with the tiling each launch picks, then the aligned and unaligned
            /// cases with each tiling forced (one test, as the choice is process-wide), so
            /// both tilings run with vector and with scalar loads whatever the device.
            #[test]
            fn fused_kernels_match_the_reference() {
                use burn_rtp_kernels::{set_gemm_tiling, GemmTiling};
                assert_eq!(
                    <$backend as RotationKernels>::kernel_path(),
                    KernelPath::Fused
                );
                all_cases::<$backend>(&$device);
                for tiling in [GemmTiling::Gpu, GemmTiling::Cpu] {
                    set_gemm_tiling(tiling);
                    aligned_cases::<$backend>(&$device);
                }
                set_gemm_tiling(GemmTiling::Auto);
            }

            #[test]
            fn refusals() {
                super::refusals::<$backend>(&$device);
            }
        }
    };
}

on_cube_backend!(
    "wgpu",
    wgpu,
    burn::backend::wgpu::Wgpu,
    burn::backend::wgpu::WgpuDevice::default()
);
on_cube_backend!(
    "cuda",
    cuda,
    burn::backend::Cuda,
    burn::backend::cuda::CudaDevice::default()
);
