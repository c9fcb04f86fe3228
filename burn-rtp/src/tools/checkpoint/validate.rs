//! Checks a record's tensors before Burn decodes them. Burn's `TensorData` takes its bytes,
//! shape and dtype as they come, and converting one whose bytes do not fill its shape reads
//! values that were never saved (a dtype edited from `F32` to `F64` loads half the values
//! and zeros). Here every tensor of a MessagePack record is read in place, without copying
//! its bytes, and one whose byte count is not its element count times its element size is
//! refused.

use burn::tensor::DType;
use rmpv::ValueRef;

/// The dtypes of the tensors of the MessagePack record `bytes` (maps with `bytes`, `shape`
/// and `dtype`), in the order the record holds them, once each is checked to hold exactly
/// the bytes its shape and dtype call for; else the first fault, in words.
pub(super) fn tensor_dtypes(bytes: &[u8]) -> Result<Vec<DType>, String> {
    let mut rest = bytes;
    let value = rmpv::decode::read_value_ref(&mut rest)
        .map_err(|e| format!("it is not MessagePack: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes follow the record", rest.len()));
    }
    let mut dtypes = Vec::new();
    walk(&value, &mut dtypes)?;
    Ok(dtypes)
}

fn walk(value: &ValueRef<'_>, dtypes: &mut Vec<DType>) -> Result<(), String> {
    match value {
        ValueRef::Map(pairs) => match as_tensor(pairs) {
            Some(tensor) => {
                dtypes.push(tensor?);
                Ok(())
            }
            None => {
                check_param_id(pairs)?;
                pairs.iter().try_for_each(|(_, v)| walk(v, dtypes))
            }
        },
        ValueRef::Array(items) => items.iter().try_for_each(|v| walk(v, dtypes)),
        _ => Ok(()),
    }
}

/// Checks that a record's tensors (`dtypes`, in record order) are of the parameter kinds
/// `kinds` spells (one letter per parameter, as [`Kind::letter`] writes them).
pub(super) fn check_kinds(dtypes: &[DType], kinds: &str) -> Result<(), String> {
    let held: String = dtypes.iter().map(|&d| Kind::of(d).letter()).collect();
    if held == kinds {
        return Ok(());
    }
    let at = held
        .chars()
        .zip(kinds.chars())
        .position(|(a, b)| a != b)
        .unwrap_or(held.len().min(kinds.len()));
    Err(format!(
        "it holds {} tensors where the model has {} parameters, and tensor {at} is {:?} where \
         the parameter is {:?} (kinds {held:?}, expected {kinds:?})",
        held.len(),
        kinds.len(),
        held.chars().nth(at),
        kinds.chars().nth(at)
    ))
}

/// A parameter's record (a map with `id` and `param`) must carry an id Burn can read: Burn's
/// decoder panics on any other (and on a base-32 id longer than 8 bytes).
fn check_param_id(pairs: &[(ValueRef<'_>, ValueRef<'_>)]) -> Result<(), String> {
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| matches!(k, ValueRef::String(s) if s.as_str() == Some(name)))
            .map(|(_, v)| v)
    };
    let (Some(ValueRef::String(id)), Some(_)) = (field("id"), field("param")) else {
        return Ok(());
    };
    let id = id.as_str().unwrap_or("");
    // Burn writes 8 bytes in base 32 (DNSSEC alphabet): 13 characters at most.
    let base32 = id.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'v'));
    if (base32 && id.len() > 13) || burn::module::ParamId::try_deserialize(id).is_none() {
        return Err(format!("parameter id {id:?} is not one Burn writes"));
    }
    Ok(())
}

/// What kind of parameter a tensor of a record stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Float,
    Int,
    Bool,
}

impl Kind {
    /// The letter a manifest records the kind by.
    pub(super) fn letter(self) -> char {
        match self {
            Kind::Float => 'f',
            Kind::Int => 'i',
            Kind::Bool => 'b',
        }
    }

    /// The kind of parameter a record's tensor of `dtype` can load into. Burn converts a
    /// record's values to the parameter's element type, so an int tensor would load into a
    /// float parameter as numbers nobody saved; the kinds must match.
    pub(super) fn of(dtype: DType) -> Self {
        if dtype.is_float() || matches!(dtype, DType::QFloat(_)) {
            Kind::Float
        } else if matches!(dtype, DType::Bool(_)) {
            Kind::Bool
        } else {
            Kind::Int
        }
    }
}

/// A map that is a serialised `TensorData`, checked, as its dtype: `None` for any other map.
fn as_tensor(pairs: &[(ValueRef<'_>, ValueRef<'_>)]) -> Option<Result<DType, String>> {
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| matches!(k, ValueRef::String(s) if s.as_str() == Some(name)))
            .map(|(_, v)| v)
    };
    let (Some(data), Some(shape), Some(dtype)) = (field("bytes"), field("shape"), field("dtype"))
    else {
        return None;
    };
    let len = match data {
        ValueRef::Binary(b) => b.len(),
        ValueRef::Array(items) => items.len(),
        _ => return Some(Err("a tensor's bytes are not a byte string".into())),
    };
    let ValueRef::Array(dims) = shape else {
        return Some(Err("a tensor's shape is not a list".into()));
    };
    let mut numel: Option<u64> = Some(1);
    for dim in dims {
        let Some(d) = dim.as_u64() else {
            return Some(Err(format!("a tensor's dimension is {dim}")));
        };
        numel = numel.and_then(|n| n.checked_mul(d));
    }
    let dtype: DType = match dtype {
        // Plain dtypes are unit variants, which MessagePack records hold by name.
        ValueRef::String(name) => {
            let name = name.as_str().unwrap_or("");
            match serde_json::from_value(serde_json::Value::String(name.into())) {
                Ok(dtype) => dtype,
                Err(_) => return Some(Err(format!("a tensor's dtype {name:?} is unknown"))),
            }
        }
        // Quantized tensors pack values and parameters in their own layout.
        ValueRef::Map(_) => return Some(Ok(DType::QFloat(Default::default()))),
        other => return Some(Err(format!("a tensor's dtype is {other}"))),
    };
    let expected = numel.and_then(|n| n.checked_mul(dtype.size() as u64));
    Some(if expected == Some(len as u64) {
        Ok(dtype)
    } else {
        Err(format!(
            "a tensor of shape {dims:?} and dtype {dtype:?} holds {len} bytes, not {}",
            expected.map_or("more than u64::MAX".into(), |b| b.to_string())
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    /// A tensor as Burn's named MessagePack records hold it.
    fn record(bytes: usize, shape: &[u64], dtype: &str) -> Vec<u8> {
        let tensor = Value::Map(vec![
            ("bytes".into(), Value::Binary(vec![0; bytes])),
            (
                "shape".into(),
                Value::Array(shape.iter().map(|&d| Value::from(d)).collect()),
            ),
            ("dtype".into(), dtype.into()),
        ]);
        let record = Value::Map(vec![("weight".into(), Value::Array(vec![tensor]))]);
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &record).unwrap();
        out
    }

    #[test]
    fn a_tensor_whose_bytes_fit_passes_and_an_edited_one_is_refused() {
        assert_eq!(
            tensor_dtypes(&record(24, &[2, 3], "F32")),
            Ok(vec![DType::F32])
        );
        let err = tensor_dtypes(&record(24, &[2, 3], "F64")).unwrap_err();
        assert!(err.contains("holds 24 bytes, not 48"), "{err}");
        assert!(tensor_dtypes(&record(24, &[7], "F32")).is_err());
        let huge = tensor_dtypes(&record(24, &[u64::MAX, 2], "F32")).unwrap_err();
        assert!(huge.contains("more than u64::MAX"), "{huge}");
        assert!(tensor_dtypes(&record(24, &[2, 3], "NoSuchType")).is_err());
        assert!(tensor_dtypes(&[0x92, 0x01]).is_err(), "an array cut short");
        assert!(check_kinds(&[DType::F32, DType::I64], "fi").is_ok());
        let swapped = check_kinds(&[DType::I32, DType::I64], "fi").unwrap_err();
        assert!(swapped.contains("tensor 0"), "{swapped}");
        assert!(
            check_kinds(&[DType::F32], "fi").is_err(),
            "a tensor missing"
        );
        let mut trailing = record(24, &[2, 3], "F32");
        trailing.push(0);
        assert!(tensor_dtypes(&trailing).is_err());
    }

    /// Burn's decoder panics on an id it cannot read (and on a base-32 one longer than 8
    /// bytes); such a record is refused before it gets there.
    #[test]
    fn a_parameter_id_burn_cannot_read_is_refused() {
        let param = |id: &str| {
            let record = Value::Map(vec![("id".into(), id.into()), ("param".into(), Value::Nil)]);
            let mut out = Vec::new();
            rmpv::encode::write_value(&mut out, &record).unwrap();
            out
        };
        let written = burn::module::ParamId::new().serialize();
        assert_eq!(tensor_dtypes(&param(&written)), Ok(vec![]));
        for bad in ["F64", "0123456789abcdefghij", "not an id"] {
            let err = tensor_dtypes(&param(bad)).unwrap_err();
            assert!(err.contains("parameter id"), "{bad:?}: {err}");
        }
    }
}
