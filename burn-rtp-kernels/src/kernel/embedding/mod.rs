//! Embedding lookup against one column shard of the table, and its gradient scatter.

use burn::tensor::backend::Backend;
use burn::tensor::{Shape, TensorMetadata};

use crate::Float;
type Int<B> = <B as burn::tensor::backend::BackendTypes>::IntTensorPrimitive;

/// `Y[..., cols(j)] = W_j[indices]`.
pub fn embedding_columns<B: Backend>(w_j: Float<B>, indices: Int<B>) -> Float<B> {
    B::embedding(w_j, indices)
}

/// `G_j[idx] += dY[..., cols(j)]` for a table of `n_embeddings` rows.
pub fn accumulate_embedding_grad<B: Backend>(
    acc: Option<Float<B>>,
    n_embeddings: usize,
    dy_j: Float<B>,
    indices: Int<B>,
) -> Float<B> {
    let cols = dy_j.shape()[dy_j.shape().num_dims() - 1];
    let rows = indices.shape().num_elements();
    let device = B::float_device(&dy_j);
    let dtype = dy_j.dtype();
    let flat_indices = B::int_reshape(indices, Shape::new([rows]));
    let flat_grad = B::float_reshape(dy_j, Shape::new([rows, cols]));
    let base = match acc {
        Some(acc) => acc,
        None => B::float_zeros(Shape::new([n_embeddings, cols]), &device, dtype.into()),
    };
    B::float_select_add(base, 0, flat_indices, flat_grad)
}
