//! Activation routing (`Routing::Activations`) against weight rotation, on the same model and
//! data: what each moves, and how far their numbers are apart. Both are checked against
//! single-device Burn in `tests/equivalence.rs`.

mod common;

use burn::backend::autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn::backend::NdArray;
use burn_rtp::{Routing, RtpConfig};
use common::*;

fn run(which: Which, n: usize, routing: Routing) -> Vec<Counted> {
    run_with::<NoCheckpointing>(which, n, routing)
}

fn run_with<C: CheckpointStrategy>(which: Which, n: usize, routing: Routing) -> Vec<Counted> {
    let weights = match which {
        Which::Mlp => mlp_weights(SEED),
        Which::Lm => lm_weights(SEED),
    };
    let config = RtpConfig::new(n)
        .with_shard_threshold(0)
        .with_routing(routing);
    rtp_run_checkpointed::<NdArray, C>(which, config, &weights).expect("run")
}

/// The largest difference between two runs' parameters, in units in the last place, and the
/// largest relative difference of their losses.
fn apart(a: &[Counted], b: &[Counted]) -> (u32, f32) {
    let mut ulps = 0;
    let mut loss = 0f32;
    for (x, y) in a.iter().zip(b) {
        for (p, q) in x.run.1.iter().zip(&y.run.1) {
            for (u, v) in p.iter().zip(q) {
                let d = (u.to_bits() as i64 - v.to_bits() as i64).unsigned_abs();
                ulps = ulps.max(d.min(u32::MAX as u64) as u32);
            }
        }
        for (u, v) in x.run.0.iter().zip(&y.run.0) {
            loss = loss.max((u - v).abs() / u.abs().max(1e-6));
        }
    }
    (ulps, loss)
}

#[test]
fn routing_synchronises_less_than_rotation_beyond_three_ranks() {
    for which in [Which::Mlp, Which::Lm] {
        for n in [4, 8] {
            let exchanges = |r| run(which, n, r)[0].exchanges;
            let (rotated, routed) = (exchanges(Routing::Weights), exchanges(Routing::Activations));
            assert!(
                routed < rotated,
                "{which:?} N={n}: routing made {routed} exchanges, rotation {rotated}"
            );
        }
    }
}

/// What each rank's messages carry under activation routing, to the byte, for the MLP
/// (`fc1` 36 -> 100, `fc2` 100 -> 67; the input is data, so `fc1` has no dX): per step, each
/// forward sends `x` to the `N - 1` owners and this rank's columns of their `y` back; each
/// backward sends `dy`'s columns to their owners and the dX partials back, and no `x`: the
/// owners kept it from the forward. The run ends by gathering the parameters.
#[test]
fn routed_steps_send_each_input_once() {
    for n in [3, 4] {
        let len = |d: usize, r: usize| d / n + usize::from(r < d % n);
        let rows = GLOBAL_BATCH / n;
        let (d_in, d_ff, d_out) = (D_MODEL, D_FF, VOCAB);
        let counted = run(Which::Mlp, n, Routing::Activations);
        for (r, c) in counted.iter().enumerate() {
            let (l1, l2) = (len(d_ff, r), len(d_out, r));
            let forward = (n - 1) * rows * (d_in + l1) + (n - 1) * rows * (d_ff + l2);
            let backward = rows * (d_out - l2) + (n - 1) * rows * d_ff + rows * (d_ff - l1);
            let gather = (n - 1) * (d_in * l1 + l1 + d_ff * l2 + l2);
            let elements = STEPS * (forward + backward) + gather;
            assert_eq!(
                c.message_bytes,
                4 * elements as u64,
                "N={n} rank {r}: bytes sent (x sent again in the backward would add {})",
                4 * STEPS * (n - 1) * rows * (d_in + d_ff)
            );
        }
    }
}

/// Owner `j` sums the dW contributions in the order the ring pass carries them (from rank
/// `j + 1` round to `j`), and each rank adds its dX partials in the order rotation
/// accumulates them, with the same step kernels: on NdArray the two modes give the same bits,
/// and so does `Auto`, which mixes them pass by pass.
#[test]
fn routing_and_rotation_give_the_same_bits() {
    for which in [Which::Mlp, Which::Lm] {
        for n in [2, 3, 4, 8] {
            let rotated = run(which, n, Routing::Weights);
            for routing in [Routing::Activations, Routing::Auto] {
                assert_eq!(
                    apart(&rotated, &run(which, n, routing)),
                    (0, 0.0),
                    "{which:?} N={n} {routing}: (ulps apart, relative loss difference)"
                );
            }
        }
    }
}

/// Under balanced activation checkpointing autodiff releases some Linear inputs after the
/// forward and recomputes them for the backward: the owners let the peers' copies go with
/// them, and the backward sends `x` again. Every rank releases the same ones, so the run
/// neither desynchronises nor changes a bit.
#[test]
fn routing_under_activation_checkpointing_gives_rotations_bits() {
    for n in [3, 4] {
        let rotated = run_with::<BalancedCheckpointing>(Which::Lm, n, Routing::Weights);
        let routed = run_with::<BalancedCheckpointing>(Which::Lm, n, Routing::Activations);
        assert_eq!(apart(&rotated, &routed), (0, 0.0), "LM N={n}");
    }
}

/// Routing needs every rank to pass a Linear the same number of rows: a rank whose batch is
/// smaller makes every rank fail with a typed `Desync` that names the op and both shapes,
/// instead of a hang or a wrong result.
#[test]
fn ranks_with_unequal_rows_fail_with_a_typed_desync() {
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::{Distribution, Tensor};
    use burn_rtp::{launch, Rtp, RtpError};
    type Dist = burn::backend::Autodiff<Rtp<NdArray>>;
    let config = RtpConfig::new(2)
        .with_shard_threshold(0)
        .with_routing(Routing::Activations);
    let err = launch(config, |device| {
        let layer: Linear<Dist> = LinearConfig::new(8, 12).init(&device);
        let rows = if device.rank() == 0 { 4 } else { 3 };
        let x = Tensor::<Dist, 2>::random([rows, 8], Distribution::Default, &device);
        layer.forward(x).sum().into_scalar()
    })
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, RtpError::Desync { .. }), "{text}");
    assert!(text.contains("linear.route_x"), "{text}");
    assert!(text.contains("[3, 8]") && text.contains("[4, 8]"), "{text}");
}

/// `Auto` routes where a rank's rows weigh less than the weights and rotates elsewhere: the
/// MLP (24 rows over the world, 36 -> 100 -> 67) routes every pass, the LM (8 tokens per
/// sequence) rotates every pass, so each makes exactly the exchanges of that mode.
#[test]
fn auto_routes_the_small_batch_and_rotates_the_large_one() {
    for n in [4, 8] {
        let e = |which, r| run(which, n, r)[0].exchanges;
        let mlp = e(Which::Mlp, Routing::Auto);
        assert_eq!(mlp, e(Which::Mlp, Routing::Activations), "MLP N={n}");
        assert_ne!(mlp, e(Which::Mlp, Routing::Weights), "MLP N={n}");
        let lm = e(Which::Lm, Routing::Auto);
        assert_eq!(lm, e(Which::Lm, Routing::Weights), "LM N={n}");
        assert_ne!(lm, e(Which::Lm, Routing::Activations), "LM N={n}");
    }
}

/// Under `Auto`, ranks whose rows put them on either side of the choice take different
/// schedules; every rank must still fail with a typed error, well before its peer timeout.
#[test]
fn auto_with_unequal_rows_fails_every_rank_quickly() {
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::{Distribution, Tensor};
    use burn_rtp::{launch, Rtp};
    use std::time::{Duration, Instant};
    type Dist = burn::backend::Autodiff<Rtp<NdArray>>;
    for n in [2, 3, 4] {
        let config = RtpConfig::new(n)
            .with_shard_threshold(0)
            .with_routing(Routing::Auto)
            .with_peer_timeout(Duration::from_secs(60));
        let started = Instant::now();
        let err = launch(config, |device| {
            let layer: Linear<Dist> = LinearConfig::new(64, 64).init(&device);
            // Rank 0's 2 rows route; the others' 64 rows rotate.
            let rows = if device.rank() == 0 { 2 } else { 64 };
            let x = Tensor::<Dist, 2>::random([rows, 64], Distribution::Default, &device);
            layer.forward(x).sum().into_scalar()
        })
        .unwrap_err();
        let took = started.elapsed();
        assert!(took < Duration::from_secs(20), "N={n}: {took:?} for {err}");
    }
}
