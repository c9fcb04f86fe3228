//! GELU forward and backward in one pass over the elements, for backends whose own GELU is a
//! chain of whole-tensor ops.
//!
//! Burn 0.21's default `gelu` is four element-wise passes around an `erf`, and its default
//! `gelu_backward` about fifteen passes around `powf` and `tanh`, each pass a new tensor.
//! burn-ndarray overrides neither, and computes `erf` and `tanh` in f64 through libm: on
//! config A the profile put 108 ms per step into that transcendental math, against PyTorch's
//! 2 ms. NdArray's steps here ([`ndarray`]) run [`math`]'s branch-free f32 functions once
//! per element, over slices that compile to AVX2 where the CPU has it ([`simd`]), in place
//! where the tensor's buffer is not shared.
//!
//! Which GELU: the one the inner backend computes on its own, so that `Rtp<B>` trains as
//! single-device `B` does. On NdArray that is Burn's default pair: the exact GELU forward
//! (`x Φ(x)`, with `erf`) and, as its derivative, the derivative of GELU's *tanh
//! approximation* with Burn's rounded constants. The two disagree by up to about 1e-3 near
//! |x| = 2; changing the derivative would move training away from single-device Burn, so the
//! decorator does not. Flex's own `gelu` and `gelu_backward` are already single passes (its
//! derivative is the exact one), so Flex keeps them.
//!
//! Bound against Burn's composition on NdArray, f32, measured by the tests below over a dense
//! grid of [-12, 12], random values and the extremes: the forward differs by at most 2 f32
//! epsilons of `max(|y|, |x|/2)` (5.4% of elements differ at all), the derivative by at most
//! 5 epsilons of `max(|y'|, 1)` (2.2% differ). The SIMD and scalar loops give the same bits.

pub(crate) mod math;
pub(crate) mod ndarray;
mod simd;

#[cfg(test)]
mod tests {
    use super::math;
    use burn::backend::ndarray::NdArrayTensor;
    use burn::backend::NdArray;
    use burn::tensor::ops::{ActivationOps, FloatTensorOps};
    use burn::tensor::TensorData;

    type N = NdArray<f32>;

    /// Burn's own ops on NdArray, for `xs`: (gelu, derivative).
    fn burn_reference(xs: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let device = burn::backend::ndarray::NdArrayDevice::Cpu;
        let t = |v: &[f32]| -> NdArrayTensor {
            N::float_from_data(TensorData::new(v.to_vec(), [v.len()]), &device)
        };
        let read = |t: NdArrayTensor| {
            burn::tensor::try_read_sync(N::float_into_data(t))
                .expect("NdArray reads synchronously")
                .expect("a readable tensor")
                .to_vec::<f32>()
                .unwrap()
        };
        let ones = vec![1f32; xs.len()];
        let fwd = read(<N as ActivationOps<N>>::gelu(t(xs)));
        let bwd = read(<N as ActivationOps<N>>::gelu_backward(t(xs), t(&ones)));
        (fwd, bwd)
    }

    fn grid() -> Vec<f32> {
        let mut xs: Vec<f32> = (-240_000..=240_000).map(|i| i as f32 * 5e-5).collect();
        // Values with all mantissa bits in use, and the extremes.
        let mut state = 0x2545_f491_u32;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            xs.push((state as f32 / u32::MAX as f32 - 0.5) * 16.0);
        }
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 1e4, -1e4]);
        xs
    }

    /// The largest error over the grid, in f32 epsilons of `scale`, and how many differ.
    fn worst(
        got: impl Fn(f32) -> f32,
        want: &[f32],
        scale: impl Fn(f32, f32) -> f32,
    ) -> (f32, usize) {
        let xs = grid();
        let mut worst = 0f32;
        let mut differ = 0;
        for (&x, &w) in xs.iter().zip(want) {
            let g = got(x);
            worst = worst.max((g - w).abs() / (f32::EPSILON * scale(x, w)));
            differ += usize::from(g.to_bits() != w.to_bits());
        }
        (worst, differ)
    }

    #[test]
    fn the_forward_is_burns_within_two_epsilons_of_its_scale() {
        let xs = grid();
        let (want, _) = burn_reference(&xs);
        // The scale: the output, or the input's half where the output is smaller (the tails,
        // where `x · (1 + erf)` cancels; Burn rounds `erf` to f32 there too).
        let (worst, differ) = worst(math::gelu, &want, |x, w| {
            (x.abs() / 2.0).max(w.abs()).max(f32::MIN_POSITIVE)
        });
        assert!(worst <= 2.0, "{worst} epsilons");
        // Measured: 5.4% of the grid's elements differ at all.
        assert!(
            differ * 100 < xs.len() * 6,
            "{differ} of {} differ",
            xs.len()
        );
    }

    #[test]
    fn the_derivative_is_burns_within_five_epsilons_of_one() {
        let xs = grid();
        let (_, want) = burn_reference(&xs);
        let (worst, differ) = worst(math::gelu_derivative, &want, |_, w| w.abs().max(1.0));
        assert!(worst <= 5.0, "{worst} epsilons");
        // Measured: 2.2% differ.
        assert!(
            differ * 100 < xs.len() * 3,
            "{differ} of {} differ",
            xs.len()
        );
    }

    #[test]
    fn the_simd_loops_compute_the_scalar_bits() {
        let xs = grid();
        let mut fwd = xs.clone();
        super::simd::gelu(&mut fwd);
        let mut bwd: Vec<f32> = (0..xs.len()).map(|i| 1.0 + i as f32 * 1e-6).collect();
        let grads = bwd.clone();
        super::simd::gelu_backward(&xs, &mut bwd);
        for (i, &x) in xs.iter().enumerate() {
            assert_eq!(fwd[i].to_bits(), math::gelu(x).to_bits(), "gelu({x:e})");
            let want = math::gelu_derivative(x) * grads[i];
            assert_eq!(bwd[i].to_bits(), want.to_bits(), "gelu'({x:e})");
        }
    }
}
