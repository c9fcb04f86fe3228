//! RTP training on `Autodiff<Rtp<Wgpu>>` (the fused `#[cube]` kernels, on Mesa's lavapipe in
//! CI) equals single-device `Autodiff<NdArray>` training step by step, to 1e-4, at N = 2
//! and 3 on dimensions that N does not divide (d_model 36, d_ff 100, vocab 67).
//!
//! Each case also asserts that the fused kernels ran, so a dispatch that fell back to the
//! generic compositions fails here. Run with `--features wgpu`.
#![cfg(feature = "wgpu")]

mod common;

use burn::backend::wgpu::Wgpu;
use burn_rtp::{KernelPath, RotationKernels, RtpConfig};
use common::*;

fn config(n: usize) -> RtpConfig {
    RtpConfig::new(n).with_shard_threshold(0)
}

/// Runs `run`, and checks that fused kernels launched while it ran.
fn fused<T>(what: &str, run: impl FnOnce() -> T) -> T {
    assert_eq!(<Wgpu as RotationKernels>::kernel_path(), KernelPath::Fused);
    let before = burn_rtp_kernels::fused_launches();
    let out = run();
    let launched = burn_rtp_kernels::fused_launches() - before;
    assert!(launched > 0, "{what}: no fused kernel ran");
    out
}

fn mlp(n: usize) {
    let weights = mlp_weights(SEED);
    let (ref_losses, ref_params) = reference_mlp(&weights);
    let label = format!("wgpu MLP N={n}");
    let runs = fused(&label, || rtp_mlp_on::<Wgpu>(config(n), &weights)).expect("RTP run");
    if let Err(e) = compare(Which::Mlp, &ref_losses, &ref_params, &runs, &label) {
        panic!("{e}");
    }
}

fn lm(n: usize) {
    let weights = lm_weights(SEED);
    let (ref_losses, ref_params) = reference_lm(&weights);
    let label = format!("wgpu LM N={n}");
    let runs = fused(&label, || rtp_lm_on::<Wgpu>(config(n), &weights)).expect("RTP run");
    if let Err(e) = compare(Which::Lm, &ref_losses, &ref_params, &runs, &label) {
        panic!("{e}");
    }
}

#[test]
fn mlp_n2_matches_single_device_ndarray() {
    mlp(2);
}

#[test]
fn mlp_n3_matches_single_device_ndarray() {
    mlp(3);
}

#[test]
fn lm_n2_matches_single_device_ndarray() {
    lm(2);
}

#[test]
fn lm_n3_matches_single_device_ndarray() {
    lm(3);
}
