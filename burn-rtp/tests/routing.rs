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
/// owners kept it from the forward. Before each forward the ranks agree their input shapes
/// (two dimensions, as floats, to each peer); the backward reads the forward's agreement.
/// The run ends by gathering the parameters.
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
            let agree = 2 * 2 * (n - 1);
            let elements = STEPS * (forward + backward + agree) + gather;
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

/// `Auto` routes where a rank's rows weigh less than the weights and rotates elsewhere: the
/// MLP (24 rows over the world, 36 -> 100 -> 67) routes every pass, the LM (8 tokens per
/// sequence) rotates every pass, so each makes the exchanges of that mode. The LM's ranks also
/// agree their input shapes at the first Linear forward, and then at most once every 33 (a
/// forward decides to rotate from the rows last agreed for up to 32 forwards; those fed an
/// input already agreed read that): seven forwards a step (query, key, value, the
/// attention's output, the MLP's two, the head).
#[test]
fn auto_routes_the_small_batch_and_rotates_the_large_one() {
    for n in [4, 8] {
        let e = |which, r| run(which, n, r)[0].exchanges;
        let mlp = e(Which::Mlp, Routing::Auto);
        assert_eq!(mlp, e(Which::Mlp, Routing::Activations), "MLP N={n}");
        assert_ne!(mlp, e(Which::Mlp, Routing::Weights), "MLP N={n}");
        let (auto, weights) = (
            run(Which::Lm, n, Routing::Auto),
            run(Which::Lm, n, Routing::Weights),
        );
        let agreements = auto[0].exchanges - weights[0].exchanges;
        let at_most = (7 * STEPS).div_ceil(33) as u64;
        assert!(
            (1..=at_most).contains(&agreements),
            "LM N={n}: {agreements} agreements of input shapes in {STEPS} steps"
        );
        // Each agreement sends this rank's three input dimensions to each peer, and nothing
        // else differs from rotation's messages.
        assert_eq!(
            auto[0].message_bytes,
            weights[0].message_bytes + agreements * 3 * 4 * (n as u64 - 1),
            "LM N={n}: bytes beside rotation's"
        );
        assert_ne!(
            auto[0].exchanges,
            e(Which::Lm, Routing::Activations),
            "LM N={n}"
        );
    }
}

/// What one rank computed through two Linears with an uneven batch: the output, dX, both
/// weights' gradients (gathered whole), and the exchanges and message bytes it made.
#[derive(Debug, Clone, PartialEq)]
struct Uneven {
    out: Vec<u32>,
    dx: Vec<u32>,
    dw: Vec<Vec<u32>>,
    exchanges: u64,
    message_bytes: u64,
}

/// Rows per rank: `(rank, world) -> rows`.
type Rows = fn(usize, usize) -> usize;

/// Two sharded Linears (64 -> 96 -> 40, so the second one computes dX, with a tanh between
/// them that balanced checkpointing recomputes) on rank `r`'s `rows(r, n)` rows of a formula's
/// inputs, forward and backward, at N = `n` under `routing`.
fn uneven(n: usize, routing: Routing, rows: Rows) -> Vec<Uneven> {
    uneven_with::<NoCheckpointing>(n, routing, rows)
}

fn uneven_with<C: CheckpointStrategy>(n: usize, routing: Routing, rows: Rows) -> Vec<Uneven> {
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::{Tensor, TensorData};
    use burn_rtp::{launch, Rtp};
    type Dist<C> = burn::backend::Autodiff<Rtp<NdArray>, C>;
    let config = RtpConfig::new(n)
        .with_shard_threshold(0)
        .with_routing(routing);
    fn bits<B: burn::tensor::backend::Backend>(t: Tensor<B, 2>) -> Vec<u32> {
        let values = t.into_data().to_vec::<f32>().expect("f32 values");
        values.into_iter().map(f32::to_bits).collect()
    }
    let wave = |len: usize, k: f32| (0..len).map(|i| (i as f32 * k).sin()).collect::<Vec<_>>();
    launch(config, |device| {
        // Seeded weights, loaded as a record so that they shard like a model's.
        let linear = |d_in: usize, d_out: usize, seed: u64| -> Linear<Dist<C>> {
            let seeded = seeded(
                LinearConfig::new(d_in, d_out).init::<NdArray>(&Default::default()),
                seed,
            );
            load_bytes(
                LinearConfig::new(d_in, d_out).init(&device),
                &to_bytes(seeded),
                &device,
            )
        };
        let (fc1, fc2) = (linear(64, 96, SEED), linear(96, 40, SEED + 1));
        let r = rows(device.rank(), n);
        let x = TensorData::new(wave(r * 64, 0.7 + device.rank() as f32), [r, 64]);
        let x = Tensor::<Dist<C>, 2>::from_data(x, &device).require_grad();
        let (exchanges, message_bytes) = (device.exchanges(), device.message_bytes());
        let out = fc2.forward(fc1.forward(x.clone()).tanh());
        let grads = out.clone().powf_scalar(2.0).sum().backward();
        let dw = [&fc1, &fc2].map(|l| bits(l.weight.grad(&grads).unwrap()));
        Uneven {
            out: bits(out),
            dx: bits(x.grad(&grads).unwrap()),
            dw: dw.to_vec(),
            exchanges: device.exchanges() - exchanges,
            message_bytes: device.message_bytes() - message_bytes,
        }
    })
    .expect("ranks with uneven batches run")
}

/// Rows every rank's batch makes small: `Auto` routes every pass.
const SMALL: Rows = |r, _| 1 + r;
/// Rank 0's batch small beside its peers' large ones: alone, its rows would route and its
/// peers' rotate; on the mean of the world's rows, `Auto` rotates every pass.
const MIXED: Rows = |r, _| if r == 0 { 2 } else { 64 };
/// Uneven rows whose mean puts the first Linear (64 -> 96) in the band where `Auto` rotates
/// its forward and routes its backward, which then sends `x` (the owners do not hold it).
const BAND: Rows = |r, n| match n {
    2 => [20, 28][r],
    3 => 18 + r,
    _ => [14, 15, 16, 15][r],
};

/// Ranks may pass a Linear different numbers of rows (an uneven last batch): they agree
/// every rank's shape first, so routing expects each peer's own rows and `Auto` decides each
/// pass alike on every rank. Whether every rank's batch is small (`Auto` routes), rank 0's
/// alone is (before the agreement its rows would have routed and its peers' rotated), or the
/// mean falls between `Auto`'s forward and backward thresholds, each mode gives rotation's
/// bits on every rank: the output, dX and both weights' gradients.
#[test]
fn ranks_with_unequal_rows_route_and_rotate_alike() {
    for n in [2, 3, 4] {
        for (name, rows) in [("small", SMALL), ("mixed", MIXED), ("band", BAND)] {
            let rotated = uneven(n, Routing::Weights, rows);
            let routed = uneven(n, Routing::Activations, rows);
            let auto = uneven(n, Routing::Auto, rows);
            for (r, ((a, b), c)) in rotated.iter().zip(&routed).zip(&auto).enumerate() {
                let results = |u: &Uneven| (u.out.clone(), u.dx.clone(), u.dw.clone());
                assert_eq!(results(a), results(b), "{name} N={n} rank {r}: routed");
                assert_eq!(results(a), results(c), "{name} N={n} rank {r}: auto");
                assert!(b.exchanges < a.exchanges || n < 4, "{name} N={n} rank {r}");
                // Every rank makes the same choice: all route the small batches (agreeing
                // their shapes at each forward), all rotate the mixed ones (their mean rows
                // weigh more than the weights) after one agreement of rows and features, at
                // the first forward: the second decides from it, the backward reads them.
                // In the band, the schedule is neither.
                let agreed = |u: &Uneven| (u.exchanges + 1, u.message_bytes + 8 * (n - 1) as u64);
                let got = (c.exchanges, c.message_bytes);
                match name {
                    "small" => assert_eq!(got, (b.exchanges, b.message_bytes), "{name} N={n}"),
                    "mixed" => assert_eq!(got, agreed(a), "{name} N={n} rank {r}"),
                    _ => {
                        assert_ne!(got, agreed(a), "{name} N={n} rank {r}: all rotated");
                        assert_ne!(c.message_bytes, b.message_bytes, "{name} N={n}: all routed");
                    }
                }
            }
        }
    }
}

/// Under balanced activation checkpointing the tanh between the Linears is recomputed, so the
/// second one's input is released after the forward (with its peers' copies on the owners)
/// and its backward runs as two passes. With unequal rows every routing still gives the bits
/// of rotation without checkpointing, on every rank.
#[test]
fn unequal_rows_under_activation_checkpointing_give_rotations_bits() {
    for n in [2, 3, 4] {
        for (name, rows) in [("small", SMALL), ("mixed", MIXED), ("band", BAND)] {
            let plain = uneven(n, Routing::Weights, rows);
            for routing in [Routing::Weights, Routing::Activations, Routing::Auto] {
                let balanced = uneven_with::<BalancedCheckpointing>(n, routing, rows);
                for (r, (a, b)) in plain.iter().zip(&balanced).enumerate() {
                    let results = |u: &Uneven| (u.out.clone(), u.dx.clone(), u.dw.clone());
                    assert_eq!(results(a), results(b), "{name} N={n} {routing} rank {r}");
                }
            }
        }
    }
}
