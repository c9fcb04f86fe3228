//! Layout rules that must never mix ranks: a shard combined with per-rank data is per-rank.

use burn::backend::NdArray;
use burn::nn::LinearConfig;
use burn::tensor::{Tensor, TensorData};
use burn_rtp::{launch, Rtp, RtpConfig};

type B = Rtp<NdArray>;

#[test]
fn a_shard_times_per_rank_data_broadcast_along_columns_stays_per_rank() {
    let (d_in, d_out, n) = (3, 10, 4);
    let runs = launch(RtpConfig::new(n).with_shard_threshold(0), move |device| {
        let w = LinearConfig::new(d_in, d_out)
            .with_bias(false)
            .init::<B>(&device)
            .weight
            .val();
        // Per-rank data of shape [d_in, 1]: it broadcasts along the sharded columns.
        let scale = (device.rank() + 1) as f32;
        let data =
            Tensor::<B, 2>::from_data(TensorData::new(vec![scale; d_in], [d_in, 1]), &device);
        let full = w.clone().into_data().to_vec::<f32>().unwrap();
        let sum = (w * data).sum().into_scalar();
        (full, scale, sum)
    })
    .expect("every rank runs");
    for (rank, (full, scale, sum)) in runs.iter().enumerate() {
        let want: f32 = full.iter().map(|v| v * scale).sum();
        assert!(
            (sum - want).abs() <= 1e-5 * want.abs().max(1.0),
            "rank {rank}: sum(w * data) = {sum}, but this rank's own data gives {want}: ranks were mixed"
        );
    }
}

/// The gradient of `sum(linear(x, w)^2)` with respect to `w`, where `x` and `w` are this
/// rank's own data (computed, not parameters), on any autodiff backend.
fn own_weight_grad<A: burn::tensor::backend::AutodiffBackend>(
    rank: usize,
    device: &A::Device,
) -> Vec<f32> {
    let (rows, d_in, d_out) = (5, 6, 8);
    let values = |seed: usize, len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 5 + seed * 11) % 13) as f32 - 6.0) / 6.0)
            .collect()
    };
    let x = Tensor::<A, 2>::from_data(
        TensorData::new(values(rank, rows * d_in), [rows, d_in]),
        device,
    );
    let w = Tensor::<A, 2>::from_data(
        TensorData::new(values(rank + 7, d_in * d_out), [d_in, d_out]),
        device,
    )
    .require_grad();
    let y = burn::tensor::module::linear(x, w.clone(), None);
    let grads = (y.clone() * y).sum().backward();
    w.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap()
}

/// A computed, per-rank weight with a parameter's shape is data, not a parameter: its
/// gradient is this rank's own, never averaged over ranks. (The gradient's layout follows the
/// weight the forward used, not the shape.)
#[test]
fn a_computed_weight_with_a_parameter_shape_gets_its_own_rank_gradient() {
    type Single = burn::backend::Autodiff<NdArray>;
    let runs = launch(RtpConfig::new(4).with_shard_threshold(0), |device| {
        own_weight_grad::<burn::backend::Autodiff<B>>(device.rank(), &device)
    })
    .expect("every rank runs");
    for (rank, got) in runs.iter().enumerate() {
        let want = own_weight_grad::<Single>(rank, &Default::default());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * a.abs().max(b.abs()).max(1.0),
                "rank {rank}: gradient of its own computed weight, element {i}: {a} vs {b} (averaged over ranks?)"
            );
        }
    }
}
