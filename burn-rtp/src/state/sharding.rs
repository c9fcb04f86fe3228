//! Where each element of a parameter lives: the split of the last dimension across ranks,
//! which parameters can be split, host-side slicing for loading, and flyweight random init.

use crate::state::accounting::Category;
use burn::tensor::{DType, Distribution, Shape, TensorData};

/// Elements `[start, start + len)` of a dimension of size `full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardRange {
    /// First index.
    pub start: usize,
    /// Number of indices.
    pub len: usize,
}

/// The balanced split of `full` into `world` ranges; the first `full % world` get one more.
pub fn shard_range(full: usize, world: usize, rank: usize) -> ShardRange {
    let base = full / world;
    let rem = full % world;
    ShardRange {
        start: rank * base + rank.min(rem),
        len: base + usize::from(rank < rem),
    }
}

/// How a sharded tensor is split: along its last dimension, one range per rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    /// The logical (full) shape.
    pub full: Shape,
    /// Number of ranks the last dimension is split over.
    pub world: usize,
}

impl ShardSpec {
    /// Size of the sharded (last) dimension.
    pub fn last(&self) -> usize {
        self.full[self.full.num_dims() - 1]
    }

    /// The range rank `rank` holds.
    pub fn range(&self, rank: usize) -> ShardRange {
        shard_range(self.last(), self.world, rank)
    }

    /// Shape of rank `rank`'s shard.
    pub fn shard_shape(&self, rank: usize) -> Shape {
        let mut dims = self.full.to_vec();
        let n = dims.len();
        dims[n - 1] = self.range(rank).len;
        Shape::from(dims)
    }

    /// The same split applied to another logical shape with the same last dimension.
    pub fn with_full(&self, full: Shape) -> Self {
        Self {
            full,
            world: self.world,
        }
    }
}

/// Whether a parameter of `shape` is sharded over `world` ranks under `threshold`.
pub fn is_sharded_param(shape: &Shape, world: usize, threshold: usize) -> bool {
    let dims = shape.as_slice();
    !dims.is_empty() && shape.num_elements() >= threshold.max(1) && dims[dims.len() - 1] >= world
}

/// Keeps only the columns `range` of the last dimension of `data`, on the host.
pub fn slice_last_dim(data: &TensorData, range: ShardRange) -> TensorData {
    let dims = &data.shape;
    let last = dims[dims.len() - 1];
    let elem = data.dtype.size();
    let rows = data.num_elements().checked_div(last).unwrap_or(0);
    let mut out = vec![0; rows * range.len * elem];
    let whole = ShardRange {
        start: 0,
        len: last,
    };
    copy_columns(
        (data.as_bytes(), whole),
        (&mut out, range),
        range,
        rows,
        elem,
    );
    let mut shape = dims.clone();
    let n = shape.len();
    shape[n - 1] = range.len;
    TensorData::from_bytes_vec(out, shape, data.dtype)
}

/// Copies columns `cols` of row-major rows of `elem`-byte elements from a buffer holding
/// columns `src.1` of each row into one holding columns `dst.1` of the same rows; columns are
/// numbered in the full tensor, and `cols` lies within both.
pub(crate) fn copy_columns(
    src: (&[u8], ShardRange),
    dst: (&mut [u8], ShardRange),
    cols: ShardRange,
    rows: usize,
    elem: usize,
) {
    let ((from, held), (to, want)) = (src, dst);
    let width = cols.len * elem;
    for row in 0..rows {
        let a = (row * held.len + cols.start - held.start) * elem;
        let b = (row * want.len + cols.start - want.start) * elem;
        to[b..b + width].copy_from_slice(&from[a..a + width]);
    }
}

/// Counter-based hash (SplitMix64 finaliser): the same input gives the same bits on any rank.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unit(seed: u64, stream: u64, index: u64) -> f64 {
    let bits = mix(seed ^ mix(stream ^ mix(index)));
    // 53 random bits in (0, 1): never exactly 0, so logarithms stay finite.
    ((bits >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// Draws the elements of the shard `range` of a tensor of logical shape `full`.
///
/// Element values depend only on `(seed, stream, global index)`, so a model initialised on
/// N ranks is the same model for every N, and no rank ever draws another rank's elements.
pub fn flyweight_random(
    full: &Shape,
    range: ShardRange,
    distribution: Distribution,
    seed: u64,
    stream: u64,
    dtype: DType,
) -> TensorData {
    let last = full[full.num_dims() - 1];
    let rows = full.num_elements().checked_div(last).unwrap_or(0);
    let mut values = Vec::with_capacity(rows * range.len);
    for row in 0..rows {
        for col in range.start..range.start + range.len {
            let g = (row * last + col) as u64;
            let v = match distribution {
                Distribution::Default => unit(seed, stream, g),
                Distribution::Uniform(lo, hi) => lo + (hi - lo) * unit(seed, stream, g),
                Distribution::Bernoulli(p) => f64::from(u8::from(unit(seed, stream, g) < p)),
                Distribution::Normal(mean, std) => {
                    let u1 = unit(seed, stream, 2 * g);
                    let u2 = unit(seed, stream, 2 * g + 1);
                    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                    mean + std * z
                }
            };
            values.push(v as f32);
        }
    }
    let mut dims = full.to_vec();
    let n = dims.len();
    dims[n - 1] = range.len;
    TensorData::new(values, dims).convert_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_uneven_dimensions_exactly_once() {
        for full in [1usize, 7, 36, 67, 100] {
            for world in 1..=8 {
                let mut next = 0;
                for rank in 0..world {
                    let r = shard_range(full, world, rank);
                    assert_eq!(r.start, next, "full {full} world {world} rank {rank}");
                    next += r.len;
                }
                assert_eq!(next, full);
            }
        }
    }

    #[test]
    fn host_slicing_keeps_the_right_columns() {
        let data = TensorData::new((0..12).map(|v| v as f32).collect(), [3, 4]);
        let part = slice_last_dim(&data, ShardRange { start: 1, len: 2 });
        assert_eq!(part.shape.to_vec(), vec![3, 2]);
        assert_eq!(
            part.to_vec::<f32>().unwrap(),
            vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]
        );
    }

    #[test]
    fn flyweight_shards_concatenate_to_the_single_rank_draw() {
        let full = Shape::from(vec![5, 11]);
        let dist = Distribution::Normal(0.0, 1.0);
        let whole = flyweight_random(&full, shard_range(11, 1, 0), dist, 7, 3, DType::F32)
            .to_vec::<f32>()
            .unwrap();
        let world = 3;
        let parts: Vec<Vec<f32>> = (0..world)
            .map(|r| {
                flyweight_random(&full, shard_range(11, world, r), dist, 7, 3, DType::F32)
                    .to_vec::<f32>()
                    .unwrap()
            })
            .collect();
        for row in 0..5 {
            let mut rebuilt = Vec::new();
            for (r, part) in parts.iter().enumerate() {
                let len = shard_range(11, world, r).len;
                rebuilt.extend_from_slice(&part[row * len..(row + 1) * len]);
            }
            assert_eq!(rebuilt, whole[row * 11..(row + 1) * 11].to_vec());
        }
        let mean = whole.iter().sum::<f32>() / whole.len() as f32;
        assert!(mean.abs() < 0.5, "normal draw mean {mean}");
    }
}

/// Where the elements of a float tensor live.
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// This rank's own values (activations, data, temporaries).
    Local,
    /// A small parameter (or its state) held whole and identical on every rank.
    Replicated,
    /// One column range of a tensor whose full value is the same on every rank.
    Sharded(ShardSpec),
}

impl Layout {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Layout::Local => "local",
            Layout::Replicated => "replicated",
            Layout::Sharded(_) => "sharded",
        }
    }

    /// What a tensor of this layout is charged as.
    pub(crate) fn category(&self) -> Category {
        match self {
            Layout::Local => Category::Local,
            Layout::Replicated | Layout::Sharded(_) => Category::Sharded,
        }
    }
}
