//! Linear against one weight shard: forward columns, and the three backward accumulations.

use burn::tensor::backend::Backend;

use crate::Float;

fn accumulate<B: Backend>(acc: Option<Float<B>>, value: Float<B>) -> Float<B> {
    match acc {
        Some(acc) => B::float_add(acc, value),
        None => value,
    }
}

/// `Y[:, cols(j)] = X W_j + b_j`.
pub fn linear_columns<B: Backend>(x: Float<B>, w_j: Float<B>, b_j: Option<Float<B>>) -> Float<B> {
    B::linear(x, w_j, b_j)
}

/// `dX += dY[:, cols(j)] W_jᵀ`.
pub fn accumulate_x_grad<B: Backend>(
    acc: Option<Float<B>>,
    w_j: Float<B>,
    dy_j: Float<B>,
) -> Float<B> {
    accumulate::<B>(acc, B::linear_x_backward(w_j, dy_j))
}

/// `G_j += Xᵀ dY[:, cols(j)]`, summed over all batch dimensions.
pub fn accumulate_weight_grad<B: Backend>(
    acc: Option<Float<B>>,
    x: Float<B>,
    dy_j: Float<B>,
) -> Float<B> {
    accumulate::<B>(acc, B::linear_weight_backward(x, dy_j))
}

/// `g_bj += Σ_rows dY[:, cols(j)]`.
pub fn accumulate_bias_grad<B: Backend>(acc: Option<Float<B>>, dy_j: Float<B>) -> Float<B> {
    accumulate::<B>(acc, B::linear_bias_backward(dy_j))
}
