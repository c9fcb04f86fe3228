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

use crate::columns::{ColumnError, Window};
use crate::dispatch::{Checked, RotationKernels};
pub use crate::generic::embedding::accumulate_embedding_grad;
use crate::{Float, Int};
use burn::tensor::TensorMetadata;

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
    Ok(B::embedding_step(
        y,
        w_j,
        indices,
        window,
        Checked::after_checks(),
    ))
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
    Ok(B::embedding_grad_step(
        n_embeddings,
        dy,
        indices,
        window,
        Checked::after_checks(),
    ))
}
