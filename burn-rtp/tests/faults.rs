//! Bad input and failing peers give typed errors that name the rank, and never hang.

mod common;

use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::{Distribution, Tensor};
use burn_rtp::{check_rank, launch, try_launch, Rtp, RtpConfig, RtpError};
use common::*;
use std::time::{Duration, Instant};

type Dist = burn::backend::Autodiff<Rtp<burn::backend::NdArray>>;

#[test]
fn world_size_zero_is_rejected() {
    let err = launch(
        RtpConfig::new(0).with_shard_threshold(0),
        |_device: burn_rtp::RtpDevice<burn::backend::NdArray>| (),
    )
    .unwrap_err();
    assert_eq!(err, RtpError::EmptyWorld);
}

/// A process-per-rank transport asked for outside `mpirun` is a typed error naming it, not a
/// world of threads that silently ignores the request.
#[test]
fn a_process_transport_outside_mpirun_is_a_typed_error_naming_it() {
    if burn_rtp::transport::mpi_launch().is_some() {
        return; // started under mpirun: nothing to check here
    }
    for kind in [burn_rtp::TransportKind::Mpi, burn_rtp::TransportKind::Nccl] {
        let err = launch(
            RtpConfig::new(2).with_transport(kind),
            |_device: burn_rtp::RtpDevice<burn::backend::NdArray>| (),
        )
        .unwrap_err();
        match &err {
            RtpError::TransportUnavailable { transport, reason } => {
                assert_eq!(transport, &kind.to_string());
                assert!(reason.contains("not started by mpirun"), "{err}");
            }
            other => panic!("expected TransportUnavailable, got {other}"),
        }
    }
}

#[test]
fn a_rank_outside_the_world_is_rejected() {
    assert_eq!(
        check_rank(4, 4),
        Err(RtpError::RankOutOfRange {
            rank: 4,
            world_size: 4
        })
    );
    assert!(check_rank(3, 4).is_ok());
    let hub = burn_rtp::transport::InProcessHub::new(4, Duration::from_secs(1));
    let err = burn_rtp::register_device::<burn::backend::NdArray>(
        7,
        1,
        Default::default(),
        std::sync::Arc::new(hub.endpoint(0)),
        RtpConfig::new(4).with_shard_threshold(0),
    )
    .unwrap_err();
    assert_eq!(
        err,
        RtpError::RankOutOfRange {
            rank: 7,
            world_size: 4
        }
    );
    assert!(err.to_string().contains("rank 7"));
    assert_eq!(check_rank(0, 0), Err(RtpError::EmptyWorld));
}

#[test]
fn ranks_that_disagree_on_a_parameter_shape_fail_with_desync() {
    let err = launch(RtpConfig::new(2).with_shard_threshold(0), |device| {
        let d_out = if device.rank() == 0 { 16 } else { 17 };
        let layer: Linear<Dist> = LinearConfig::new(8, d_out).init(&device);
        let x = Tensor::<Dist, 2>::random([4, 8], Distribution::Default, &device);
        layer.forward(x).sum().into_scalar()
    })
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, RtpError::Desync { .. }), "{text}");
    assert!(text.contains("rank"), "{text}");
    assert!(text.contains("linear.forward"), "{text}");
}

#[test]
fn ranks_that_disagree_on_the_op_sequence_fail_with_desync() {
    let err = launch(RtpConfig::new(3).with_shard_threshold(0), |device| {
        let layer: Linear<Dist> = LinearConfig::new(8, 12).init(&device);
        let x = Tensor::<Dist, 2>::random([4, 8], Distribution::Default, &device);
        if device.rank() == 1 {
            // Rank 1 reads the weight (a gather) where the others run the layer.
            layer.weight.val().sum().into_scalar()
        } else {
            layer.forward(x).sum().into_scalar()
        }
    })
    .unwrap_err();
    assert!(matches!(err, RtpError::Desync { .. }), "{err}");
}

#[test]
fn a_panicking_rank_stops_every_rank_quickly_and_is_named() {
    let start = Instant::now();
    let err = launch(RtpConfig::new(4).with_shard_threshold(0), |device| {
        let mut model = Mlp::<Dist>::new(&device);
        let mut optim = burn_rtp::RtpOptimizer::new(adam().init());
        for step in 0..20 {
            if device.rank() == 2 && step == 3 {
                panic!("rank 2 lost its data loader");
            }
            let loss = step_loss_mlp(&model, step, rows(device.rank(), 4), &device);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(LR, model, grads);
        }
    })
    .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    match err {
        RtpError::RankFailed { rank, reason } => {
            assert_eq!(rank, 2);
            assert!(reason.contains("data loader"), "{reason}");
        }
        other => panic!("expected RankFailed for rank 2, got {other}"),
    }
}

#[test]
fn a_rank_returning_an_error_stops_the_others() {
    let start = Instant::now();
    let err = try_launch(RtpConfig::new(3).with_shard_threshold(0), |device| {
        let layer: Linear<Dist> = LinearConfig::new(8, 12).init(&device);
        for step in 0..50 {
            if device.rank() == 0 && step == 2 {
                return Err(format!("rank 0 hit a corrupt batch at step {step}"));
            }
            let x = Tensor::<Dist, 2>::random([4, 8], Distribution::Default, &device);
            let _ = layer.forward(x).sum().into_scalar();
        }
        Ok(())
    })
    .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(
        matches!(&err, RtpError::RankFailed { rank: 0, reason } if reason.contains("corrupt batch")),
        "{err}"
    );
}

#[test]
fn a_rank_that_exits_early_does_not_hang_the_others() {
    let start = Instant::now();
    let err = launch(RtpConfig::new(2).with_shard_threshold(0), |device| {
        let layer: Linear<Dist> = LinearConfig::new(8, 12).init(&device);
        let steps = if device.rank() == 0 { 1 } else { 5 };
        for _ in 0..steps {
            let x = Tensor::<Dist, 2>::random([4, 8], Distribution::Default, &device);
            let _ = layer.forward(x).sum().into_scalar();
        }
    })
    .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(
        matches!(
            err,
            RtpError::PeerExited {
                rank: 1,
                peer: 0,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn forgetting_the_optimizer_wrapper_is_reported() {
    let err = launch(RtpConfig::new(2).with_shard_threshold(0), |device| {
        let mut model = TinyLm::<Dist>::new(&device);
        let mut optim = adam().init();
        for step in 0..2 {
            let loss = step_loss_lm(&model, step, rows(device.rank(), 2), &device);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(LR, model, grads);
        }
    })
    .unwrap_err();
    assert!(matches!(err, RtpError::AmbiguousMix { .. }), "{err}");
    assert!(err.to_string().contains("RtpOptimizer"), "{err}");
}

#[test]
fn tensors_of_two_ranks_in_one_op_are_a_typed_error() {
    type Inner = Rtp<burn::backend::NdArray>;
    let slot = std::sync::Mutex::new(None);
    let handed_over = std::sync::Barrier::new(2);
    let err = launch(
        RtpConfig::new(2),
        |device: burn_rtp::RtpDevice<burn::backend::NdArray>| {
            if device.rank() == 1 {
                *slot.lock().unwrap() = Some(Tensor::<Inner, 1>::ones([3], &device));
            }
            handed_over.wait();
            if device.rank() == 0 {
                // Burn's tensor API checks devices itself; backend code (a custom op, another
                // decorator) calls the primitive ops, where the decorator must catch it.
                use burn::tensor::ops::FloatTensorOps;
                let theirs = slot.lock().unwrap().take().unwrap();
                let ours = Tensor::<Inner, 1>::ones([3], &device);
                let _ = Inner::float_add(
                    ours.into_primitive().tensor(),
                    theirs.into_primitive().tensor(),
                );
            }
        },
    )
    .unwrap_err();
    match &err {
        RtpError::MixedRanks {
            rank: 0, other: 1, ..
        } => assert!(err.to_string().contains("never cross ranks"), "{err}"),
        other => panic!("expected MixedRanks, got {other}"),
    }
}

/// Two Linears without biases, so that each forward gathers exactly one parameter.
#[derive(burn::module::Module, Debug)]
struct TwoLinears<B: burn::tensor::backend::Backend> {
    a: Linear<B>,
    b: Linear<B>,
}

/// An evaluation forward after the last step leaves FSDP's prefetch of the next weight on the
/// rank's background worker. The program returning does not end it: `launch` waits for it
/// and reports its failure. Here rank 1's forward reads a spare Linear of the same shape,
/// which is not one of the parameters the step registered, so it starts no prefetch, and rank
/// 0's prefetch has no partner: it fails once rank 1 has exited, and that fails the job.
#[test]
fn a_prefetch_left_by_an_evaluation_forward_is_drained_and_its_failure_reported() {
    let config = RtpConfig::new(2)
        .with_strategy(burn_rtp::Strategy::Fsdp)
        .with_shard_threshold(0)
        .with_peer_timeout(Duration::from_secs(20));
    let start = Instant::now();
    let outcome = launch(config, |device| {
        let linear = |d_in, d_out| LinearConfig::new(d_in, d_out).with_bias(false);
        let mut model = TwoLinears::<Dist> {
            a: linear(6, 10).init(&device),
            b: linear(10, 3).init(&device),
        };
        let spare: Linear<Dist> = linear(6, 10).init(&device);
        let mut optim = burn_rtp::RtpOptimizer::new(adam().init());
        let x = || Tensor::<Dist, 2>::random([4, 6], Distribution::Default, &device);
        // Two steps: the first registers the parameters, the second records their order.
        for _ in 0..2 {
            let loss = model.b.forward(model.a.forward(x())).sum();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(LR, model, grads);
        }
        let before = device.fsdp_prefetches();
        let y = if device.rank() == 0 {
            model.a.forward(x())
        } else {
            spare.forward(x())
        };
        let _ = y.sum().into_scalar();
        device.fsdp_prefetches().started - before.started
    });
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    let err = outcome.expect_err("rank 0's prefetch had no partner");
    assert!(
        matches!(
            &err,
            RtpError::PeerExited {
                rank: 0,
                peer: 1,
                op,
            } if op.contains("prefetch")
        ),
        "{err}"
    );
}

/// With every rank running the same evaluation forward, the prefetch it leaves is in flight
/// when the programs return (the case the test above fails on purpose), and waiting for it
/// ends the job cleanly on every rank.
#[test]
fn a_prefetch_left_by_an_evaluation_forward_ends_cleanly_when_every_rank_left_one() {
    let config = RtpConfig::new(3)
        .with_strategy(burn_rtp::Strategy::Fsdp)
        .with_shard_threshold(0);
    let left = launch(config, |device| {
        let linear = |d_in, d_out| LinearConfig::new(d_in, d_out).with_bias(false);
        let mut model = TwoLinears::<Dist> {
            a: linear(7, 11).init(&device),
            b: linear(11, 5).init(&device),
        };
        let mut optim = burn_rtp::RtpOptimizer::new(adam().init());
        let x = || Tensor::<Dist, 2>::random([4, 7], Distribution::Default, &device);
        for _ in 0..2 {
            let loss = model.b.forward(model.a.forward(x())).sum();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(LR, model, grads);
        }
        let before = device.fsdp_prefetches();
        let _ = model.a.forward(x()).sum().into_scalar();
        let after = device.fsdp_prefetches();
        (after.started - before.started, after.used - before.used)
    })
    .unwrap();
    // One prefetch started (of `b`), none taken: each program returned with it in flight.
    assert_eq!(left, vec![(1, 0); 3]);
}
