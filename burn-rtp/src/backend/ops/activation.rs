//! Activations: elementwise, so they run on shards and local tensors alike.

use super::{binary, full_op, unary};
use crate::backend::rtp::Rtp;
use crate::state::sharding::Layout;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{ActivationOps, FloatTensor};
use burn::tensor::Scalar;
use burn_rtp_kernels::RotationKernels;

impl<B: RotationKernels> ActivationOps<Self> for Rtp<B> {
    fn leaky_relu(tensor: FloatTensor<Self>, negative_slope: Scalar) -> FloatTensor<Self> {
        unary(tensor, |t| B::leaky_relu(t, negative_slope))
    }

    fn prelu(tensor: FloatTensor<Self>, alpha: FloatTensor<Self>) -> FloatTensor<Self> {
        binary("prelu", tensor, alpha, B::prelu)
    }

    fn relu(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        unary(tensor, B::relu)
    }

    fn relu_backward(output: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        binary("relu_backward", output, grad, B::relu_backward)
    }

    fn gelu(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        if tensor.ctx.comm.config.fused_activations {
            unary(tensor, B::fused_gelu)
        } else {
            unary(tensor, B::gelu)
        }
    }

    fn gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        if x.ctx.comm.config.fused_activations {
            binary("gelu_backward", x, grad, B::fused_gelu_backward)
        } else {
            binary("gelu_backward", x, grad, B::gelu_backward)
        }
    }

    fn sigmoid(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        unary(tensor, B::sigmoid)
    }

    fn sigmoid_backward(output: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        binary("sigmoid_backward", output, grad, B::sigmoid_backward)
    }

    fn hard_sigmoid(tensor: FloatTensor<Self>, alpha: Scalar, beta: Scalar) -> FloatTensor<Self> {
        unary(tensor, |t| B::hard_sigmoid(t, alpha, beta))
    }

    fn log_sigmoid(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        unary(tensor, B::log_sigmoid)
    }

    fn log_sigmoid_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        binary("log_sigmoid_backward", x, grad, B::log_sigmoid_backward)
    }

    fn softmax(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        softmax_like(tensor, dim, "softmax", |t| B::softmax(t, dim))
    }

    fn log_softmax(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        softmax_like(tensor, dim, "log_softmax", |t| B::log_softmax(t, dim))
    }

    fn softmin(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        softmax_like(tensor, dim, "softmin", |t| B::softmin(t, dim))
    }
}

/// Normalisations along `dim` are shard-local unless `dim` is the sharded (last) one.
fn softmax_like<B: Backend>(
    tensor: FloatTensor<Rtp<B>>,
    dim: usize,
    op: &'static str,
    f: impl FnOnce(B::FloatTensorPrimitive) -> B::FloatTensorPrimitive,
) -> FloatTensor<Rtp<B>> {
    use burn::tensor::TensorMetadata;
    let last = tensor.shape().num_dims() - 1;
    if matches!(tensor.layout, Layout::Sharded(_)) && dim == last {
        full_op(tensor, op, f)
    } else {
        unary(tensor, f)
    }
}
