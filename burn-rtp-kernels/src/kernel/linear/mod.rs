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

use crate::dispatch::{KernelPath, RotationKernels};
use crate::kernel::columns::{
    column_slice, output_for_columns, write_columns, ColumnError, Window,
};
use crate::Float;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Shape, Slice, TensorMetadata};

fn shape<B: Backend>(t: &Float<B>) -> Vec<usize> {
    t.shape().to_vec()
}

fn leading(shape: &[usize]) -> &[usize] {
    &shape[..shape.len().saturating_sub(1)]
}

fn last(shape: &[usize]) -> usize {
    shape.last().copied().unwrap_or(0)
}

/// Which step reads a packed input: the forward multiplies by X, the weight gradient by `Xᵀ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XUse {
    /// `Y[.., win] = X · W_j`.
    Forward,
    /// `dW_j = Xᵀ · dY[.., win]`.
    WeightGrad,
}

/// A Linear's input X packed once for every step of a ring pass that reads it as one
/// [`XUse`]. A GEMM packs both operands on every call, so without it a pass of N steps packs
/// the same X N times, where data parallelism's one GEMM packs it once. Only NdArray with f32
/// on a CPU with AVX2 and FMA packs ([`pack_x`]); the steps read the packing instead of
/// packing X again, with the same bits.
#[derive(Debug)]
pub struct PackedX {
    pub(crate) use_: XUse,
    pub(crate) lhs: packed_lhs::PackedLhs,
    /// X itself, held so that its buffer outlives the packing: a step recognises X by the
    /// address of its first element, which no other tensor can take while X lives (and a
    /// shared buffer is copied, never written, by any op that would change it).
    pub(crate) _source: Box<dyn std::any::Any + Send + Sync>,
}

impl PackedX {
    /// The bytes the packed copy holds (X's, its rows padded to a multiple of 6): a caller
    /// charges them while it keeps the packing.
    pub fn bytes(&self) -> usize {
        self.lhs.bytes()
    }
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
    Ok(B::linear_step(y, x, w_j, b_j, window, packed))
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
    Ok(B::x_grad_step(acc, w_j, dy, window))
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
    Ok(B::weight_grad_step(x, dy, window, with_bias, packed))
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
        let y = output_for_columns::<B>(&x, last(&shape::<B>(&w)));
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

/// The compositions of Burn ops that every backend runs; what [`RotationKernels`]' default
/// methods call.
pub mod generic {
    use super::*;

    /// One GEMM into a block, then the block written into the window (no concatenation).
    pub fn forward<B: Backend>(
        y: Float<B>,
        x: Float<B>,
        w_j: Float<B>,
        b_j: Option<Float<B>>,
        window: Window,
    ) -> Float<B> {
        let block = B::linear(x, w_j, b_j);
        write_columns::<B>(y, block, window.start).expect("the entry point checked the window")
    }

    /// The window sliced as a view, one GEMM, one add.
    pub fn x_grad<B: Backend>(
        acc: Option<Float<B>>,
        w_j: Float<B>,
        dy: Float<B>,
        window: Window,
    ) -> Float<B> {
        let dy_j = column_slice::<B>(dy, window.start, window.len);
        let g = B::linear_x_backward(w_j, dy_j);
        match acc {
            Some(acc) => B::float_add(acc, g),
            None => g,
        }
    }

    /// The window sliced as a view, one GEMM per sample and one column sum.
    pub fn weight_grad<B: Backend>(
        x: Float<B>,
        dy: Float<B>,
        window: Window,
        with_bias: bool,
    ) -> (Float<B>, Option<Float<B>>) {
        let dy_j = column_slice::<B>(dy, window.start, window.len);
        let db = with_bias.then(|| B::linear_bias_backward(dy_j.clone()));
        (super::weight_grad_summed::<B>(x, dy_j), db)
    }
}

/// `Xᵀ · dY` summed over the batch, one sample at a time, for `[batch, rows, d]` inputs.
///
/// Burn's default `linear_weight_backward` forms the whole `[batch, d_in, d_out]` stack of
/// per-sample products before it sums them, and NdArray's matmul copies that stack once more
/// in a reshape: `2 · batch + 1` weight-sized buffers at once, the largest transient of a
/// step (measured with massif: 75 MB of an FSDP rank's 160 MB at d_model 768). This holds
/// the running sum and one product. The products are the same GEMMs, added from zero in the
/// same order as NdArray's `sum_axis`, so the bits equal Burn's. Other ranks of input take
/// Burn's default.
pub fn weight_grad_summed<B: Backend>(x: Float<B>, dy: Float<B>) -> Float<B> {
    let (xs, ds) = (x.shape(), dy.shape());
    if xs.num_dims() != 3 || ds.num_dims() != 3 || xs[0] != ds[0] {
        return B::linear_weight_backward(x, dy);
    }
    let (batch, d_in, d_out) = (xs[0], xs[2], ds[2]);
    let sample = |t: &Float<B>, i: usize| {
        B::float_slice(
            t.clone(),
            &[
                Slice::new(i as isize, Some(i as isize + 1), 1),
                Slice::full(),
                Slice::full(),
            ],
        )
    };
    let dtype = FloatDType::from(x.dtype());
    let mut sum = B::float_zeros(Shape::new([1, d_in, d_out]), &B::float_device(&x), dtype);
    for i in 0..batch {
        let x_i = B::float_swap_dims(sample(&x, i), 1, 2);
        sum = B::float_add(sum, B::float_matmul(x_i, sample(&dy, i)));
    }
    B::float_reshape(sum, Shape::new([d_in, d_out]))
}
