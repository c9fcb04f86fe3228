//! The equivalence of `burn-rtp/tests/wgpu.rs` on `Autodiff<Rtp<Cuda>>`: RTP with the fused
//! kernels on CUDA equals single-device `Autodiff<NdArray>` to 1e-4 at N = 2 and 3 (every
//! rank on GPU 0). Run with `--features cuda` on a machine with a GPU (`benches/gpu.sh`).
#![cfg(feature = "cuda")]

mod common;

use burn::backend::Cuda;

#[test]
fn n2_matches_single_device_ndarray() {
    common::fused_matches_single_device::<Cuda>(2);
}

#[test]
fn n3_matches_single_device_ndarray() {
    common::fused_matches_single_device::<Cuda>(3);
}
