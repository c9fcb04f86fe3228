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
