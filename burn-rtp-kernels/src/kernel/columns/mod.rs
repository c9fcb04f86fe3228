//! Column slices of the output: where a shard's partial result goes.

use burn::tensor::backend::Backend;
use burn::tensor::{Slice, TensorMetadata};

type Float<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

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

/// Concatenates per-shard column blocks, given in shard order, along `dim`.
pub fn assemble_columns<B: Backend>(parts: Vec<Float<B>>, dim: usize) -> Float<B> {
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    B::float_cat(parts, dim)
}
