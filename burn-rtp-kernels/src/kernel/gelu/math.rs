//! GELU and Burn's GELU derivative for f32 elements, branch-free so that a loop over a slice
//! compiles to SIMD, without libm's `erf`, `tanh` and `powf`.
//!
//! Each function evaluates the expression Burn's composition evaluates, operation by
//! operation in f32, and replaces the transcendental inside it (`erf`, `tanh`; `exp` beneath
//! both) by polynomials in f32. They were fitted to the functions (least squares on Chebyshev
//! nodes, against mpmath at 30 digits) with a relative error below 2e-9, so what remains is
//! f32 rounding: a few ulps. `x³` is `x · x · x` where Burn calls `powf`. There is no fused
//! multiply-add, so every CPU computes the same bits, with SIMD or without (ranks on
//! different hosts must agree). The module tests state the bound against Burn's ops.

/// `erf(t) / t` on `[0, 1]`, as a polynomial in `t²` (lowest degree first); relative error
/// 1.6e-9.
const ERF_SMALL: [f32; 7] = [
    // The fit's constant term is 2/√π to f32 precision.
    std::f32::consts::FRAC_2_SQRT_PI,
    -0.376_126_3,
    0.112_836_26,
    -0.026_855_4,
    0.005_191_218_4,
    -0.000_803_484_66,
    7.933_494e-5,
];

/// `exp(t²) · erfc(t)` on `[1, 4]`, as a polynomial in `(t - 2.5) / 1.5` (lowest degree
/// first); relative error 7.6e-9.
const ERFC_SCALED: [f32; 13] = [
    0.210_806_36,
    -0.111_521,
    0.056_110_47,
    -0.027_005_725,
    0.012_489_704,
    -0.005_567_333,
    0.002_401_701_7,
    -0.001_017_117_8,
    0.000_414_508_1,
    -0.000_143_948_6,
    5.494_725e-5,
    -3.692_872_4e-5,
    1.381_908_9e-5,
];

/// `tanh(u) / u` on `[0, 0.55]`, as a polynomial in `u²` (lowest degree first); relative
/// error 1.1e-9.
const TANH_SMALL: [f32; 6] = [
    1.0,
    -0.333_333_16,
    0.133_325_75,
    -0.053_852_238,
    0.021_073_244,
    -0.006_277_784,
];

/// Horner's rule, coefficients lowest degree first.
#[inline(always)]
fn poly<const N: usize>(c: &[f32; N], x: f32) -> f32 {
    c.iter().rev().fold(0.0, |acc, &k| acc * x + k)
}

/// `exp(x)` for `x` in `[-87, 0]` (all this module needs): Cody and Waite's reduction by
/// `ln 2`, then Taylor's series to degree 7 (under 1e-8 on `|r| <= ln 2 / 2`).
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.max(-87.0);
    // Ties to even: one rounding rule, whichever instructions compute it.
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = poly(
        &[
            1.0,
            1.0,
            0.5,
            1.0 / 6.0,
            1.0 / 24.0,
            1.0 / 120.0,
            1.0 / 720.0,
            1.0 / 5040.0,
        ],
        r,
    );
    // 2^n, with n in [-126, 0]: a normal float's exponent field.
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

/// `erf(t)`.
#[inline(always)]
pub(crate) fn erf(t: f32) -> f32 {
    let a = t.abs();
    let small = t * poly(&ERF_SMALL, t * t);
    // Past 4, erf rounds to ±1 (erfc(4) = 1.5e-8, under half an ulp of 1): clamping there
    // keeps the polynomial in its range and gives that 1.
    let c = a.clamp(1.0, 4.0);
    let large = (1.0 - exp_neg(-c * c) * poly(&ERFC_SCALED, (c - 2.5) / 1.5)).copysign(t);
    if a <= 1.0 {
        small
    } else {
        large
    }
}

/// `tanh(u)`.
#[inline(always)]
pub(crate) fn tanh(u: f32) -> f32 {
    let a = u.abs();
    let small = u * poly(&TANH_SMALL, u * u);
    // tanh(a) = 1 - 2e / (1 + e) with e = exp(-2a): one rounding at the end, so values
    // near ±1 round as the f64 tanh Burn rounds does. Past 9.02, tanh rounds to ±1.
    let e = exp_neg(-2.0 * a.min(10.0));
    let large = (1.0 - 2.0 * e / (1.0 + e)).copysign(u);
    if a <= 0.55 {
        small
    } else {
        large
    }
}

/// GELU as Burn composes it: `x · (1 + erf(x / √2)) / 2`.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    let scaled = x / std::f64::consts::SQRT_2 as f32;
    (x * (erf(scaled) + 1.0)) / 2.0
}

/// Burn's default GELU derivative (`ActivationOps::gelu_backward`): the derivative of
/// GELU's tanh approximation, with Burn's rounded constants.
#[inline(always)]
pub(crate) fn gelu_derivative(x: f32) -> f32 {
    // Burn writes these as f64 literals and converts each to the element type.
    const C1: f32 = 0.035_677_4_f64 as f32;
    const C2: f32 = 0.797_885_f64 as f32;
    const C3: f32 = 0.053_516_1_f64 as f32;
    const C4: f32 = 0.398_942_f64 as f32;
    let x3 = x * x * x;
    let inner1 = x3 * C1 + x * C2;
    let inner2 = x3 * C3 + x * C4;
    let t = tanh(inner1);
    let sech = -(t * t) + 1.0;
    t * 0.5 + (inner2 * sech + 0.5)
}

/// `gelu` over a slice, in place.
#[inline(always)]
pub(crate) fn gelu_slice(xs: &mut [f32]) {
    for x in xs {
        *x = gelu(*x);
    }
}

/// `grad · gelu'(x)` over two slices of one length, into `grads`.
#[inline(always)]
pub(crate) fn gelu_backward_slice(xs: &[f32], grads: &mut [f32]) {
    for (g, &x) in grads.iter_mut().zip(xs) {
        // Burn multiplies `y' · grad`; a product of two is the same bits either way round.
        *g *= gelu_derivative(x);
    }
}
