//! An f32 GEMM whose left operand is packed once and then reused: the operand that every
//! step of a ring pass shares (X in the forward, `Xᵀ` in the weight gradient).
//!
//! Why: matrixmultiply packs both operands on every call. A rotation makes N calls per
//! Linear against the same X, so X was packed N times where data parallelism packs it once.
//! On config A at N = 4 under MPI (`perf`, all ranks) that repacking was 57% of the CPU time an
//! RTP job spent beyond a DDP job's.
//!
//! Rounding is matrixmultiply's FMA kernel's. An element of C is a sum of products, cut into
//! blocks of at most [`KC`] consecutive terms: every call starts a block at its first term,
//! and a caller may also cut the sum into segments (one per sample). Each block is summed with
//! fused multiply-adds, in order, starting from +0. Then `C = block + 0` for the first block
//! of a call that overwrites C, and `C = block + C` for every other block. The one difference
//! from matrixmultiply is in its edge tiles (the last `m mod 8` rows and `n mod 8` columns).
//! When a block sums to −0 and C holds −0, matrixmultiply adds +0 and gets +0, while this
//! kernel gets −0. The Linear steps never hold −0 in C before an add: C starts as a block's
//! sum plus +0, or as zeros, and a round-to-nearest sum reaches −0 only from two −0s.
//!
//! Without an operand packed before ([`Lhs::View`]), a call packs A's rows block by block as
//! it goes, into a buffer of [`MC`] × [`KC`] floats, as matrixmultiply does.
//!
//! It runs only where the CPU has AVX2 and FMA, which is where matrixmultiply takes its FMA
//! kernel ([`available`]). Elsewhere the callers keep matrixmultiply.

use ndarray::{ArrayView2, ArrayViewMut2};

/// Rows of A per micro-tile.
const MR: usize = 6;
/// Columns of B per micro-tile: two 8-lane vectors.
const NR: usize = 16;
/// matrixmultiply's block of the sum for f32: the results' rounding depends on it.
pub(crate) const KC: usize = 256;
/// Rows of A per pass over B's panels. A multiple of [`MR`]; A's block (96 × 256 floats) and
/// one panel of B (256 × 16) fit in L2 together.
const MC: usize = 96;

/// Whether this CPU runs the packed GEMM (AVX2 and FMA).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The blocks of a sum cut at `segments` (which must cover `0..k` in order, each starting
/// where the last ended), every segment cut further into blocks of [`KC`] terms:
/// (first term, number of terms).
fn blocks_of(segments: &[(usize, usize)], k: usize) -> Vec<(usize, usize)> {
    let mut next = 0;
    for &(start, len) in segments {
        assert_eq!(start, next, "segments of a sum follow each other from 0");
        next = start + len;
    }
    assert_eq!(next, k, "the segments of a sum cover its depth");
    segments
        .iter()
        .flat_map(|&(start, len)| {
            (0..len)
                .step_by(KC)
                .map(move |at| (start + at, KC.min(len - at)))
        })
        .collect()
}

/// Packs rows `rows` of `a` and terms `k0..k0 + kl` of its sum into panels of [`MR`] rows,
/// `kl · MR` floats each (zero past the last row).
fn pack_lhs_block(
    a: &ArrayView2<'_, f32>,
    rows: std::ops::Range<usize>,
    k0: usize,
    kl: usize,
    out: &mut [f32],
) {
    let (rs, cs) = (a.strides()[0], a.strides()[1]);
    let base = a.as_ptr();
    let panels = rows.len().div_ceil(MR);
    for (p, panel) in out.chunks_mut(kl * MR).take(panels).enumerate() {
        let first = rows.start + p * MR;
        let live = MR.min(rows.end - first);
        for kk in 0..kl {
            let column = &mut panel[kk * MR..(kk + 1) * MR];
            for (i, v) in column.iter_mut().enumerate() {
                *v = if i < live {
                    let (r, c) = ((first + i) as isize, (k0 + kk) as isize);
                    // SAFETY: r < rows.end <= m and c < k0 + kl <= k, inside the view.
                    unsafe { *base.offset(r * rs + c * cs) }
                } else {
                    0.0
                };
            }
        }
    }
}

/// A left operand `A` (`[m, k]`) packed in panels of [`MR`] rows, block by block of the sum.
#[derive(Debug)]
pub(crate) struct PackedLhs {
    m: usize,
    k: usize,
    /// The blocks of the sum in order: (first term, number of terms), each at most [`KC`].
    blocks: Vec<(usize, usize)>,
    /// Where each block's panels start in `data`.
    offsets: Vec<usize>,
    data: Vec<f32>,
    /// `A`'s first element and strides, and the segments, so that a caller can check that it
    /// was packed from the operand at hand, cut the same way.
    source: (usize, [isize; 2]),
    segments: Vec<(usize, usize)>,
}

impl PackedLhs {
    /// Packs `a`, its sum cut at each segment start (e.g. one segment per sample) and every
    /// segment cut into blocks of [`KC`] terms. Segments must cover `0..k` in order.
    pub(crate) fn pack(a: ArrayView2<'_, f32>, segments: &[(usize, usize)]) -> Self {
        let (m, k) = a.dim();
        let blocks = blocks_of(segments, k);
        let panels = m.div_ceil(MR);
        let mut data = vec![0.0f32; panels * MR * k];
        let mut offsets = Vec::with_capacity(blocks.len());
        let mut at = 0;
        for &(k0, kl) in &blocks {
            offsets.push(at);
            pack_lhs_block(&a, 0..m, k0, kl, &mut data[at..at + panels * kl * MR]);
            at += panels * kl * MR;
        }
        Self {
            m,
            k,
            blocks,
            offsets,
            data,
            source: (a.as_ptr() as usize, [a.strides()[0], a.strides()[1]]),
            segments: segments.to_vec(),
        }
    }

    /// The bytes the packed copy holds.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() * size_of::<f32>()
    }

    /// Whether this was packed from `a` (same first element, shape and strides), cut at
    /// `segments`.
    pub(crate) fn packed_from(&self, a: &ArrayView2<'_, f32>, segments: &[(usize, usize)]) -> bool {
        self.source == (a.as_ptr() as usize, [a.strides()[0], a.strides()[1]])
            && a.dim() == (self.m, self.k)
            && self.segments == segments
    }
}

/// The left operand of [`gemm`]: packed once for many calls, or read where it lies and
/// packed block by block as the call goes (a buffer of [`MC`] × [`KC`] floats, as
/// matrixmultiply holds).
pub(crate) enum Lhs<'a, 'b> {
    /// Packed before.
    Packed(&'a PackedLhs),
    /// `A`, and the segments its sum is cut at.
    View(ArrayView2<'b, f32>, &'a [(usize, usize)]),
}

/// `C = A · B`, or `C += A · B` with `accumulate`, block by block of A's sum (module docs).
/// The caller checked [`available`].
pub(crate) fn gemm(
    a: Lhs<'_, '_>,
    b: ArrayView2<'_, f32>,
    mut c: ArrayViewMut2<'_, f32>,
    accumulate: bool,
) {
    assert!(available(), "the packed GEMM needs AVX2 and FMA");
    let ((m, k), blocks) = match &a {
        Lhs::Packed(p) => ((p.m, p.k), p.blocks.clone()),
        Lhs::View(v, segments) => (v.dim(), blocks_of(segments, v.ncols())),
    };
    let n = b.ncols();
    assert_eq!(b.nrows(), k, "B's rows are A's depth");
    assert_eq!(c.dim(), (m, n), "C is [rows of A, columns of B]");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // matrixmultiply with no terms: C = βC.
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    let panels = n.div_ceil(NR);
    let mut packed_b = vec![0.0f32; panels * NR * KC.min(k)];
    let mut packed_a = match a {
        Lhs::Packed(_) => Vec::new(),
        Lhs::View(..) => vec![0.0f32; MC * KC.min(k)],
    };
    let (rsc, csc) = (c.strides()[0], c.strides()[1]);
    let c_base = c.as_mut_ptr();
    for (bi, &(k0, kl)) in blocks.iter().enumerate() {
        pack_rhs(&b, k0, kl, &mut packed_b);
        let add_c = accumulate || bi > 0;
        for ic in (0..m).step_by(MC) {
            let block_end = m.min(ic + MC);
            // The panels of rows `ic..block_end` for this block, the first one first.
            let a_block: &[f32] = match &a {
                Lhs::Packed(p) => &p.data[p.offsets[bi] + (ic / MR) * kl * MR..],
                Lhs::View(v, _) => {
                    pack_lhs_block(v, ic..block_end, k0, kl, &mut packed_a);
                    &packed_a
                }
            };
            for jp in 0..panels {
                let j0 = jp * NR;
                let cols = NR.min(n - j0);
                let b_panel = &packed_b[jp * kl * NR..(jp + 1) * kl * NR];
                for i0 in (ic..block_end).step_by(MR) {
                    let rows = MR.min(m - i0);
                    let p = (i0 - ic) / MR;
                    let a_panel = &a_block[p * kl * MR..(p + 1) * kl * MR];
                    // SAFETY: the tile's rows and columns lie inside C (i0 + rows <= m,
                    // j0 + cols <= n); the panels hold kl·MR and kl·NR floats; the CPU has
                    // AVX2 and FMA (asserted above).
                    unsafe {
                        let c_tile = c_base.offset(i0 as isize * rsc + j0 as isize * csc);
                        tile(kl, a_panel, b_panel, c_tile, rsc, csc, rows, cols, add_c);
                    }
                }
            }
        }
    }
}

/// Packs rows `k0..k0 + kl` of `b` in panels of [`NR`] columns (zero past the last column).
fn pack_rhs(b: &ArrayView2<'_, f32>, k0: usize, kl: usize, out: &mut [f32]) {
    let n = b.ncols();
    let (rs, cs) = (b.strides()[0], b.strides()[1]);
    let base = b.as_ptr();
    for jp in 0..n.div_ceil(NR) {
        let cols = NR.min(n - jp * NR);
        let panel = &mut out[jp * kl * NR..(jp + 1) * kl * NR];
        for kk in 0..kl {
            let row = &mut panel[kk * NR..(kk + 1) * NR];
            // SAFETY: row k0 + kk < k and columns jp·NR + j < n, inside the view.
            let at = unsafe { base.offset((k0 + kk) as isize * rs + (jp * NR) as isize * cs) };
            if cs == 1 {
                // SAFETY: `cols` contiguous elements from `at`, inside the view.
                row[..cols].copy_from_slice(unsafe { std::slice::from_raw_parts(at, cols) });
            } else {
                for (j, v) in row[..cols].iter_mut().enumerate() {
                    // SAFETY: as above, column by column.
                    *v = unsafe { *at.offset(j as isize * cs) };
                }
            }
            row[cols..].fill(0.0);
        }
    }
}

/// One `rows × cols` tile of C (at most [`MR`] × [`NR`]) from one block of `kl` terms:
/// `C = block + C` (`add_c`) or `C = block + 0`.
///
/// # Safety
/// The CPU has AVX2 and FMA; `c` addresses a tile of `rows × cols` elements with strides
/// `rsc`, `csc`; the panels hold `kl · MR` and `kl · NR` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    kl: usize,
    a: &[f32],
    b: &[f32],
    c: *mut f32,
    rsc: isize,
    csc: isize,
    rows: usize,
    cols: usize,
    add_c: bool,
) {
    use std::arch::x86_64::*;
    debug_assert!(a.len() >= kl * MR && b.len() >= kl * NR);
    let (a, b) = (a.as_ptr(), b.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for kk in 0..kl {
        let b0 = _mm256_loadu_ps(b.add(kk * NR));
        let b1 = _mm256_loadu_ps(b.add(kk * NR + 8));
        for (i, row) in acc.iter_mut().enumerate() {
            let ai = _mm256_broadcast_ss(&*a.add(kk * MR + i));
            row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
            row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
        }
    }
    let zero = _mm256_setzero_ps();
    if rows == MR && cols == NR && csc == 1 {
        for (i, row) in acc.iter().enumerate() {
            let p = c.offset(i as isize * rsc);
            let (lo, hi) = if add_c {
                (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
            } else {
                (zero, zero)
            };
            _mm256_storeu_ps(p, _mm256_add_ps(row[0], lo));
            _mm256_storeu_ps(p.add(8), _mm256_add_ps(row[1], hi));
        }
        return;
    }
    let mut sums = [[0.0f32; NR]; MR];
    for (i, row) in acc.iter().enumerate() {
        _mm256_storeu_ps(sums[i].as_mut_ptr(), row[0]);
        _mm256_storeu_ps(sums[i].as_mut_ptr().add(8), row[1]);
    }
    for (i, sum) in sums.iter().enumerate().take(rows) {
        for (j, s) in sum.iter().enumerate().take(cols) {
            let p = c.offset(i as isize * rsc + j as isize * csc);
            *p = *s + if add_c { *p } else { 0.0 };
        }
    }
}

/// Never called: [`available`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    _: usize,
    _: &[f32],
    _: &[f32],
    _: *mut f32,
    _: isize,
    _: isize,
    _: usize,
    _: usize,
    _: bool,
) {
    unreachable!("the packed GEMM runs on x86-64 only")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::linalg::general_mat_mul;
    use ndarray::{s, Array2, ShapeBuilder};

    /// Values that exercise rounding: mixed signs and magnitudes.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let unit = (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                unit * if x.is_multiple_of(7) { 1e3 } else { 1.0 }
            })
            .collect()
    }

    fn bits(a: &Array2<f32>) -> Vec<u32> {
        a.iter().map(|v| v.to_bits()).collect()
    }

    /// The packed GEMM equals matrixmultiply bit for bit, on windows of C and B read where
    /// they lie, across tile edges, with sums longer than one block, overwriting and
    /// accumulating, packed before or as it goes.
    #[test]
    fn equals_matrixmultiply_bit_for_bit() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX2 or FMA");
            return;
        }
        for &(m, k, n, seed) in &[
            (1, 1, 1, 1),
            (7, 5, 3, 2),
            (12, 256, 32, 3),
            (13, 257, 17, 4),
            (97, 600, 70, 5),
            (200, 64, 150, 6),
        ] {
            let a = Array2::from_shape_vec((m, k), values(m * k, seed)).unwrap();
            // B is a window of a wider matrix, C a window of a wider output.
            let wide_b =
                Array2::from_shape_vec((k, n + 5), values(k * (n + 5), seed + 10)).unwrap();
            let b = wide_b.slice(s![.., 2..2 + n]);
            let start = Array2::from_shape_vec((m, n + 3), values(m * (n + 3), seed + 20)).unwrap();
            let whole = [(0, k)];
            let packed = PackedLhs::pack(a.view(), &whole);
            assert!(packed.packed_from(&a.view(), &whole));
            assert!(!packed.packed_from(&a.view(), &[(0, 1), (1, k - 1)]));
            if m > 1 && k > 1 {
                // The same first element read with other strides is another operand.
                let other = ArrayView2::from_shape((m, k).f(), a.as_slice().unwrap()).unwrap();
                assert!(!packed.packed_from(&other, &whole));
            }
            for accumulate in [false, true] {
                let beta = if accumulate { 1.0 } else { 0.0 };
                let mut want = start.clone();
                general_mat_mul(1.0, &a, &b, beta, &mut want.slice_mut(s![.., 1..1 + n]));
                for lhs in [Lhs::Packed(&packed), Lhs::View(a.view(), &whole)] {
                    let mut got = start.clone();
                    gemm(lhs, b, got.slice_mut(s![.., 1..1 + n]), accumulate);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "m {m} k {k} n {n} acc {accumulate}"
                    );
                }
            }
            // A transposed view packs like any other.
            let at = a.t();
            let packed_t = PackedLhs::pack(at, &[(0, m)]);
            let bt = Array2::from_shape_vec((m, n), values(m * n, seed + 30)).unwrap();
            let mut want = Array2::zeros((k, n));
            general_mat_mul(1.0, &at, &bt, 0.0, &mut want);
            for lhs in [Lhs::Packed(&packed_t), Lhs::View(at, &[(0, m)])] {
                let mut got = Array2::from_elem((k, n), f32::NAN);
                gemm(lhs, bt.view(), got.view_mut(), false);
                assert_eq!(bits(&got), bits(&want), "transposed, m {m} k {k} n {n}");
            }
        }
    }

    /// Segments sum like one call per segment, each added to the running C.
    #[test]
    fn segments_sum_like_one_call_each() {
        if !available() {
            return;
        }
        let (m, seq, batch, n) = (19, 300, 3, 21);
        let x = Array2::from_shape_vec((batch * seq, m), values(batch * seq * m, 7)).unwrap();
        let dy = Array2::from_shape_vec((batch * seq, n), values(batch * seq * n, 8)).unwrap();
        let mut want = Array2::<f32>::zeros((m, n));
        for i in 0..batch {
            let rows = s![i * seq..(i + 1) * seq, ..];
            general_mat_mul(1.0, &x.slice(rows).t(), &dy.slice(rows), 1.0, &mut want);
        }
        let segments: Vec<_> = (0..batch).map(|i| (i * seq, seq)).collect();
        let packed = PackedLhs::pack(x.t(), &segments);
        for lhs in [Lhs::Packed(&packed), Lhs::View(x.t(), &segments)] {
            let mut got = Array2::<f32>::zeros((m, n));
            gemm(lhs, dy.view(), got.view_mut(), true);
            assert_eq!(bits(&got), bits(&want));
        }
    }

    /// Segments must follow each other from 0 and cover the sum: anything else would read
    /// outside A.
    #[test]
    #[should_panic(expected = "segments of a sum follow each other from 0")]
    fn segments_that_skip_terms_are_refused() {
        let a = Array2::<f32>::zeros((3, 4));
        let _ = PackedLhs::pack(a.view(), &[(1, 4)]);
    }
}
