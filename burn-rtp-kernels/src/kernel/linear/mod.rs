//! Linear against one weight shard `W_j` (`[d_in, w]`, columns `win` of the whole weight):
//! the forward step and the two gradient steps, each reading and writing the column window
//! `win` of Y or dY where it lies.
//!
//! The entry points check shapes and windows, then run the backend's implementation
//! ([`RotationKernels`]): the tiled `#[cube]` GEMM of `gemm.rs` on cube backends,
//! matrixmultiply's GEMM on strided views on NdArray (`ndarray_gemm.rs`, with the forward and
//! weight-gradient GEMMs of f32 on `packed_lhs.rs`, which packs X once per pass), or the
//! compositions of Burn ops below on any other backend.

#[cfg(feature = "cube")]
pub(crate) mod gemm;
#[cfg(feature = "cube")]
pub(crate) mod launch;
pub(crate) mod ndarray_gemm;
pub(crate) mod packed_lhs;

pub use crate::generic::linear::weight_grad_summed;
pub use crate::packing::{PackedX, XUse};

use crate::columns::{dtype_of, output_shape, ColumnError, Window};
use crate::dispatch::{Checked, KernelPath, RotationKernels};
use crate::Float;
use burn::tensor::backend::Backend;
use burn::tensor::TensorMetadata;

fn shape<B: Backend>(t: &Float<B>) -> Vec<usize> {
    t.shape().to_vec()
}

fn leading(shape: &[usize]) -> &[usize] {
    &shape[..shape.len().saturating_sub(1)]
}

fn last(shape: &[usize]) -> usize {
    shape.last().copied().unwrap_or(0)
}

/// `x` packed once for the steps of a pass that read it as `use_`, where the backend packs
/// (see [`PackedX`]); `None` elsewhere, and each step reads `x` itself.
pub fn pack_x<B: RotationKernels>(x: &Float<B>, use_: XUse) -> Option<PackedX> {
    B::pack_x(x, use_)
}

/// `Y[.., start..start+w] = X · W_j (+ b_j)`, written into `y` (allocated once per forward,
/// e.g. by [`crate::output_for_columns`]); returns `y`. `packed` is `x` packed by
/// [`pack_x`] for [`XUse::Forward`], if the pass packed it.
pub fn forward_step<B: RotationKernels>(
    y: Float<B>,
    x: Float<B>,
    w_j: Float<B>,
    b_j: Option<Float<B>>,
    start: usize,
    packed: Option<&PackedX>,
) -> Result<Float<B>, ColumnError> {
    let (ys, xs, ws) = (shape::<B>(&y), shape::<B>(&x), shape::<B>(&w_j));
    let bs = b_j.as_ref().map(shape::<B>);
    let fits = xs.len() >= 2
        && ws.len() == 2
        && ys.len() == xs.len()
        && leading(&ys) == leading(&xs)
        && last(&xs) == ws[0]
        && bs.as_ref().is_none_or(|b| b.as_slice() == [ws[1]]);
    if !fits {
        let mut shapes = vec![ys, xs, ws];
        shapes.extend(bs);
        return Err(ColumnError::Mismatch {
            op: "linear forward step",
            shapes,
        });
    }
    let window = Window::new(start, ws[1]).check(&ys)?;
    Ok(B::linear_step(
        y,
        x,
        w_j,
        b_j,
        window,
        packed,
        Checked::after_checks(),
    ))
}

/// `dX (+)= dY[.., win] · W_jᵀ`: added into `acc` when given, else a new tensor.
pub fn x_grad_step<B: RotationKernels>(
    acc: Option<Float<B>>,
    w_j: Float<B>,
    dy: Float<B>,
    window: Window,
) -> Result<Float<B>, ColumnError> {
    let (ws, ds) = (shape::<B>(&w_j), shape::<B>(&dy));
    let acc_shape = acc.as_ref().map(shape::<B>);
    let fits = ws.len() == 2
        && ds.len() >= 2
        && ws[1] == window.len
        && acc_shape
            .as_ref()
            .is_none_or(|a| leading(a) == leading(&ds) && last(a) == ws[0]);
    if !fits {
        let mut shapes = vec![ws, ds];
        shapes.extend(acc_shape);
        return Err(ColumnError::Mismatch {
            op: "linear input-gradient step",
            shapes,
        });
    }
    let window = window.check(&ds)?;
    Ok(B::x_grad_step(
        acc,
        w_j,
        dy,
        window,
        Checked::after_checks(),
    ))
}

/// `(Xᵀ · dY[.., win], Σ_rows dY[.., win])`, summed over every leading dimension; the bias
/// gradient only `with_bias`. `packed` is `x` packed by [`pack_x`] for [`XUse::WeightGrad`],
/// if the pass packed it.
pub fn weight_grad_step<B: RotationKernels>(
    x: Float<B>,
    dy: Float<B>,
    window: Window,
    with_bias: bool,
    packed: Option<&PackedX>,
) -> Result<(Float<B>, Option<Float<B>>), ColumnError> {
    let (xs, ds) = (shape::<B>(&x), shape::<B>(&dy));
    if xs.len() < 2 || xs.len() != ds.len() || leading(&xs) != leading(&ds) {
        return Err(ColumnError::Mismatch {
            op: "linear weight-gradient step",
            shapes: vec![xs, ds],
        });
    }
    let window = window.check(&ds)?;
    Ok(B::weight_grad_step(
        x,
        dy,
        window,
        with_bias,
        packed,
        Checked::after_checks(),
    ))
}

/// `X · W (+ b)` against a whole weight `[d_in, d_out]`: data parallelism's Linear, and
/// FSDP's once it has gathered the weight.
///
/// On NdArray's native path this is [`forward_step`] with one window over every column, so
/// the strategies RTP is measured against run the same GEMM without burn-ndarray's copies of
/// both operands; an output element is the same dot product as in Burn's `linear`, so the
/// bits are Burn's. Every other path runs Burn's own `linear`: with no window to read, the
/// fused kernels have nothing to save over Burn's matmul.
pub fn forward_whole<B: RotationKernels>(
    x: Float<B>,
    w: Float<B>,
    b: Option<Float<B>>,
) -> Float<B> {
    if B::kernel_path() == KernelPath::Native {
        // Zero-filled by the backend's fastest fill (every element is written below).
        let columns = last(&shape::<B>(&w));
        let y = B::filled(
            output_shape::<B>(&x, columns),
            0.0,
            &B::float_device(&x),
            dtype_of::<B>(&x),
        );
        if let Ok(y) = forward_step::<B>(y, x.clone(), w.clone(), b.clone(), 0, None) {
            return y;
        }
    }
    B::linear(x, w, b)
}

/// `dY · Wᵀ` against a whole weight, as [`forward_whole`] picks its path. With no accumulator
/// the native GEMM writes each element once, so its bits are Burn's `linear_x_backward`.
pub fn x_grad_whole<B: RotationKernels>(w: Float<B>, dy: Float<B>) -> Float<B> {
    if B::kernel_path() == KernelPath::Native {
        let all = Window::all(last(&shape::<B>(&w)));
        if let Ok(dx) = x_grad_step::<B>(None, w.clone(), dy.clone(), all) {
            return dx;
        }
    }
    B::linear_x_backward(w, dy)
}

/// `Xᵀ · dY` against a whole weight, summed over the batch, as [`forward_whole`] picks its
/// path; otherwise [`weight_grad_summed`]. The native sum equals it bit for bit while a sample
/// has at most 256 rows (one of matrixmultiply's K blocks), as the steps do.
pub fn weight_grad_whole<B: RotationKernels>(x: Float<B>, dy: Float<B>) -> Float<B> {
    if B::kernel_path() == KernelPath::Native {
        let all = Window::all(last(&shape::<B>(&dy)));
        if let Ok((dw, _)) = weight_grad_step::<B>(x.clone(), dy.clone(), all, false, None) {
            return dw;
        }
    }
    weight_grad_summed::<B>(x, dy)
}
