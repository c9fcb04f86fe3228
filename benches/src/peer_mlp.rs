//! The model and data of the peer comparison with Burn's own DDP, in one source for both sides:
//! the scaling report trains it under burn-rtp's ddp and rtp, and `benches/burn-ddp` trains it
//! under burn-train's strategies. That workspace builds Burn with its `distributed` feature and
//! so cannot depend on this crate; it includes this file by path instead, which keeps the two
//! sides on the same layers, widths, loss and rows.

use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// Input features of a row.
pub const D_IN: usize = 64;

/// Three Linear layers with ReLU between them, regressing one value.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    fc3: Linear<B>,
    act: Relu,
}

impl<B: Backend> Mlp<B> {
    /// A fresh model with `hidden` units in each hidden layer.
    pub fn new(hidden: usize, device: &B::Device) -> Self {
        Self {
            fc1: LinearConfig::new(D_IN, hidden).init(device),
            fc2: LinearConfig::new(hidden, hidden).init(device),
            fc3: LinearConfig::new(hidden, 1).init(device),
            act: Relu::new(),
        }
    }

    /// The prediction for `x` (`[rows, D_IN]` to `[rows, 1]`).
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let h = self.act.forward(self.fc1.forward(x));
        self.fc3.forward(self.act.forward(self.fc2.forward(h)))
    }

    /// Mean squared error of a prediction.
    pub fn loss(&self, out: Tensor<B, 2>, y: Tensor<B, 2>) -> Tensor<B, 1> {
        MseLoss::new().forward(out, y, Reduction::Mean)
    }
}

/// Inputs and targets of the rows `items`, computed from each row's index: the same data on
/// every run and on both sides of the comparison.
pub fn rows<B: Backend>(items: &[usize], device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let n = items.len();
    let mut x = Vec::with_capacity(n * D_IN);
    let mut y = Vec::with_capacity(n);
    for &i in items {
        let mut target = 0.0;
        for j in 0..D_IN {
            let v = ((i * 31 + j * 7) as f32 * 0.37).sin();
            target += v * (j as f32 + 1.0) / D_IN as f32;
            x.push(v);
        }
        y.push(target.tanh());
    }
    (
        Tensor::from_data(TensorData::new(x, [n, D_IN]), device),
        Tensor::from_data(TensorData::new(y, [n, 1]), device),
    )
}

/// The rows of the batch that the fixed evaluation uses after training (`batch` rows).
pub fn eval_rows(batch: usize) -> std::ops::Range<usize> {
    10_000..10_000 + batch
}
