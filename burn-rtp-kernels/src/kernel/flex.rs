//! Flex (Burn 0.21's pure-Rust CPU backend) runs the generic compositions: its matmul already
//! reads strided views through the gemm crate, and its slices are zero-copy views.

/// Flex's steps are the compositions of its own ops (see the module docs).
impl crate::RotationKernels for burn::backend::Flex {}
