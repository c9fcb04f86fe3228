//! `RtpOptimizer::adam` (the one-pass Adam) against Burn's Adam wrapped by
//! `RtpOptimizer::new`: the equivalence MLP trained for 4 steps (weight decay on, dimensions
//! that N does not divide) under RTP, DDP and FSDP at N = 1, 2 and 3 ends with the same
//! parameters bit for bit, and its ranks ran the one-pass kernel once per parameter and step;
//! with `with_fused_optimizer(false)` they ran it never.

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::optim::{GradientsParams, Optimizer};
use burn_rtp::{launch, Rtp, RtpConfig, RtpOptimizer, Strategy};
use common::*;

type Dist = Autodiff<Rtp<NdArray>>;

const TRAIN_STEPS: usize = 4;

/// Parameters after training with `optim`, and the steps this rank's thread ran on
/// burn-rtp-kernels' own kernels meanwhile.
fn trained<O: Optimizer<Mlp<Dist>, Dist>>(
    mut optim: O,
    weights: &[u8],
    device: &burn::tensor::Device<Dist>,
    world: usize,
) -> (Vec<Vec<f32>>, u64) {
    let mut model = load_bytes(Mlp::<Dist>::new(device), weights, device);
    let rows = rows(device.rank(), world);
    let before = burn_rtp_kernels::fused_launches_on_this_thread();
    for step in 0..TRAIN_STEPS {
        let loss = step_loss_mlp(&model, step, rows.clone(), device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(LR, model, grads);
    }
    let launches = burn_rtp_kernels::fused_launches_on_this_thread() - before;
    (param_values(&model), launches)
}

/// Every rank's (one-pass run, Burn's Adam run) under `config`.
#[allow(clippy::type_complexity)]
fn both(config: RtpConfig, weights: &[u8]) -> Vec<((Vec<Vec<f32>>, u64), (Vec<Vec<f32>>, u64))> {
    let world = config.world_size;
    launch(config, |device| {
        let fused = trained(RtpOptimizer::adam(&adam()), weights, &device, world);
        let burn = trained(
            RtpOptimizer::new(adam().init::<Dist, Mlp<Dist>>()),
            weights,
            &device,
            world,
        );
        (fused, burn)
    })
    .expect("the world runs")
}

fn bits(values: &[Vec<f32>]) -> Vec<Vec<u32>> {
    values
        .iter()
        .map(|p| p.iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn the_one_pass_adam_is_burns_adam_bit_for_bit() {
    let weights = mlp_weights(SEED);
    let params = bits(&param_values(&load_bytes(
        Mlp::<Autodiff<NdArray>>::new(&Default::default()),
        &weights,
        &Default::default(),
    )))
    .len();
    for strategy in [Strategy::Rtp, Strategy::Ddp, Strategy::Fsdp] {
        for n in [1, 2, 3] {
            let config = RtpConfig::new(n)
                .with_strategy(strategy)
                .with_shard_threshold(0);
            for (rank, ((fused, fused_launches), (burn, burn_launches))) in
                both(config, &weights).into_iter().enumerate()
            {
                let what = format!("{strategy:?}, N={n}, rank {rank}");
                assert_eq!(bits(&fused), bits(&burn), "{what}: parameters differ");
                // The rotation kernels ran in both; the Adam kernel once per parameter and
                // step in the first only.
                assert_eq!(
                    fused_launches - burn_launches,
                    (params * TRAIN_STEPS) as u64,
                    "{what}: one-pass Adam steps"
                );
            }
        }
    }
}

#[test]
fn turned_off_it_runs_burns_adam() {
    let weights = mlp_weights(SEED);
    let config = RtpConfig::new(2)
        .with_shard_threshold(0)
        .with_fused_optimizer(false);
    for ((fused, fused_launches), (burn, burn_launches)) in both(config, &weights) {
        assert_eq!(bits(&fused), bits(&burn));
        assert_eq!(fused_launches, burn_launches, "no one-pass Adam step ran");
    }
}
