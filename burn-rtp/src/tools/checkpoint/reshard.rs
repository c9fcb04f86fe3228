//! Re-slicing a checkpoint for another world, on the host.
//!
//! A rank's record file is a named MessagePack tree. Its tensors are maps with `bytes`,
//! `shape` and `dtype`; each sits at a path of field names and indices that is the same on
//! every rank, except for the keys of an optimizer's state, which are parameter ids, and ids
//! differ between ranks. Those keys are read as "the parameter at this path of the model"
//! (each model record pairs a parameter's id with its value), so a tensor has one canonical
//! path in every rank's files.
//!
//! A target rank takes old rank 0's tree as the template (ids, metadata, every non-tensor
//! value) and replaces each tensor by the columns the new placement gives it, copied row by
//! row from the old ranks whose columns overlap them. It reads only those ranks' files (and
//! rank 0's), so a rank of the new world holds about its own share of the model, never the
//! whole. A world of one rank under DDP gets the whole model: that is consolidation.

use super::{model_file, optim_file, Checkpoint, CheckpointError, Target};
use crate::backend::strategy::placement;
use crate::state::shard_io::{ShardIo, ShardMap};
use crate::state::sharding::{copy_columns, ShardRange, ShardSpec};
use burn::tensor::Shape;
use rmpv::Value;
use std::collections::{BTreeSet, HashMap};

/// A target rank's records, and the map that makes their tensors shards again.
pub(super) struct Resharded {
    /// The model record (named MessagePack).
    pub model: Vec<u8>,
    /// The optimizer record.
    pub optim: Vec<u8>,
    /// Which full shape each new shard shape stands for.
    pub map: ShardMap,
}

/// A tensor of one old rank's files: its shape and element bytes.
struct Piece<'a> {
    shape: Vec<usize>,
    bytes: &'a [u8],
}

/// One old rank's decoded records.
struct OldRank {
    model: Value,
    optim: Value,
}

/// The canonical path of every tensor of one old rank.
type Index<'a> = HashMap<String, Piece<'a>>;

/// Builds `target`'s records from the checkpoint's files.
pub(super) fn reshard(ckpt: &Checkpoint, target: Target) -> Result<Resharded, CheckpointError> {
    let manifest = ckpt.manifest();
    let mut old = HashMap::new();
    for n in needed_ranks(ckpt, target) {
        old.insert(
            n,
            OldRank {
                model: read_tree(ckpt, &model_file(n), Some(&ckpt.manifest().model_kinds))?,
                optim: read_tree(ckpt, &optim_file(n), None)?,
            },
        );
    }
    let mut indexes: HashMap<usize, Index> = HashMap::new();
    for (&n, rank) in &old {
        let ids = param_paths(&rank.model);
        let mut index = Index::new();
        collect(&rank.model, "model", &ids, &mut index);
        collect(&rank.optim, "optim", &ids, &mut index);
        indexes.insert(n, index);
    }
    let ids0 = param_paths(&old[&0].model);
    let mut model = old[&0].model.clone();
    let mut optim = old[&0].optim.clone();
    let mut job = Job {
        old_map: &manifest.shard_maps[0],
        old_world: manifest.world_size,
        indexes: &indexes,
        ids: &ids0,
        target,
        io: ShardIo::Saving {
            map: ShardMap::default(),
            conflicts: Vec::new(),
        },
    };
    job.rewrite(&mut model, "model", &ckpt.dir().join(model_file(0)))?;
    job.rewrite(&mut optim, "optim", &ckpt.dir().join(optim_file(0)))?;
    let map = job.io.finish(target.rank)?;
    Ok(Resharded {
        model: write_tree(&model),
        optim: write_tree(&optim),
        map,
    })
}

/// Whether old rank `n` holds columns that `target` needs.
fn overlaps(map: &ShardMap, old_world: usize, n: usize, target: Target) -> bool {
    map.sharded.iter().any(|(_, full)| {
        let full = Shape::from(full.clone());
        let old = ShardSpec {
            full: full.clone(),
            world: old_world,
        }
        .range(n);
        let (_, want) = wanted(&full, target);
        intersect(old, want).len > 0
    })
}

/// Whether `target` holds a tensor of full shape `full` as a shard, and which of its columns.
fn wanted(full: &Shape, target: Target) -> (bool, ShardRange) {
    match placement(target.strategy, full, target.world, target.threshold) {
        Some(spec) => (true, spec.range(target.rank)),
        None => (
            false,
            ShardRange {
                start: 0,
                len: full[full.num_dims() - 1],
            },
        ),
    }
}

fn intersect(a: ShardRange, b: ShardRange) -> ShardRange {
    let start = a.start.max(b.start);
    let end = (a.start + a.len).min(b.start + b.len);
    ShardRange {
        start,
        len: end.saturating_sub(start),
    }
}

/// Reads a record file as a tree, once every tensor's bytes are checked to fill its shape (so
/// the sizes computed below cannot overflow) and, for a model record, its tensors are of the
/// parameter kinds the manifest records (`kinds`; empty in checkpoints that predate them).
fn read_tree(ckpt: &Checkpoint, name: &str, kinds: Option<&str>) -> Result<Value, CheckpointError> {
    let bytes = ckpt.read(name)?;
    let bad = |reason: String| CheckpointError::Record {
        path: ckpt.dir().join(name),
        reason,
    };
    let dtypes = super::validate::tensor_dtypes(&bytes).map_err(bad)?;
    if let Some(kinds) = kinds.filter(|k| !k.is_empty()) {
        super::validate::check_kinds(&dtypes, kinds).map_err(bad)?;
    }
    rmpv::decode::read_value(&mut bytes.as_slice())
        .map_err(|e| bad(format!("not a MessagePack record: {e}")))
}

fn write_tree(tree: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, tree).expect("writing to a Vec cannot fail");
    out
}

/// The map key of a path segment.
fn key_text(key: &Value) -> String {
    match key.as_str() {
        Some(s) => s.to_string(),
        None => key.to_string(),
    }
}

fn field<'a>(map: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

/// A tensor's shape and bytes, if `value` is a serialised tensor.
fn as_tensor(value: &Value) -> Option<(Vec<usize>, &[u8])> {
    let map = value.as_map()?;
    let bytes = match field(map, "bytes")? {
        Value::Binary(b) => b.as_slice(),
        _ => return None,
    };
    field(map, "dtype")?;
    let shape = field(map, "shape")?
        .as_array()?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<Vec<_>>>()?;
    Some((shape, bytes))
}

/// Each parameter id of a model record, with the path of its parameter.
fn param_paths(model: &Value) -> HashMap<String, String> {
    fn walk(value: &Value, path: &str, out: &mut HashMap<String, String>) {
        match value {
            Value::Map(map) => {
                if let (Some(Value::String(id)), Some(_)) = (field(map, "id"), field(map, "param"))
                {
                    if let Some(id) = id.as_str() {
                        out.insert(id.to_string(), path.to_string());
                    }
                }
                for (k, v) in map {
                    walk(v, &format!("{path}/{}", key_text(k)), out);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, &format!("{path}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = HashMap::new();
    walk(model, "model", &mut out);
    out
}

/// A path segment: a parameter id stands for its parameter's path, anything else for itself.
fn segment(key: &Value, ids: &HashMap<String, String>) -> String {
    let text = key_text(key);
    match ids.get(&text) {
        Some(param) => format!("[{param}]"),
        None => text,
    }
}

/// Indexes every tensor under `value` by its canonical path.
fn collect<'a>(value: &'a Value, path: &str, ids: &HashMap<String, String>, out: &mut Index<'a>) {
    if let Some((shape, bytes)) = as_tensor(value) {
        out.insert(path.to_string(), Piece { shape, bytes });
        return;
    }
    match value {
        Value::Map(map) => {
            for (k, v) in map {
                collect(v, &format!("{path}/{}", segment(k, ids)), ids, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                collect(v, &format!("{path}/{i}"), ids, out);
            }
        }
        _ => {}
    }
}

/// One target rank's rewrite of rank 0's trees.
struct Job<'a> {
    old_map: &'a ShardMap,
    old_world: usize,
    indexes: &'a HashMap<usize, Index<'a>>,
    ids: &'a HashMap<String, String>,
    target: Target,
    io: ShardIo,
}

impl Job<'_> {
    /// Replaces every tensor under `value` (at canonical `path`) by the target's columns.
    fn rewrite(
        &mut self,
        value: &mut Value,
        path: &str,
        file: &std::path::Path,
    ) -> Result<(), CheckpointError> {
        if let Some((shape, _)) = as_tensor(value) {
            let (new_shape, bytes) = self.assemble(path, shape, file)?;
            let map = match value {
                Value::Map(map) => map,
                _ => unreachable!("a tensor is a map"),
            };
            for (k, v) in map.iter_mut() {
                match k.as_str() {
                    Some("bytes") => *v = Value::Binary(bytes.clone()),
                    Some("shape") => {
                        *v =
                            Value::Array(new_shape.iter().map(|&d| Value::from(d as u64)).collect())
                    }
                    _ => {}
                }
            }
            return Ok(());
        }
        match value {
            Value::Map(map) => {
                for (k, v) in map.iter_mut() {
                    let sub = format!("{path}/{}", segment(k, self.ids));
                    self.rewrite(v, &sub, file)?;
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter_mut().enumerate() {
                    self.rewrite(v, &format!("{path}/{i}"), file)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The target's shape and bytes of the tensor at `path` (rank 0's shape `shape0`).
    fn assemble(
        &mut self,
        path: &str,
        shape0: Vec<usize>,
        file: &std::path::Path,
    ) -> Result<(Vec<usize>, Vec<u8>), CheckpointError> {
        let missing = |n: usize, why: String| CheckpointError::Record {
            path: file.to_path_buf(),
            reason: format!("old rank {n}'s tensor at `{path}` {why}"),
        };
        let piece = |n: usize| -> Result<&Piece, CheckpointError> {
            self.indexes[&n]
                .get(path)
                .ok_or_else(|| missing(n, "is missing".into()))
        };
        let sharded = self.old_map.full_of(&shape0).cloned();
        let replicated = self.old_map.replicated.contains(&shape0);
        if shape0.is_empty() || (sharded.is_none() && !replicated) {
            // Not a parameter's tensor (nothing placed it): every rank's copy is rank 0's.
            return Ok((shape0, piece(0)?.bytes.to_vec()));
        }
        let full = sharded.clone().unwrap_or_else(|| shape0.clone());
        let full_shape = Shape::from(full.clone());
        let (shard, want) = wanted(&full_shape, self.target);
        let last = full.len() - 1;
        let rows: usize = full[..last].iter().product();
        let mut out_shape = full.clone();
        out_shape[last] = want.len;
        // Old ranks and the columns each holds: every rank the whole, or its shard.
        let sources: Vec<(usize, ShardRange)> = match &sharded {
            None => vec![(
                0,
                ShardRange {
                    start: 0,
                    len: full[last],
                },
            )],
            Some(_) => {
                let spec = ShardSpec {
                    full: full_shape.clone(),
                    world: self.old_world,
                };
                (0..self.old_world).map(|n| (n, spec.range(n))).collect()
            }
        };
        // Bytes per element, from rank 0's copy (any element type; 0 elements: nothing to copy).
        let elem = piece(0)?
            .bytes
            .len()
            .checked_div(shape0.iter().product::<usize>())
            .unwrap_or(0);
        let mut out = vec![0u8; rows * want.len * elem];
        for (n, held) in sources {
            let cols = intersect(held, want);
            if cols.len == 0 {
                continue;
            }
            let p = piece(n)?;
            let mut expected = full.clone();
            expected[last] = held.len;
            if p.shape != expected || p.bytes.len() != rows * held.len * elem {
                return Err(missing(
                    n,
                    format!("has shape {:?}, expected {expected:?}", p.shape),
                ));
            }
            copy_columns((p.bytes, held), (&mut out, want), cols, rows, elem);
        }
        if shard {
            self.io.note_shard(out_shape.clone(), full);
        } else {
            self.io.note_replicated(full);
        }
        Ok((out_shape, out))
    }
}

/// The old ranks whose files `target` reads: rank 0 (ids, replicated tensors) and every rank
/// holding columns the target needs.
pub(super) fn needed_ranks(ckpt: &Checkpoint, target: Target) -> BTreeSet<usize> {
    let m = ckpt.manifest();
    (0..m.world_size)
        .filter(|&n| n == 0 || overlaps(&m.shard_maps[n], m.world_size, n, target))
        .collect()
}
