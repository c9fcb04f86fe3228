//! The tiled GEMM behind every Linear step: `C[win] (+)= A · B (+ bias)`, with A, B and C
//! addressed through an offset and two strides each, so that a column window of Y or dY, and
//! a transposed X or W_j, are read and written where they lie, with no copy.
//!
//! A cube of `units × units` units computes a `units·tm × units·tn` block of C. The K
//! dimension is walked in slices of `depth` (a multiple of `units`): each unit loads its share
//! of A's and B's slices into shared memory, the cube syncs, and each unit accumulates its
//! `tm × tn` outputs in registers.
//! Elements past an edge load as zero, so no shape needs to be a multiple of a tile.
//!
//! With `col_sums`, the cubes of the first block row also sum B's columns over all of K (the
//! bias gradient `Σ_rows dY[.., win]` of a weight-gradient step) from the tiles they already
//! hold, so the bias gradient costs no second pass over dY.

use cubecl::prelude::*;

/// Units along each side of a cube, as launched.
pub(crate) const UNITS: usize = 16;
/// Depth of one K slice held in shared memory, as launched (a multiple of [`UNITS`]).
pub(crate) const DEPTH: usize = 16;

/// Where a matrix operand lies in its buffer: `m[r, c] = buf[offset + r·rows + c·cols]`.
#[derive(CubeLaunch, CubeType, Clone, Copy)]
pub(crate) struct Strided {
    /// First element.
    pub offset: usize,
    /// Step between rows.
    pub rows: usize,
    /// Step between columns.
    pub cols: usize,
}

/// `c[r, col] = (c[r, col] if accumulate) + Σ_k a[r, k]·b[k, col] (+ bias[col])` for
/// `r < m`, `col < n`; with `col_sums`, `sums[col] = Σ_k b[k, col]` too.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_window<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    c: &mut Tensor<F>,
    bias: &Tensor<F>,
    sums: &mut Tensor<F>,
    a_at: Strided,
    b_at: Strided,
    c_at: Strided,
    m: usize,
    n: usize,
    k: usize,
    #[comptime] units: usize,
    #[comptime] depth: usize,
    #[comptime] tm: usize,
    #[comptime] tn: usize,
    #[comptime] accumulate: bool,
    #[comptime] with_bias: bool,
    #[comptime] col_sums: bool,
    #[define(F)] _dtype: StorageType,
) {
    let block_m = comptime!(units * tm);
    let block_n = comptime!(units * tn);
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let unit = ty * units + tx;
    let row0 = CUBE_POS_Y as usize * block_m;
    let col0 = CUBE_POS_X as usize * block_n;
    let summing = col_sums && CUBE_POS_Y == 0 && ty == 0;

    let mut tile_a = SharedMemory::<F>::new(comptime!(units * tm * depth));
    let mut tile_b = SharedMemory::<F>::new(comptime!(depth * units * tn));
    let mut acc = Array::<F>::new(comptime!(tm * tn));
    let mut sum = Array::<F>::new(tn);
    let mut row_b = Array::<F>::new(tn);
    #[unroll]
    for i in 0..tm * tn {
        acc[i] = F::new(0.0);
    }
    #[unroll]
    for j in 0..tn {
        sum[j] = F::new(0.0);
    }

    let mut k0 = 0usize;
    while k0 < k {
        // A's slice: block_m × depth, tm elements per unit.
        #[unroll]
        for s in 0..comptime!(tm * depth / units) {
            let e = unit + s * units * units;
            let r = row0 + e / depth;
            let kk = k0 + e % depth;
            let mut v = F::new(0.0);
            if r < m && kk < k {
                v = a[a_at.offset + r * a_at.rows + kk * a_at.cols];
            }
            tile_a[e] = v;
        }
        // B's slice: depth × block_n, tn elements per unit.
        #[unroll]
        for s in 0..comptime!(tn * depth / units) {
            let e = unit + s * units * units;
            let kk = k0 + e / block_n;
            let col = col0 + e % block_n;
            let mut v = F::new(0.0);
            if kk < k && col < n {
                v = b[b_at.offset + kk * b_at.rows + col * b_at.cols];
            }
            tile_b[e] = v;
        }
        sync_cube();
        // B's row is read into registers once per k and reused by all tm rows: tm + tn
        // shared-memory loads per tm·tn multiply-adds, not tm·(tn + 1). (Lavapipe's compiler
        // already reused them: its timings did not move; a GPU's need not.)
        #[unroll]
        for kk in 0..depth {
            #[unroll]
            for j in 0..tn {
                row_b[j] = tile_b[kk * block_n + tx + j * units];
            }
            #[unroll]
            for i in 0..tm {
                let av = tile_a[(ty + i * units) * depth + kk];
                #[unroll]
                for j in 0..tn {
                    acc[i * tn + j] += av * row_b[j];
                }
            }
        }
        if summing {
            #[unroll]
            for j in 0..tn {
                for kk in 0..depth {
                    sum[j] += tile_b[kk * block_n + tx + j * units];
                }
            }
        }
        sync_cube();
        k0 += depth;
    }

    #[unroll]
    for i in 0..tm {
        let r = row0 + ty + i * units;
        #[unroll]
        for j in 0..tn {
            let col = col0 + tx + j * units;
            if r < m && col < n {
                let at = c_at.offset + r * c_at.rows + col * c_at.cols;
                let mut v = acc[i * tn + j];
                if with_bias {
                    v += bias[col];
                }
                if accumulate {
                    v = c[at] + v;
                }
                c[at] = v;
            }
        }
    }
    if summing {
        #[unroll]
        for j in 0..tn {
            let col = col0 + tx + j * units;
            if col < n {
                sums[col] = sum[j];
            }
        }
    }
}
