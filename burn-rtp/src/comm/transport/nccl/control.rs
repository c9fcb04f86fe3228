//! The control message that goes over MPI ahead of each NCCL payload.
//!
//! NCCL checks nothing: a receive of 4 KiB matched with a send of 8 KiB truncates or hangs,
//! and a receive of f16 matched with a send of f32 reads garbage. So before a payload moves,
//! the sender's MPI message tells the receiver its element type and shape; the receiver
//! checks them against the header it expects and only then posts the NCCL receive, into a
//! buffer of exactly that size. The control message is itself a [`Header`] whose shape is the
//! length of its fixed-size body (`[dtype code, dims…]`), so MPI's own checks apply to it too.
//!
//! Pure code: compiled and tested without CUDA.

use crate::comm::transport::{transport_error, Header};
use crate::error::{RtpError, RtpResult};
use burn::tensor::{DType, TensorData};

/// The element types NCCL moves for us, by their code in a control message.
const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// The header of the control message that announces a payload of `payload`'s header: the
/// same op, sequence number and part, with the shape of the control body.
pub(crate) fn header(payload: &Header) -> Header {
    Header {
        seq: payload.seq,
        op: payload.op.clone(),
        part: payload.part,
        shape: vec![payload.shape.len() + 1],
    }
}

/// The control body announcing a payload of `dtype` and `shape`; fails for element types
/// NCCL is not asked to move.
pub(crate) fn encode(
    rank: usize,
    op: &str,
    dtype: DType,
    shape: &[usize],
) -> RtpResult<TensorData> {
    let code = DTYPES
        .iter()
        .position(|d| *d == dtype)
        .ok_or_else(|| RtpError::Transport {
            rank,
            op: op.to_string(),
            reason: format!(
                "the NCCL transport moves f32, f64, f16 and bf16 tensors, not {dtype:?}"
            ),
        })?;
    let body: Vec<i64> = std::iter::once(code as i64)
        .chain(shape.iter().map(|&d| d as i64))
        .collect();
    let len = body.len();
    Ok(TensorData::new(body, [len]))
}

/// Reads the control body `got` from `peer` and checks it against the payload header this
/// rank `expect`s; returns the payload's element type.
pub(crate) fn decode(
    rank: usize,
    peer: usize,
    expect: &Header,
    got: &TensorData,
) -> RtpResult<DType> {
    let malformed = |why: String| {
        transport_error(
            rank,
            &expect.op,
            format!("from rank {peer}: malformed NCCL control message: {why}"),
        )
    };
    let body = got
        .as_slice::<i64>()
        .map_err(|e| malformed(format!("{e:?}")))?;
    let (&code, dims) = body
        .split_first()
        .ok_or_else(|| malformed("no element type".into()))?;
    let dtype = usize::try_from(code)
        .ok()
        .and_then(|c| DTYPES.get(c).copied())
        .ok_or_else(|| malformed(format!("unknown element type code {code}")))?;
    let shape: Vec<usize> = dims.iter().map(|&d| d.max(0) as usize).collect();
    if dims.iter().any(|&d| d < 0) || shape != expect.shape {
        return Err(RtpError::Desync {
            rank,
            peer,
            op: expect.op.to_string(),
            seq: expect.seq,
            expected: format!("a payload of shape {:?}", expect.shape),
            got: format!("a payload of shape {dims:?}"),
        });
    }
    Ok(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn payload(shape: Vec<usize>) -> Header {
        Header {
            seq: 7,
            op: Cow::Borrowed("rotate"),
            part: 2,
            shape,
        }
    }

    #[test]
    fn every_moved_dtype_and_shape_round_trips() {
        for dtype in DTYPES {
            for shape in [vec![], vec![5], vec![3, 7], vec![2, 1, 9]] {
                let expect = payload(shape.clone());
                let body = encode(0, "rotate", dtype, &shape).unwrap();
                assert_eq!(body.shape.to_vec(), header(&expect).shape);
                assert_eq!(decode(1, 0, &expect, &body).unwrap(), dtype);
            }
        }
    }

    #[test]
    fn a_shape_other_than_the_expected_one_is_a_desync() {
        let body = encode(0, "rotate", DType::F32, &[3, 8]).unwrap();
        let err = decode(1, 0, &payload(vec![3, 7]), &body).unwrap_err();
        assert!(
            matches!(
                err,
                RtpError::Desync {
                    rank: 1,
                    peer: 0,
                    seq: 7,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn an_unknown_dtype_is_refused_on_both_sides() {
        assert!(encode(0, "rotate", DType::I32, &[4]).is_err());
        let body = TensorData::new(vec![9i64, 4], [2]);
        let err = decode(1, 0, &payload(vec![4]), &body).unwrap_err();
        assert!(
            err.to_string().contains("unknown element type code 9"),
            "{err}"
        );
        let empty = TensorData::new(Vec::<i64>::new(), [0]);
        assert!(decode(1, 0, &payload(vec![]), &empty).is_err());
    }
}
