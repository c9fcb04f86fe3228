//! Column windows of an output: where a shard's partial result goes.
//!
//! A rotated op's output is allocated once ([`output_for_columns`]) and each shard's block
//! is written into its window ([`write_columns`]), on backends that update a uniquely held
//! tensor in place (NdArray does), with no concatenation and no second copy of the output.

use crate::Float;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Shape, Slice, TensorMetadata};

/// A window or block that does not fit its output; refused before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ColumnError {
    /// The window `[start, start + len)` reaches past the output's last dimension.
    #[error(
        "column window {start}..{end} is outside an output of {columns} columns (shape {shape:?})"
    )]
    OutOfBounds {
        /// First column of the window.
        start: usize,
        /// One past its last column.
        end: usize,
        /// Columns of the output.
        columns: usize,
        /// Shape of the output.
        shape: Vec<usize>,
    },
    /// The block's leading dimensions differ from the output's.
    #[error("a block of shape {block:?} does not fit the rows of an output of shape {output:?}")]
    Rows {
        /// Shape of the block.
        block: Vec<usize>,
        /// Shape of the output.
        output: Vec<usize>,
    },
    /// The operands of a step do not fit together (inner dimensions, window width, rows).
    #[error("`{op}`: operands of shapes {shapes:?} do not fit together")]
    Mismatch {
        /// The step refused.
        op: &'static str,
        /// The operands' shapes, in argument order.
        shapes: Vec<Vec<usize>>,
    },
}

/// Columns `[start, start + len)` of a tensor's last dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First column.
    pub start: usize,
    /// Number of columns.
    pub len: usize,
}

impl Window {
    /// Columns `[start, start + len)`.
    pub fn new(start: usize, len: usize) -> Self {
        Window { start, len }
    }

    /// All `len` columns.
    pub fn all(len: usize) -> Self {
        Window { start: 0, len }
    }

    /// Refuses a window that reaches past the last dimension of a tensor of shape `shape`.
    pub fn check(self, shape: &[usize]) -> Result<Self, ColumnError> {
        let columns = shape.last().copied().unwrap_or(0);
        if shape.is_empty() || self.start + self.len > columns {
            return Err(ColumnError::OutOfBounds {
                start: self.start,
                end: self.start + self.len,
                columns,
                shape: shape.to_vec(),
            });
        }
        Ok(self)
    }
}

/// Columns `[start, start + len)` of the last dimension of `t`.
pub fn column_slice<B: Backend>(t: Float<B>, start: usize, len: usize) -> Float<B> {
    let dims = t.shape().to_vec();
    if start == 0 && len == dims[dims.len() - 1] {
        return t;
    }
    let mut slices = vec![Slice::full(); dims.len()];
    slices[dims.len() - 1] = Slice::new(start as isize, Some((start + len) as isize), 1);
    B::float_slice(t, &slices)
}

/// An uninitialised output shaped like `block` but with `columns` columns, on its device and
/// of its element type: every window is written before it is read.
pub fn output_for_columns<B: Backend>(block: &Float<B>, columns: usize) -> Float<B> {
    B::float_empty(
        output_shape::<B>(block, columns),
        &B::float_device(block),
        dtype_of::<B>(block),
    )
}

/// The shape of `block` with `columns` columns.
pub(crate) fn output_shape<B: Backend>(block: &Float<B>, columns: usize) -> Shape {
    let mut dims = block.shape().to_vec();
    let last = dims.len() - 1;
    dims[last] = columns;
    Shape::from(dims)
}

/// The float dtype of `block`.
pub(crate) fn dtype_of<B: Backend>(block: &Float<B>) -> FloatDType {
    FloatDType::from(block.dtype())
}

/// Writes `block` into the columns `[start, start + block columns)` of `out` and returns
/// `out`. Shapes are checked first: a window outside `out`, or rows that differ, are an
/// error and nothing is written.
pub fn write_columns<B: Backend>(
    out: Float<B>,
    block: Float<B>,
    start: usize,
) -> Result<Float<B>, ColumnError> {
    let (o, b) = (out.shape().to_vec(), block.shape().to_vec());
    if o.len() != b.len() || o.is_empty() || o[..o.len() - 1] != b[..b.len() - 1] {
        return Err(ColumnError::Rows {
            block: b,
            output: o,
        });
    }
    let (columns, len) = (o[o.len() - 1], b[b.len() - 1]);
    Window::new(start, len).check(&o)?;
    if start == 0 && len == columns {
        return Ok(block);
    }
    let mut slices = vec![Slice::full(); o.len()];
    slices[o.len() - 1] = Slice::new(start as isize, Some((start + len) as isize), 1);
    Ok(B::float_slice_assign(out, &slices, block))
}

/// Concatenates per-shard column blocks, given in shard order, along `dim`. The all-gather
/// and the bucket all-reduce join their shards with it, once every block is in hand; a
/// rotation, whose blocks arrive one by one, writes them with [`write_columns`] instead.
pub fn assemble_columns<B: Backend>(parts: Vec<Float<B>>, dim: usize) -> Float<B> {
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    B::float_cat(parts, dim)
}
