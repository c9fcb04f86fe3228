//! What travels: the tags, the envelope sent before each tensor's bytes, and how a received
//! message becomes a tensor (or a typed disagreement).

use super::super::Header;
use super::buffer::Elems;
use burn::tensor::{DType, TensorData};
use std::sync::mpsc::Sender;

/// Tag of tensor bytes.
pub(super) const DATA: i32 = 0;
/// Tag of the notice a failing rank sends to every other rank.
pub(super) const ABORT: i32 = 1;
/// Tag of the envelope sent before each tensor's bytes.
pub(super) const ENVELOPE: i32 = 2;

/// The element type and header of a message, as sent before its bytes, with the shape of the
/// payload itself: the receiver checks it against the header's.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Envelope {
    pub(super) header: Header,
    pub(super) dtype: DType,
    pub(super) shape: Vec<usize>,
}

/// Why a request failed: a peer sent the abort notice, naming itself and its reason.
#[derive(Debug, Clone)]
pub(super) struct Fault {
    pub(super) peer: usize,
    pub(super) reason: String,
}

/// Where the communication thread answers a rank's request.
pub(super) type Reply<T> = Sender<Result<T, Fault>>;

/// A received tensor message: its envelope (or why it could not be read), the buffer its
/// bytes landed in, and how many bytes came.
pub(super) struct Arrival {
    pub(super) envelope: Result<Envelope, String>,
    pub(super) elems: Elems,
    pub(super) len: usize,
}

/// Why a received message cannot become a tensor.
#[derive(Debug)]
pub(super) enum Undecodable {
    /// The envelope could not be read, or the byte count disagrees with it.
    Malformed(String),
    /// The payload's own shape is not the one its header announces.
    Shape { header: Header, shape: Vec<usize> },
}

/// A received message as the header it carried and its tensor, which takes the receive
/// buffer as its data without a copy.
pub(super) fn decode(arrival: Arrival) -> Result<(Header, TensorData), Undecodable> {
    let Arrival {
        envelope,
        elems,
        len,
    } = arrival;
    let envelope = envelope.map_err(Undecodable::Malformed)?;
    if envelope.shape != envelope.header.shape {
        return Err(Undecodable::Shape {
            header: envelope.header,
            shape: envelope.shape,
        });
    }
    // The shape comes off the wire: its size is computed without overflow, so no shape can
    // pass for one whose bytes would fit.
    let expected = envelope
        .shape
        .iter()
        .try_fold(envelope.dtype.size(), |bytes, &dim| bytes.checked_mul(dim));
    if expected != Some(len) {
        let expected = expected.map_or("more than usize::MAX".to_string(), |b| b.to_string());
        return Err(Undecodable::Malformed(format!(
            "{} carries {len} bytes, not the {expected} of {:?} {:?}",
            envelope.header, envelope.dtype, envelope.shape
        )));
    }
    Ok((
        envelope.header,
        TensorData::from_bytes(elems.into_bytes(), envelope.shape, envelope.dtype),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    fn dtype() -> impl Strategy<Value = DType> {
        prop::sample::select(vec![
            DType::F64,
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::I64,
            DType::I32,
            DType::U8,
            DType::U32,
        ])
    }

    fn dims() -> impl Strategy<Value = Vec<usize>> {
        let dim = prop_oneof![0usize..6, Just(usize::MAX), Just(1 << 32), any::<usize>()];
        prop::collection::vec(dim, 0..4)
    }

    fn envelope_json(header_shape: &[usize], shape: &[usize], dtype: DType) -> Vec<u8> {
        let header = serde_json::json!({"seq": 7, "op": "t", "part": 0, "shape": header_shape});
        let env = serde_json::json!({"header": header, "dtype": dtype, "shape": shape});
        serde_json::to_vec(&env).unwrap()
    }

    /// What arrives: an envelope's bytes and a payload length. A third are consistent
    /// messages (the payload fits, or is a few bytes off), the rest odd envelopes (shapes
    /// that disagree, dimensions near `usize::MAX`) or random bytes.
    fn arrival() -> impl Strategy<Value = (Vec<u8>, usize)> {
        let consistent = (
            prop::collection::vec(0usize..5, 0..4),
            dtype(),
            -2i64..=2,
            any::<bool>(),
        )
            .prop_map(|(shape, dtype, off, exact)| {
                let len = shape.iter().product::<usize>() * dtype.size();
                let len = if exact {
                    len
                } else {
                    (len as i64 + off).max(0) as usize
                };
                (envelope_json(&shape, &shape, dtype), len)
            });
        let odd =
            (dims(), dims(), dtype(), 0usize..256).prop_map(|(header_shape, shape, dtype, len)| {
                (envelope_json(&header_shape, &shape, dtype), len)
            });
        let random = (prop::collection::vec(any::<u8>(), 0..200), 0usize..256);
        prop_oneof![2 => consistent, 3 => odd, 1 => random]
    }

    /// A shape whose byte size overflows `usize` is refused, not wrapped into one that fits.
    #[test]
    fn a_shape_whose_size_overflows_is_refused() {
        let shape = vec![usize::MAX / 2 + 1, 2];
        let envelope = Envelope {
            header: Header {
                seq: 0,
                op: "t".into(),
                part: 0,
                shape: shape.clone(),
            },
            dtype: DType::F32,
            shape,
        };
        let arrival = Arrival {
            envelope: Ok(envelope),
            elems: Elems::zeroed(4, 0),
            len: 0,
        };
        assert!(matches!(decode(arrival), Err(Undecodable::Malformed(_))));
    }

    /// Random and odd envelopes with payloads of any length: each decodes to exactly the
    /// tensor it announces, or is refused; none panics or builds a tensor its bytes do not
    /// fill. `PROPTEST_CASES` sets the count (the local campaign in docs/testing.md).
    #[test]
    fn malformed_envelopes_are_refused_and_valid_ones_decode_exactly() {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(2048);
        let config = Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[3; 32]);
        let (refused, decoded) = (std::cell::Cell::new(0u64), std::cell::Cell::new(0u64));
        TestRunner::new_with_rng(config, rng)
            .run(&arrival(), |(raw, len)| {
                let envelope = serde_json::from_slice::<Envelope>(&raw).map_err(|e| e.to_string());
                let announced = envelope
                    .as_ref()
                    .ok()
                    .map(|e| (e.header.shape == e.shape, e.shape.clone(), e.dtype));
                let size = envelope.as_ref().map_or(1, |e| e.dtype.size());
                let arrival = Arrival {
                    envelope,
                    elems: Elems::zeroed(size, len),
                    len,
                };
                match decode(arrival) {
                    Ok((header, data)) => {
                        let (agree, shape, dtype) = announced.expect("decoded from an envelope");
                        prop_assert!(agree);
                        prop_assert_eq!(&header.shape, &shape);
                        prop_assert_eq!(data.shape.to_vec(), shape.clone());
                        prop_assert_eq!(data.dtype, dtype);
                        let numel: usize = shape.iter().product();
                        prop_assert_eq!(data.as_bytes().len(), len);
                        prop_assert_eq!(numel * dtype.size(), len);
                        decoded.set(decoded.get() + 1);
                    }
                    Err(_) => refused.set(refused.get() + 1),
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
        let (refused, decoded) = (refused.get(), decoded.get());
        eprintln!(
            "malformed envelopes: {cases} inputs, {refused} refused, {decoded} decoded exactly"
        );
        assert_eq!(refused + decoded, u64::from(cases));
        assert!(
            refused > 0 && decoded > 0,
            "{refused} refused, {decoded} decoded"
        );
    }
}
