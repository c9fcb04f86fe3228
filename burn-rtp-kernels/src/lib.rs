//! The per-step compute of a rotation: one GEMM against the shard on hand, fused with the
//! column bookkeeping around it.
//!
//! Each kernel lives in its own folder under [`kernel`]. The functions here are the generic
//! compositions of the inner backend's ops that every backend can run (NdArray included);
//! fused `#[cube]` versions for cube backends belong beside them (not written yet).
#![warn(missing_docs)]

pub mod kernel;

/// The inner backend's float tensor, which every kernel takes and returns.
pub type Float<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

pub use kernel::columns::{
    assemble_columns, column_slice, output_for_columns, write_columns, ColumnError,
};
pub use kernel::embedding::{accumulate_embedding_grad, embedding_columns};
pub use kernel::linear::{
    accumulate_bias_grad, accumulate_weight_grad, accumulate_x_grad, linear_columns,
};
