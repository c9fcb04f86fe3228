//! A sharded model gathers into an ordinary record that single-device Burn loads.

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::optim::{GradientsParams, Optimizer};
use burn_rtp::{gather_module, launch, Rtp, RtpConfig, RtpOptimizer};
use common::*;

type Dist = Autodiff<Rtp<NdArray>>;

#[test]
fn consolidated_weights_load_into_single_device_burn() {
    let world = 3;
    let out = launch(RtpConfig::new(world).with_shard_threshold(0), |device| {
        let mut model = TinyLm::<Dist>::new(&device);
        let mut optim = RtpOptimizer::new(adam().init());
        for step in 0..3 {
            let loss = step_loss_lm(&model, step, rows(device.rank(), world), &device);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(LR, model, grads);
        }
        // The loss of the whole batch under RTP (every rank computes it on all rows).
        let loss = step_loss_lm(&model, 99, 0..GLOBAL_BATCH, &device).into_scalar();
        let full = gather_module(model);
        (to_bytes(full), loss)
    })
    .expect("training runs");
    let device = Default::default();
    // Every rank's consolidated record is a whole model (parameter ids differ per rank).
    for (rank, (bytes, rtp_loss)) in out.iter().enumerate() {
        let single = load_bytes(TinyLm::<Autodiff<NdArray>>::new(&device), bytes, &device);
        let single_loss = step_loss_lm(&single, 99, 0..GLOBAL_BATCH, &device).into_scalar();
        assert!(
            rel_close(single_loss, *rtp_loss, 1e-5),
            "rank {rank}: single-device loss {single_loss} vs RTP loss {rtp_loss}"
        );
    }
}
