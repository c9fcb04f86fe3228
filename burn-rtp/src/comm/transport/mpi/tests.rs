//! The MPI transport's own tests: arrivals decoded into tensors, and a singleton MPI world
//! (this process alone) sending to itself.

use super::buffer::{Elems, Held};
use super::*;
use burn::tensor::{DType, TensorData};
use std::borrow::Cow;

fn arrival(dtype: DType, shape: Vec<usize>, elems: Elems, len: usize) -> Arrival {
    Arrival {
        envelope: Ok(Envelope {
            header: Header {
                seq: 3,
                op: Cow::Borrowed("test"),
                part: 1,
                shape: shape.clone(),
            },
            dtype,
            shape,
        }),
        elems,
        len,
    }
}

/// The receive buffer becomes the tensor's data: NdArray takes the same allocation.
#[test]
fn received_bytes_become_the_tensor_without_a_copy() {
    let values = [1.5f32, -2.0, 3.25];
    let mut elems = Elems::zeroed(DType::F32.size(), 12);
    for (chunk, v) in elems.bytes_mut().chunks_mut(4).zip(values) {
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
    let at = elems.bytes_mut().as_ptr() as usize;
    let (header, data) = decode(arrival(DType::F32, vec![3], elems, 12)).unwrap();
    assert_eq!(header.shape, vec![3]);
    let vec = data.into_vec::<f32>().unwrap();
    assert_eq!(vec, values);
    assert_eq!(vec.as_ptr() as usize, at, "the received bytes were copied");
}

/// Each element size gets a buffer of its own alignment (f64 as u64, f16 as u16).
#[test]
fn receive_buffers_take_the_element_s_alignment() {
    for (dtype, align) in [(DType::F64, 8), (DType::F32, 4), (DType::F16, 2)] {
        let mut elems = Elems::zeroed(dtype.size(), 5 * dtype.size());
        assert_eq!(elems.bytes_mut().len(), 5 * dtype.size(), "{dtype:?}");
        assert_eq!(elems.bytes_mut().as_ptr() as usize % align, 0, "{dtype:?}");
        let (_, data) = decode(arrival(dtype, vec![5], elems, 5 * dtype.size())).unwrap();
        assert_eq!(data.as_bytes().len(), 5 * dtype.size());
    }
}

/// A singleton MPI world (this process alone, without `mpirun`) sending to itself: a wait
/// issues the calls the transport still holds (without it, the receive would never be
/// posted and the wait would time out), batches reach MPI in the order they were flushed,
/// and once MPI is finalised, posting fails instead of being held.
#[test]
fn waits_issue_held_calls_and_batches_keep_their_order() {
    let transport = Arc::new(
        MpiTransport::start(Duration::from_secs(20), MpiProgress::Auto, true, true)
            .expect("a singleton MPI world starts without mpirun"),
    );
    assert_eq!((transport.rank, transport.size), (0, 1));
    let endpoint = MpiEndpoint(transport.clone());
    let header = |part| Header {
        seq: 1,
        op: Cow::Borrowed("test"),
        part,
        shape: vec![2],
    };
    let data = |v: f32| TensorData::new(vec![v, -v], [2]);
    let send = |part, payload| {
        Transport::<()>::isend(&endpoint, 0, header(part), payload, Vec::new()).unwrap()
    };
    let first = send(0, Payload::Host(Arc::new(data(1.0))));
    Transport::<()>::flush(&endpoint).unwrap();
    // The second sends borrowed bytes, as ranks send the shards they hold.
    let second = send(1, Payload::Borrowed(Arc::new(Held(data(2.0)))));
    let receives = [0, 1].map(|part| Transport::<()>::irecv(&endpoint, 0, header(part)).unwrap());
    // No flush: the first wait must issue the second send and both receives.
    for (received, v) in receives.into_iter().zip([1.0f32, 2.0]) {
        let Payload::Host(data) = received.wait().unwrap() else {
            panic!("MPI receives host data")
        };
        assert_eq!(
            data.to_vec::<f32>().unwrap(),
            vec![v, -v],
            "batches kept their order, and borrowed bytes arrived as sent"
        );
    }
    first.wait().unwrap();
    second.wait().unwrap();
    assert_eq!(
        Transport::<()>::sent_bytes(&endpoint),
        16,
        "two messages of 2 f32 each, envelopes not counted"
    );
    // A payload whose shape is not its header's (the same 2 elements as [1, 2]) reaches
    // the receiver as a desynchronisation, not as data of the header's shape.
    let reshaped = Payload::Host(Arc::new(TensorData::new(vec![3.0f32, -3.0], [1, 2])));
    let sent = send(3, reshaped);
    let received = Transport::<()>::irecv(&endpoint, 0, header(3)).unwrap();
    match received.wait() {
        Err(RtpError::Desync { expected, got, .. }) => {
            assert!(
                expected.contains("[2]") && got.contains("[1, 2]"),
                "{expected} / {got}"
            )
        }
        other => panic!("expected RtpError::Desync, got {other:?}"),
    }
    sent.wait().unwrap();
    transport.finalize().unwrap();
    let late = Transport::<()>::irecv(&endpoint, 0, header(2));
    assert!(
        late.is_err(),
        "a receive posted after finalisation must fail"
    );
}

/// A length other than the envelope's, or an unreadable envelope, is an error, not data;
/// a payload whose own shape is not its header's is a shape disagreement.
#[test]
fn a_message_that_disagrees_with_its_envelope_is_refused() {
    let malformed = |arrival| match decode(arrival) {
        Err(Undecodable::Malformed(reason)) => reason,
        other => panic!("expected a malformed message, got {other:?}"),
    };
    let short = arrival(DType::F32, vec![3], Elems::zeroed(4, 8), 8);
    assert!(malformed(short).contains("carries 8 bytes, not the 12"));
    let mut bad = arrival(DType::F32, vec![3], Elems::zeroed(4, 12), 12);
    bad.envelope = Err("unreadable header: EOF".into());
    assert!(malformed(bad).contains("unreadable header"));
    let mut reshaped = arrival(DType::F32, vec![3], Elems::zeroed(4, 12), 12);
    if let Ok(envelope) = &mut reshaped.envelope {
        envelope.shape = vec![1, 3];
    }
    match decode(reshaped) {
        Err(Undecodable::Shape { header, shape }) => {
            assert_eq!((header.shape, shape), (vec![3], vec![1, 3]))
        }
        other => panic!("expected a shape disagreement, got {other:?}"),
    }
}
