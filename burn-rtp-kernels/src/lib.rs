//! The per-step compute of a rotation: one GEMM (or lookup) against the shard on hand,
//! reading and writing column windows where they lie, with no temporary block and no
//! concatenation.
//!
//! Each kernel lives in its own folder under [`kernel`], with its `#[cube]` code and launch
//! beside the generic composition of Burn ops that other backends run; the Linear's folder
//! also holds NdArray's native steps (its GEMM on strided views). Which one a backend runs is
//! [`RotationKernels`], in [`dispatch`]; its steps take a [`Checked`] that only the checked
//! entry points make, so safe code cannot launch a kernel on operands nobody checked.
//!
//! The same trait carries the steps burn-rtp's decorator takes over where the inner backend
//! is slow: GELU and its derivative in one pass (`kernel/gelu`), batched matmul on strided
//! views (`kernel/matmul`), one Adam step per shard in one pass (`kernel/adam`, with
//! [`AdamStep`]) and fills (`kernel/fill`). Each defaults to Burn's own op; NdArray has the
//! kernels, and each states its bound against Burn's op (equal bits, except GELU's few ulps).
//!
//! This crate is burn-rtp's compute layer; most users reach it only through `burn-rtp`.
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | (none) | the generic compositions of Burn ops, and NdArray's native steps |
//! | `cube` | the fused `#[cube]` kernels for any cubecl runtime (`CubeBackend`) |
//! | `wgpu` | `cube` on wgpu (tested on Mesa's lavapipe) |
//! | `cuda` | `cube` on CUDA; it compiles, and has not yet run on a GPU |
//! | `fusion` | `Fusion<..>` over a cube backend, which runs the generic compositions |
//!
//! # Process-wide effects
//!
//! * [`set_fused_kernels`] switches every caller in the process between the fused kernels and
//!   the compositions they replace; [`fused_launches`] counts the process's fused launches.
//! * `set_gemm_tiling` (feature `cube`) forces one register tiling for every fused GEMM
//!   launched afterwards in the process.
#![warn(missing_docs)]

mod adam_step;
pub mod columns;
pub mod dispatch;
pub mod generic;
pub mod kernel;
mod packing;
pub mod switches;

/// The inner backend's float tensor, which every kernel takes and returns.
pub type Float<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;
/// The inner backend's int tensor (embedding indices).
pub type Int<B> = <B as burn::tensor::backend::BackendTypes>::IntTensorPrimitive;

pub use adam_step::AdamStep;
pub use columns::{
    assemble_columns, column_slice, output_for_columns, write_columns, ColumnError, Window,
};
pub use dispatch::{Checked, KernelPath, RotationKernels};
pub use kernel::embedding::{accumulate_embedding_grad, embedding_grad_step, embedding_step};
#[cfg(feature = "cube")]
pub use kernel::linear::launch::{set_gemm_tiling, GemmTiling};
pub use kernel::linear::{
    forward_step, forward_whole, pack_x, weight_grad_step, weight_grad_summed, weight_grad_whole,
    x_grad_step, x_grad_whole,
};
pub use packing::{PackedX, XUse};
pub use switches::{
    fused_kernels_enabled, fused_launches, fused_launches_on_this_thread, set_fused_kernels,
};
