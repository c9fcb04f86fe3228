//! The GELU loops compiled for AVX2 where the CPU has it (chosen at run time), else for the
//! target's baseline. [`super::math`] uses no fused multiply-add, so both compute the same
//! bits: a rank's result does not depend on which CPU it ran on.

use super::math;

/// GELU over `xs`, in place.
pub(crate) fn gelu(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, as checked on the line above.
        unsafe { avx2::gelu(xs) };
        return;
    }
    math::gelu_slice(xs)
}

/// `grads[i] = gelu'(xs[i]) · grads[i]` (Burn's derivative). Panics if the lengths differ.
pub(crate) fn gelu_backward(xs: &[f32], grads: &mut [f32]) {
    assert_eq!(
        xs.len(),
        grads.len(),
        "gelu_backward: operands of two lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, as checked on the line above.
        unsafe { avx2::gelu_backward(xs, grads) };
        return;
    }
    math::gelu_backward_slice(xs, grads)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::math;

    #[target_feature(enable = "avx2")]
    pub(super) fn gelu(xs: &mut [f32]) {
        math::gelu_slice(xs)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn gelu_backward(xs: &[f32], grads: &mut [f32]) {
        math::gelu_backward_slice(xs, grads)
    }
}
