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
    let expected = envelope.shape.iter().product::<usize>() * envelope.dtype.size();
    if len != expected {
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
