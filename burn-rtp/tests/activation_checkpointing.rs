//! Activation checkpointing composes with RTP: `Autodiff<Rtp<NdArray>, BalancedCheckpointing>`
//! trains like single-device `Autodiff<NdArray, BalancedCheckpointing>` and like single-device
//! training without checkpointing, step by step, for N in {1, 2, 3, 4, 8} and both rotation
//! modes, on dimensions that N does not divide (d_model 36, d_ff 100, vocab 67).
//!
//! Burn's balanced strategy recomputes memory-bound ops (normalisation, activations,
//! reshapes) in the backward pass and keeps the outputs of compute-bound ones (matmuls and
//! Linears), so no rotated Linear runs its forward twice. What changes under it is that a
//! Linear's input can be recomputed: its backward then computes dX in the weights' ring pass
//! and sends dW around in a pass of its own (see `burn_rtp`'s pairing), which the exchange
//! counts below pin down.

mod common;

use burn::backend::autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn::backend::{Autodiff, NdArray};
use burn_rtp::{Layout, RotationMode, Routing, RtpConfig, Strategy};
use common::*;

type Balanced = Autodiff<NdArray, BalancedCheckpointing>;

/// Both single-device references of `which`: with balanced checkpointing, and without.
fn references(which: Which, weights: &[u8]) -> [(&'static str, RankRun); 2] {
    match which {
        Which::Mlp => [
            (
                "single-device balanced",
                reference_mlp_on::<Balanced>(weights, 1),
            ),
            ("single-device", reference_mlp(weights)),
        ],
        Which::Lm => [
            (
                "single-device balanced",
                reference_lm_on::<Balanced>(weights),
            ),
            ("single-device", reference_lm(weights)),
        ],
    }
}

fn weights(which: Which) -> Vec<u8> {
    match which {
        Which::Mlp => mlp_weights(SEED),
        Which::Lm => lm_weights(SEED),
    }
}

/// Trains `which` under `config` with balanced checkpointing and checks it against both
/// references; returns the runs.
fn matches_references(which: Which, config: RtpConfig) -> Vec<Counted> {
    let label = format!(
        "balanced N={} {} {}",
        config.world_size, config.strategy, config.rotation
    );
    let weights = weights(which);
    let runs = rtp_run_checkpointed::<NdArray, BalancedCheckpointing>(which, config, &weights)
        .expect("RTP run");
    let plain: Vec<RankRun> = runs.iter().map(|c| c.run.clone()).collect();
    for (name, (losses, params)) in references(which, &weights) {
        if let Err(e) = compare(which, &losses, &params, &plain, &label) {
            panic!("against {name}: {e}");
        }
    }
    runs
}

fn case(which: Which, n: usize, mode: RotationMode) {
    // The weights rotating: the exchanges below count rotation's passes (routing under
    // checkpointing is `tests/routing.rs`'s).
    let config = || {
        RtpConfig::new(n)
            .with_shard_threshold(0)
            .with_rotation(mode)
            .with_routing(Routing::Weights)
    };
    let balanced = matches_references(which, config());
    // The same world without checkpointing: the numbers are the same to the bit (the
    // recomputed ops repeat the same arithmetic), so a checkpoint resumes under either
    // setting exactly.
    let plain = rtp_run_checkpointed::<NdArray, NoCheckpointing>(which, config(), &weights(which))
        .expect("RTP run without checkpointing");
    for (rank, (b, p)) in balanced.iter().zip(&plain).enumerate() {
        assert_eq!(
            b.run, p.run,
            "{which:?} N={n} {mode} rank {rank}: balanced checkpointing changed the numbers"
        );
    }
    // Exchanges: the MLP's second Linear reads the GELU's output, which balanced
    // checkpointing recomputes, so its dW travels in a pass of its own, N - 1 exchanges a
    // step; nothing else is exchanged again (the first Linear's input is the data, kept).
    if let Which::Mlp = which {
        for (rank, (b, p)) in balanced.iter().zip(&plain).enumerate() {
            assert_eq!(
                b.exchanges,
                p.exchanges + (STEPS * (n - 1)) as u64,
                "MLP N={n} {mode} rank {rank}: exchanges with balanced checkpointing"
            );
        }
    }
    // The language model: at most one extra pass per Linear (7: query, key, value, output,
    // two feed-forward and the head) a step, never a second rotation of a weight, and the
    // LayerNorm gathers the recomputation repeats are served from the kept copies.
    if let Which::Lm = which {
        for (rank, (b, p)) in balanced.iter().zip(&plain).enumerate() {
            assert!(
                b.exchanges >= p.exchanges
                    && b.exchanges <= p.exchanges + (STEPS * 7 * (n - 1)) as u64,
                "LM N={n} {mode} rank {rank}: {} exchanges with balanced checkpointing, {} \
                 without",
                b.exchanges,
                p.exchanges
            );
        }
    }
}

macro_rules! cases {
    ($($name:ident: $which:expr, $n:expr, $mode:expr;)*) => {
        $(#[test]
        fn $name() {
            case($which, $n, $mode);
        })*
    };
}

cases! {
    mlp_n1_out_of_place: Which::Mlp, 1, RotationMode::OutOfPlace;
    mlp_n2_out_of_place: Which::Mlp, 2, RotationMode::OutOfPlace;
    mlp_n3_out_of_place: Which::Mlp, 3, RotationMode::OutOfPlace;
    mlp_n4_out_of_place: Which::Mlp, 4, RotationMode::OutOfPlace;
    mlp_n8_out_of_place: Which::Mlp, 8, RotationMode::OutOfPlace;
    mlp_n1_in_place: Which::Mlp, 1, RotationMode::InPlace;
    mlp_n2_in_place: Which::Mlp, 2, RotationMode::InPlace;
    mlp_n3_in_place: Which::Mlp, 3, RotationMode::InPlace;
    mlp_n4_in_place: Which::Mlp, 4, RotationMode::InPlace;
    mlp_n8_in_place: Which::Mlp, 8, RotationMode::InPlace;
    lm_n1_out_of_place: Which::Lm, 1, RotationMode::OutOfPlace;
    lm_n2_out_of_place: Which::Lm, 2, RotationMode::OutOfPlace;
    lm_n3_out_of_place: Which::Lm, 3, RotationMode::OutOfPlace;
    lm_n4_out_of_place: Which::Lm, 4, RotationMode::OutOfPlace;
    lm_n8_out_of_place: Which::Lm, 8, RotationMode::OutOfPlace;
    lm_n1_in_place: Which::Lm, 1, RotationMode::InPlace;
    lm_n2_in_place: Which::Lm, 2, RotationMode::InPlace;
    lm_n3_in_place: Which::Lm, 3, RotationMode::InPlace;
    lm_n4_in_place: Which::Lm, 4, RotationMode::InPlace;
    lm_n8_in_place: Which::Lm, 8, RotationMode::InPlace;
}

/// The two baselines under balanced checkpointing train like single-device training too,
/// with the same exchanges as without it: a Linear whose input autodiff recomputes still
/// finds its weight's layout, so its gradient goes to its shard (FSDP) instead of staying
/// whole per rank until the optimizer all-reduces it. RTP at N = 3 alongside.
#[test]
fn baselines_match_single_device() {
    for strategy in [Strategy::Fsdp, Strategy::Ddp, Strategy::Rtp] {
        for which in [Which::Mlp, Which::Lm] {
            let config = || {
                RtpConfig::new(3)
                    .with_shard_threshold(0)
                    .with_strategy(strategy)
            };
            let balanced = matches_references(which, config());
            let plain =
                rtp_run_checkpointed::<NdArray, NoCheckpointing>(which, config(), &weights(which))
                    .expect("run without checkpointing");
            // RTP: at most one more pass (N - 1 = 2 exchanges) per Linear and step, of the
            // MLP's 2 and the LM's 7 Linears.
            let linears = match which {
                Which::Mlp => 2,
                Which::Lm => 7,
            };
            let extra = match strategy {
                Strategy::Rtp => (linears * STEPS * 2) as u64,
                _ => 0,
            };
            assert_eq!(
                gradient_layouts::<BalancedCheckpointing>(which, config()),
                gradient_layouts::<NoCheckpointing>(which, config()),
                "{which:?} {strategy}: the gradients' layouts after one backward pass"
            );
            for (rank, (b, p)) in balanced.iter().zip(&plain).enumerate() {
                assert!(
                    b.exchanges >= p.exchanges && b.exchanges <= p.exchanges + extra,
                    "{which:?} {strategy} rank {rank}: {} exchanges with balanced \
                     checkpointing, {} without",
                    b.exchanges,
                    p.exchanges
                );
            }
        }
    }
}

/// Each rank's gradient layouts after one backward pass on `Autodiff<Rtp<NdArray>, C>`, in
/// the model's parameter order.
fn gradient_layouts<C: CheckpointStrategy>(which: Which, config: RtpConfig) -> Vec<Vec<Layout>> {
    use burn::module::{AutodiffModule, ModuleVisitor, Param};
    use burn::optim::GradientsParams;
    use burn::tensor::{Tensor, TensorPrimitive};
    use burn_rtp::Rtp;
    type D<C> = Autodiff<Rtp<NdArray>, C>;
    struct Layouts<'a> {
        grads: &'a GradientsParams,
        seen: Vec<Layout>,
    }
    impl<C: CheckpointStrategy> ModuleVisitor<D<C>> for Layouts<'_> {
        fn visit_float<const N: usize>(&mut self, param: &Param<Tensor<D<C>, N>>) {
            let grad: Tensor<Rtp<NdArray>, N> = self.grads.get(param.id).expect("a gradient");
            let TensorPrimitive::Float(t) = grad.into_primitive() else {
                unreachable!("float gradients")
            };
            self.seen.push(t.layout().clone());
        }
    }
    /// The layouts of `model`'s gradients from `loss`.
    fn layouts<C: CheckpointStrategy, M: AutodiffModule<D<C>>>(
        model: &M,
        loss: Tensor<D<C>, 1>,
    ) -> Vec<Layout> {
        let grads = GradientsParams::from_grads(loss.backward(), model);
        let mut v = Layouts {
            grads: &grads,
            seen: Vec::new(),
        };
        model.visit(&mut v);
        v.seen
    }
    let weights = weights(which);
    let world = config.world_size;
    burn_rtp::launch(config, |device| {
        let rows = rows(device.rank(), world);
        match which {
            Which::Mlp => {
                let model = load_bytes(Mlp::<D<C>>::new(&device), &weights, &device);
                layouts(&model, step_loss_mlp(&model, 0, rows, &device))
            }
            Which::Lm => {
                let model = load_bytes(TinyLm::<D<C>>::new(&device), &weights, &device);
                layouts(&model, step_loss_lm(&model, 0, rows, &device))
            }
        }
    })
    .expect("one backward pass")
}

/// Forwards whose backward never comes (evaluation on the autodiff model) leave nothing
/// behind once autodiff frees their graph (at its next backward pass): the records of
/// attention's query, key and value Linears, which share their input, do not keep it alive
/// for one another.
#[test]
fn forwards_without_backward_leave_no_activations_behind() {
    use burn_rtp::Rtp;
    type D = Autodiff<Rtp<NdArray>>;
    let weights = lm_weights(SEED);
    let world = 2;
    let live = burn_rtp::launch(RtpConfig::new(world).with_shard_threshold(0), |device| {
        let model = load_bytes(TinyLm::<D>::new(&device), &weights, &device);
        let rows = rows(device.rank(), world);
        let mut live = Vec::new();
        for step in 0..8 {
            let evaluated = step_loss_lm(&model, step, rows.clone(), &device);
            let _ = evaluated.into_scalar();
            let trained = step_loss_lm(&model, step, rows.clone(), &device);
            drop(trained.backward());
            live.push(device.memory_live().local);
        }
        live
    })
    .expect("forward passes");
    // Autodiff frees a graph at a later backward pass, on its own schedule, so a pass may
    // end with an earlier graph still alive; what must not happen is growth, pass after pass.
    for (rank, local) in live.iter().enumerate() {
        let early = local[0].max(local[1]);
        assert!(
            local[local.len() - 1] <= early,
            "rank {rank}: local bytes alive after each forward-only pass grow: {local:?}"
        );
    }
}
