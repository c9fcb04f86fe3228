//! RTP training on `Autodiff<Rtp<Wgpu>>` (the fused `#[cube]` kernels, on Mesa's lavapipe in
//! CI) equals single-device `Autodiff<NdArray>` training step by step, to 1e-4, at N = 2
//! and 3, for the MLP and the language model of the equivalence suite (d_model 36, d_ff 100,
//! vocab 67: dimensions that N does not divide). Each case also asserts that fused kernels
//! ran. Run with `--features wgpu`.
#![cfg(feature = "wgpu")]

mod common;

use burn::backend::wgpu::Wgpu;

#[test]
fn n2_matches_single_device_ndarray() {
    common::fused_matches_single_device::<Wgpu>(2);
}

#[test]
fn n3_matches_single_device_ndarray() {
    common::fused_matches_single_device::<Wgpu>(3);
}

/// Ranks on two wgpu devices that share no handles (each device is its own cubecl client):
/// every received shard must be moved to the receiving rank's device, or the receiver would
/// compute with a handle its client does not own.
#[test]
fn n2_on_two_devices_matches_single_device_ndarray() {
    use burn::backend::wgpu::WgpuDevice;
    let device = |rank: usize| {
        if rank == 0 {
            WgpuDevice::DefaultDevice
        } else {
            WgpuDevice::Cpu
        }
    };
    assert_ne!(device(0), device(1), "the test needs two distinct devices");
    common::fused_matches_single_device_on::<Wgpu>(2, device);
}
