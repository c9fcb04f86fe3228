//! RTP training equals single-device training, step by step, for N in {1, 2, 3, 4, 8} and both
//! rotation modes, on dimensions that N does not divide (d_model 36, d_ff 100, vocab 67).
//!
//! With `RTP_CHAOS_SEED` set, every world runs with the in-process transport's chaos mode
//! (seeded delays and yields around each send, receive and hand-over), as the soak run in
//! `.ci/soak-equivalence` does: a race then shows as a failed comparison, not a lucky pass.

mod common;

use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::{Autodiff, NdArray};
use burn_rtp::{launch, Chaos, Delivery, RotationMode, Routing, Rtp, RtpConfig, Strategy};
use common::*;

type Dist = Autodiff<Rtp<NdArray>>;

/// Turns on the transport's chaos mode when `RTP_CHAOS_SEED` asks for it; each configuration
/// draws its own perturbations from that seed and its label.
fn stressed(config: RtpConfig, label: &str) -> RtpConfig {
    match std::env::var("RTP_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        Some(seed) => {
            let salt = label.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            });
            config.with_chaos(Chaos::new(seed ^ salt))
        }
        None => config,
    }
}

fn run_mlp_with(config: RtpConfig) {
    let label = format!(
        "N={} {} {} {}",
        config.world_size, config.strategy, config.rotation, config.routing
    );
    let config = stressed(config, &format!("mlp {label}"));
    let weights = mlp_weights(SEED);
    let (ref_losses, ref_params) = reference_mlp(&weights);
    let runs = rtp_mlp(config, &weights).expect("RTP run");
    if let Err(e) = compare(Which::Mlp, &ref_losses, &ref_params, &runs, &label) {
        panic!("{e}");
    }
}

fn run_lm_with(config: RtpConfig) {
    let world = config.world_size;
    let label = format!(
        "N={world} {} {} {}",
        config.strategy, config.rotation, config.routing
    );
    let config = stressed(config, &format!("lm {label}"));
    let weights = lm_weights(SEED);
    let (ref_losses, ref_params) = reference_lm(&weights);
    let runs = rtp_run_on::<NdArray>(Which::Lm, config, &weights).expect("RTP run");
    if let Err(e) = compare(Which::Lm, &ref_losses, &ref_params, &runs, &label) {
        panic!("{e}");
    }
}

/// RTP over `n` ranks with every parameter sharded, the weights rotating in `mode` (the
/// default `Routing::Auto` routes the MLP's passes, where the rotation mode plays no part).
fn rotating(n: usize, mode: RotationMode) -> RtpConfig {
    RtpConfig::new(n)
        .with_shard_threshold(0)
        .with_rotation(mode)
        .with_routing(Routing::Weights)
}

macro_rules! cases {
    ($($name:ident: $run:ident, $n:expr, $mode:expr;)*) => {
        $(#[test]
        fn $name() {
            $run(rotating($n, $mode));
        })*

        /// The same cases with buffered sends (a send completes at once, messages queue), the
        /// other delivery mode of the in-process transport; the cases above run the default,
        /// where a send completes only once its receive has taken it (as with MPI's rendezvous
        /// protocol or NCCL), so no call site may rely on buffering.
        mod buffered {
            use super::*;
            $(#[test]
            fn $name() {
                $run(buffered(rotating($n, $mode)));
            })*

            #[test]
            fn baselines_match_single_device() {
                super::baselines(buffered);
            }
        }
    };
}

cases! {
    mlp_n1_out_of_place: run_mlp_with, 1, RotationMode::OutOfPlace;
    mlp_n2_out_of_place: run_mlp_with, 2, RotationMode::OutOfPlace;
    mlp_n3_out_of_place: run_mlp_with, 3, RotationMode::OutOfPlace;
    mlp_n4_out_of_place: run_mlp_with, 4, RotationMode::OutOfPlace;
    mlp_n8_out_of_place: run_mlp_with, 8, RotationMode::OutOfPlace;
    mlp_n1_in_place: run_mlp_with, 1, RotationMode::InPlace;
    mlp_n2_in_place: run_mlp_with, 2, RotationMode::InPlace;
    mlp_n3_in_place: run_mlp_with, 3, RotationMode::InPlace;
    mlp_n4_in_place: run_mlp_with, 4, RotationMode::InPlace;
    mlp_n8_in_place: run_mlp_with, 8, RotationMode::InPlace;
    lm_n1_out_of_place: run_lm_with, 1, RotationMode::OutOfPlace;
    lm_n2_out_of_place: run_lm_with, 2, RotationMode::OutOfPlace;
    lm_n3_out_of_place: run_lm_with, 3, RotationMode::OutOfPlace;
    lm_n4_out_of_place: run_lm_with, 4, RotationMode::OutOfPlace;
    lm_n8_out_of_place: run_lm_with, 8, RotationMode::OutOfPlace;
    lm_n1_in_place: run_lm_with, 1, RotationMode::InPlace;
    lm_n2_in_place: run_lm_with, 2, RotationMode::InPlace;
    lm_n3_in_place: run_lm_with, 3, RotationMode::InPlace;
    lm_n4_in_place: run_lm_with, 4, RotationMode::InPlace;
    lm_n8_in_place: run_lm_with, 8, RotationMode::InPlace;
}

/// Both models at N = 1, 2, 3, 4 and 8 under `$config(n)`, in-process and with buffered sends.
macro_rules! world_cases {
    ($config:ident) => {
        world_cases!(@each $config;
            mlp_n1: run_mlp_with, 1;
            mlp_n2: run_mlp_with, 2;
            mlp_n3: run_mlp_with, 3;
            mlp_n4: run_mlp_with, 4;
            mlp_n8: run_mlp_with, 8;
            lm_n1: run_lm_with, 1;
            lm_n2: run_lm_with, 2;
            lm_n3: run_lm_with, 3;
            lm_n4: run_lm_with, 4;
            lm_n8: run_lm_with, 8;
        );
    };
    (@each $config:ident; $($name:ident: $run:ident, $n:expr;)*) => {
        $(#[test]
        fn $name() {
            $run($config($n));
            $run(buffered($config($n)));
        })*
    };
}

/// Activation routing (the weights stay home, the activations travel) against single-device
/// Burn, by the same standard as rotation, in-process and with buffered sends.
mod routed {
    use super::*;

    fn routed(n: usize) -> RtpConfig {
        RtpConfig::new(n)
            .with_shard_threshold(0)
            .with_routing(Routing::Activations)
    }

    world_cases!(routed);
}

/// RTP as configured by default (`Routing::Auto`: the MLP routes every pass, the LM rotates)
/// against single-device Burn, by the same standard, in-process and with buffered sends.
mod auto {
    use super::*;

    fn auto(n: usize) -> RtpConfig {
        let config = RtpConfig::new(n).with_shard_threshold(0);
        assert_eq!(config.routing, Routing::Auto, "the default");
        config
    }

    world_cases!(auto);
}

/// The two baselines run on the same machinery and must train identically too.
#[test]
fn baselines_match_single_device() {
    baselines(|c| c);
}

fn baselines(transport: fn(RtpConfig) -> RtpConfig) {
    for strategy in [Strategy::Fsdp, Strategy::Ddp] {
        run_mlp_with(transport(
            RtpConfig::new(4)
                .with_shard_threshold(0)
                .with_strategy(strategy),
        ));
        run_lm_with(transport(
            RtpConfig::new(3)
                .with_shard_threshold(0)
                .with_strategy(strategy),
        ));
    }
}

/// DDP's gradient buckets change when gradients are summed, never what: with every gradient
/// in a bucket of its own, with a few per bucket, and with the default (one bucket, started at
/// the step), DDP trains bit-identically to DDP without buckets, which matches single-device
/// Burn, at N = 2, 3, 4 and 8. The buckets must really have summed the gradients the step used.
#[test]
fn ddp_buckets_sum_exactly_what_the_step_would() {
    let weights = lm_weights(SEED);
    let (ref_losses, ref_params) = reference_lm(&weights);
    for n in [2, 3, 4, 8] {
        let run = |bytes: usize| {
            let config = RtpConfig::new(n)
                .with_strategy(Strategy::Ddp)
                .with_ddp_bucket_bytes(bytes);
            let config = stressed(config, &format!("ddp buckets {n} {bytes}"));
            rtp_run_checkpointed::<NdArray, NoCheckpointing>(Which::Lm, config, &weights)
                .expect("DDP run")
        };
        let flat = run(0);
        let label = format!("DDP without buckets, N={n}");
        let runs: Vec<RankRun> = flat.iter().map(|c| c.run.clone()).collect();
        if let Err(e) = compare(Which::Lm, &ref_losses, &ref_params, &runs, &label) {
            panic!("{e}");
        }
        assert!(flat.iter().all(|c| c.buckets == Default::default()));
        for bytes in [1, 16 << 10, burn_rtp::DEFAULT_DDP_BUCKET_BYTES] {
            let bucketed = run(bytes);
            for (rank, (got, want)) in bucketed.iter().zip(&flat).enumerate() {
                assert_eq!(
                    got.run, want.run,
                    "N={n}, rank {rank}, {bytes}-byte buckets: not bit-identical to DDP without buckets"
                );
                let b = got.buckets;
                // Per step: the two embeddings and the seven Linears' weights and biases are bucketed.
                assert!(
                    b.claimed >= 16 * STEPS as u64,
                    "N={n}, rank {rank}, {bytes}-byte buckets: only {b:?}"
                );
                let per_step = if bytes == 1 { b.claimed } else { STEPS as u64 };
                assert!(
                    b.started >= per_step,
                    "N={n}, rank {rank}, {bytes}-byte buckets: {b:?}"
                );
            }
        }
    }
}

/// FSDP gathers each layer's weight ahead, on the background worker, while the layer before
/// it computes, and still trains like single-device Burn at N = 2, 3, 4 and 8: from the third
/// step on (the second records the order), every gather but a step's first is prefetched.
#[test]
fn fsdp_prefetch_gathers_ahead_and_trains_like_single_device() {
    let weights = lm_weights(SEED);
    let (ref_losses, ref_params) = reference_lm(&weights);
    for n in [2, 3, 4, 8] {
        let config = RtpConfig::new(n).with_strategy(Strategy::Fsdp);
        let config = stressed(config, &format!("fsdp prefetch {n}"));
        let counted = rtp_run_checkpointed::<NdArray, NoCheckpointing>(Which::Lm, config, &weights)
            .expect("FSDP run");
        let runs: Vec<RankRun> = counted.iter().map(|c| c.run.clone()).collect();
        if let Err(e) = compare(
            Which::Lm,
            &ref_losses,
            &ref_params,
            &runs,
            &format!("FSDP N={n}"),
        ) {
            panic!("{e}");
        }
        // Per step: 16 gathers in the forward (two embeddings, seven Linears' weights and
        // biases) and 7 in the backward (the Linears' weights, for dX).
        let prefetched = (STEPS as u64 - 2) * (16 + 7 - 1);
        for (rank, c) in counted.iter().enumerate() {
            let p = c.prefetches;
            assert!(
                p.used >= prefetched && p.started == p.used,
                "N={n}, rank {rank}: {p:?}, expected {prefetched} used, none wasted"
            );
        }
    }
}

/// Buffered delivery, the in-process transport's other mode.
fn buffered(config: RtpConfig) -> RtpConfig {
    config.with_delivery(Delivery::Buffered)
}

/// The rotation really shards: parameters are 1/N per rank and only the LayerNorm gains and
/// biases (used outside module ops) are gathered.
#[test]
fn parameters_are_sharded_and_gathers_are_limited_to_layer_norm() {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::{Tensor, TensorPrimitive};
    struct Layouts(Vec<(Vec<usize>, String)>);
    impl ModuleVisitor<Dist> for Layouts {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Dist, D>>) {
            let TensorPrimitive::Float(t) = param.val().inner().into_primitive() else {
                unreachable!()
            };
            self.0.push((t.inner_shape(), format!("{:?}", t.layout())));
        }
    }
    let world = 4;
    let out = launch(RtpConfig::new(world).with_shard_threshold(0), |device| {
        let model = TinyLm::<Dist>::new(&device);
        let mut v = Layouts(Vec::new());
        model.visit(&mut v);
        let loss = step_loss_lm(&model, 0, rows(device.rank(), world), &device);
        let _ = loss.backward();
        (v.0, device.gather_fallbacks())
    })
    .unwrap();
    for (shape, layout) in &out[0].0 {
        assert!(layout.starts_with("Sharded"), "{shape:?} is {layout}");
    }
    // Rank 0 holds the first ceil(36/4) = 9 columns of every d_model-wide parameter.
    assert!(out[0].0.iter().any(|(s, _)| s == &vec![VOCAB, 9]));
    for op in out[0].1.keys() {
        assert!(
            op == "float_mul" || op == "float_add",
            "unexpected gather in {op}: {:?}",
            out[0].1
        );
    }
}
