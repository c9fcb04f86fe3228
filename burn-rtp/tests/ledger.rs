//! The ledger counts every buffer an op keeps alive, not only the wrapped tensors: each test
//! runs one op on every rank and checks that the local peak during it covers the buffers the
//! op provably holds at one moment. Each failed before the ledger charged that buffer.

use burn::backend::NdArray;
use burn::nn::LinearConfig;
use burn::tensor::ops::ModuleOps;
use burn::tensor::{Distribution, Tensor, TensorPrimitive};
use burn_rtp::{launch, Layout, MemoryStats, Rtp, RtpConfig, RtpTensor};

type B = Rtp<NdArray>;

const WORLD: usize = 2;
const ROWS: usize = 16;
const D_IN: usize = 24;
const D_OUT: usize = 40;

/// Bytes of an f32 tensor of `dims`.
fn bytes(dims: &[usize]) -> u64 {
    dims.iter().product::<usize>() as u64 * 4
}

fn primitive<const D: usize>(t: Tensor<B, D>) -> RtpTensor<NdArray> {
    match t.into_primitive() {
        TensorPrimitive::Float(t) => t,
        TensorPrimitive::QFloat(_) => unreachable!("float tensors only"),
    }
}

fn local(dims: [usize; 2], device: &burn_rtp::RtpDevice<NdArray>) -> RtpTensor<NdArray> {
    primitive(Tensor::<B, 2>::random(
        dims,
        Distribution::Uniform(-1.0, 1.0),
        device,
    ))
}

/// A weight `[D_IN, D_OUT]` sharded over the ranks, as a Linear layer initialises it.
fn sharded_weight(device: &burn_rtp::RtpDevice<NdArray>) -> RtpTensor<NdArray> {
    let linear = LinearConfig::new(D_IN, D_OUT)
        .with_bias(false)
        .init::<B>(device);
    let w = primitive(linear.weight.val());
    assert!(
        matches!(w.layout(), Layout::Sharded(_)),
        "rank {}: the weight must be sharded for this test, got {:?}",
        w.rank(),
        w.layout()
    );
    w
}

/// Runs `op` on every rank with a fresh peak window and returns each rank's local peak.
fn local_peak(op: impl Fn(&burn_rtp::RtpDevice<NdArray>) + Send + Sync) -> Vec<MemoryStats> {
    launch(RtpConfig::new(WORLD).with_shard_threshold(0), |device| {
        device.barrier();
        op(&device);
        device.memory_peak()
    })
    .expect("the op runs on every rank")
}

fn check(peaks: &[MemoryStats], floor: u64, what: &str) {
    for (rank, peak) in peaks.iter().enumerate() {
        assert!(
            peak.local >= floor,
            "rank {rank}: local peak {} B < {floor} B: the ledger misses {what}",
            peak.local
        );
    }
}

#[test]
fn linear_weight_backward_keeps_x_and_dy_charged_while_it_rotates() {
    let peaks = local_peak(|device| {
        let x = local([ROWS, D_IN], device);
        // The forward leaves the record that tells the backward the weight was sharded.
        drop(B::linear(x.clone(), sharded_weight(device), None));
        let dy = local([ROWS, D_OUT], device);
        device.reset_memory_peak();
        let g = B::linear_weight_backward(x, dy);
        assert!(matches!(g.layout(), Layout::Sharded(_)));
    });
    // x, dy and one rank's contribution to the first travelling shard, all at once.
    let contribution = bytes(&[D_IN, D_OUT.div_ceil(WORLD)]) - bytes(&[D_IN, 1]);
    check(
        &peaks,
        bytes(&[ROWS, D_IN]) + bytes(&[ROWS, D_OUT]) + contribution,
        "the x and dy that full_inner took out of their wrappers",
    );
}

#[test]
fn linear_x_backward_charges_its_accumulator() {
    let peaks = local_peak(|device| {
        let w = sharded_weight(device);
        let dy = local([ROWS, D_OUT], device);
        device.reset_memory_peak();
        let dx = B::linear_x_backward(w, dy);
        assert_eq!(dx.inner_shape(), vec![ROWS, D_IN]);
    });
    check(
        &peaks,
        bytes(&[ROWS, D_OUT]) + bytes(&[ROWS, D_IN]),
        "dy or the dX accumulator",
    );
}

#[test]
fn linear_forward_writes_each_column_block_into_one_output() {
    let peaks = local_peak(|device| {
        let w = sharded_weight(device);
        let x = local([ROWS, D_IN], device);
        device.reset_memory_peak();
        let y = B::linear(x, w, None);
        assert_eq!(y.inner_shape(), vec![ROWS, D_OUT]);
    });
    // The generic composition computes each block apart and then writes it (the ledger
    // charges the block meanwhile); NdArray's native step writes the window in place.
    let block = match <NdArray as burn_rtp::RotationKernels>::kernel_path().linear_in_place() {
        true => 0,
        false => bytes(&[ROWS, D_OUT / WORLD]),
    };
    check(
        &peaks,
        bytes(&[ROWS, D_IN]) + bytes(&[ROWS, D_OUT]) + block,
        "x, the output or the block being written into it",
    );
    // The output is allocated once and the blocks are written into it: never the blocks
    // and a joined copy at once, as a concatenation would hold.
    for (rank, peak) in peaks.iter().enumerate() {
        assert!(
            peak.local < bytes(&[ROWS, D_IN]) + 2 * bytes(&[ROWS, D_OUT]),
            "rank {rank}: local peak {} B holds a second copy of the output",
            peak.local
        );
    }
}

#[test]
fn a_gather_fallback_charges_the_gathered_tensor() {
    let peaks = local_peak(|device| {
        let w = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(sharded_weight(device)));
        device.reset_memory_peak();
        // Slicing rows of a column-sharded tensor has no shard-wise rule: it gathers.
        let top = w.slice([0..D_IN / 2, 0..D_OUT]);
        assert_eq!(top.dims(), [D_IN / 2, D_OUT]);
        let fallbacks = device.gather_fallbacks();
        assert_eq!(fallbacks.get("float_slice"), Some(&1), "{fallbacks:?}");
    });
    check(
        &peaks,
        bytes(&[D_IN, D_OUT]) + bytes(&[D_IN / 2, D_OUT]),
        "the gathered full tensor",
    );
}

#[test]
fn a_message_waiting_in_an_inbox_stays_charged_to_its_sender_until_taken() {
    use burn_rtp::transport::{Header, HubOptions, InProcessHub, Payload, Transport};
    use burn_rtp::{Category, Delivery, Ledger};
    type Inner = <NdArray as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

    // Buffered delivery: the send completes before any receive is posted.
    let options = HubOptions {
        delivery: Delivery::Buffered,
        chaos: None,
    };
    let hub = InProcessHub::<Inner>::with_options(2, std::time::Duration::from_secs(5), options);
    let (sender, receiver) = (hub.endpoint(0), hub.endpoint(1));
    let ledger = Ledger::new();
    let device = Default::default();
    let shard = match Tensor::<NdArray, 2>::ones([D_IN, D_OUT], &device).into_primitive() {
        TensorPrimitive::Float(t) => t,
        TensorPrimitive::QFloat(_) => unreachable!("float tensors only"),
    };
    let charge = ledger.charge(Category::InFlight, bytes(&[D_IN, D_OUT]) as usize);
    let header = Header {
        seq: 0,
        op: "test.inbox".into(),
        part: 0,
        shape: vec![D_IN, D_OUT],
    };
    // Sent before the receiver posts: it waits in the receiver's inbox, and the sender moves
    // on, dropping its own handle to the buffer and its charge.
    let sent = sender
        .isend(
            1,
            header.clone(),
            Payload::Device(shard),
            vec![charge.clone()],
        )
        .expect("send");
    sent.wait().expect("a buffered send completes at once");
    drop(charge);
    assert_eq!(
        ledger.live().in_flight,
        bytes(&[D_IN, D_OUT]),
        "the waiting message still holds the sender's buffer"
    );
    let got = receiver
        .irecv(0, header)
        .expect("post")
        .wait()
        .expect("arrives");
    assert_eq!(
        ledger.live().in_flight,
        0,
        "taken: the receiver charges it now"
    );
    drop(got);
}

#[test]
fn by_default_a_send_completes_only_once_its_receive_took_it() {
    use burn_rtp::transport::{Header, InProcessHub, Payload, Transport};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    type Inner = <NdArray as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

    // The default delivery is rendezvous: a sender can never run ahead of its receiver with
    // its buffers waiting in the receiver's inbox, so what a rank holds does not depend on
    // how the ranks are scheduled.
    let hub = InProcessHub::<Inner>::new(2, std::time::Duration::from_secs(5));
    let shard =
        match Tensor::<NdArray, 2>::ones([D_IN, D_OUT], &Default::default()).into_primitive() {
            TensorPrimitive::Float(t) => t,
            TensorPrimitive::QFloat(_) => unreachable!("float tensors only"),
        };
    let header = Header {
        seq: 0,
        op: "test.rendezvous".into(),
        part: 0,
        shape: vec![D_IN, D_OUT],
    };
    let posted = Arc::new(AtomicBool::new(false));
    let sender = {
        let (endpoint, header, posted) = (hub.endpoint(0), header.clone(), posted.clone());
        std::thread::spawn(move || {
            let sent = endpoint
                .isend(1, header, Payload::Device(shard), Vec::new())
                .expect("send");
            sent.wait().expect("taken");
            posted.load(Ordering::SeqCst)
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    posted.store(true, Ordering::SeqCst);
    let got = hub.endpoint(1).irecv(0, header).expect("post").wait();
    assert!(got.is_ok(), "the message arrives");
    assert!(
        sender.join().unwrap(),
        "the send completed before its receive was posted"
    );
}
