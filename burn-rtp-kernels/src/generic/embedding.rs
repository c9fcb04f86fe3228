//! The embedding's steps as compositions of Burn ops (a lookup, a select-add).

use crate::columns::{column_slice, write_columns, Window};
use crate::{Float, Int};
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, TensorMetadata};

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
