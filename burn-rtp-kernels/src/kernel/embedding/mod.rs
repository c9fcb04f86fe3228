//! Embedding lookup against one column shard `W_j` (`[n_embeddings, w]`) of the table: the
//! forward gathers the looked-up rows into the column window of Y; the backward scatter-adds
//! the window of dY into the shard's gradient.
//!
//! The entry points check shapes and windows, then run the backend's implementation
//! ([`RotationKernels`]): the `#[cube]` kernels of `gather.rs` and `scatter.rs` on cube
//! backends, or the compositions of Burn ops below on any other backend.

#[cfg(feature = "cube")]
pub(crate) mod gather;
#[cfg(feature = "cube")]
pub(crate) mod scatter;

use crate::dispatch::RotationKernels;
use crate::kernel::columns::{column_slice, write_columns, ColumnError, Window};
use crate::{Float, Int};
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, TensorMetadata};

/// `Y[b, s, start..start+w] = W_j[indices[b, s]]`, written into `y`; returns `y`.
pub fn embedding_step<B: RotationKernels>(
    y: Float<B>,
    w_j: Float<B>,
    indices: Int<B>,
    start: usize,
) -> Result<Float<B>, ColumnError> {
    let (ys, ws, is) = (
        y.shape().to_vec(),
        w_j.shape().to_vec(),
        indices.shape().to_vec(),
    );
    // Burn's embedding takes `[batch, seq]` indices.
    if ws.len() != 2 || is.len() != 2 || ys.len() != 3 || ys[..2] != is[..] {
        return Err(ColumnError::Mismatch {
            op: "embedding step",
            shapes: vec![ys, ws, is],
        });
    }
    let window = Window::new(start, ws[1]).check(&ys)?;
    Ok(B::embedding_step(y, w_j, indices, window))
}

/// `G_j[indices[b, s]] += dY[b, s, win]` for every token, into a new `[n_embeddings, w]`
/// tensor.
pub fn embedding_grad_step<B: RotationKernels>(
    n_embeddings: usize,
    dy: Float<B>,
    indices: Int<B>,
    window: Window,
) -> Result<Float<B>, ColumnError> {
    let (ds, is) = (dy.shape().to_vec(), indices.shape().to_vec());
    if is.len() != 2 || ds.len() != 3 || ds[..2] != is[..] {
        return Err(ColumnError::Mismatch {
            op: "embedding gradient step",
            shapes: vec![ds, is],
        });
    }
    let window = window.check(&ds)?;
    Ok(B::embedding_grad_step(n_embeddings, dy, indices, window))
}

/// `G[idx] += dY` over a whole (unsharded) table of `n_embeddings` rows, onto `acc` if given.
pub fn accumulate_embedding_grad<B: Backend>(
    acc: Option<Float<B>>,
    n_embeddings: usize,
    dy: Float<B>,
    indices: Int<B>,
) -> Float<B> {
    let cols = dy.shape()[dy.shape().num_dims() - 1];
    let rows = indices.shape().num_elements();
    let device = B::float_device(&dy);
    let dtype = dy.dtype();
    let flat_indices = B::int_reshape(indices, Shape::new([rows]));
    let flat_grad = B::float_reshape(dy, Shape::new([rows, cols]));
    let base = match acc {
        Some(acc) => acc,
        None => B::float_zeros(Shape::new([n_embeddings, cols]), &device, dtype.into()),
    };
    B::float_select_add(base, 0, flat_indices, flat_grad)
}

/// The compositions of Burn ops that every backend runs; what [`RotationKernels`]' default
/// methods call.
pub mod generic {
    use super::*;

    /// Burn's embedding into a block, then the block written into the window.
    pub fn forward<B: Backend>(
        y: Float<B>,
        w_j: Float<B>,
        indices: Int<B>,
        window: Window,
    ) -> Float<B> {
        let block = B::embedding(w_j, indices);
        write_columns::<B>(y, block, window.start).expect("the entry point checked the window")
    }

    /// The window sliced as a view, then Burn's select-add.
    pub fn grad<B: Backend>(
        n_embeddings: usize,
        dy: Float<B>,
        indices: Int<B>,
        window: Window,
    ) -> Float<B> {
        let dy_j = column_slice::<B>(dy, window.start, window.len);
        accumulate_embedding_grad::<B>(None, n_embeddings, dy_j, indices)
    }
}
