//! The compositions of Burn ops that every backend can run, one module per kernel: what
//! [`RotationKernels`]' default methods call, and what the other paths fall back to.
//!
//! [`RotationKernels`]: crate::RotationKernels

pub mod embedding;
pub mod linear;
