//! The tiled GEMM behind every Linear step: `C[win] (+)= A · B (+ bias)`, with A, B and C
//! addressed through an offset and two strides each, so that a column window of Y or dY, and
//! a transposed X or W_j, are read and written where they lie, with no copy.
//!
//! A cube of `units_m × units_n` units computes a `units_m·tm × units_n·tn` block of C. The K
//! dimension is walked in slices of `depth`: the units stage A's and B's slices in shared
//! memory, the cube syncs, and each unit accumulates its `tm × tn` outputs in registers.
//! Elements past an edge load as zero, so no shape needs to be a multiple of a tile.
//!
//! Both slices are held K-major in 4-wide vectors (A's rows and B's columns in fours), and
//! each unit owns rows and columns in groups of four. One step of K then costs a unit
//! `tm/4 + tn/4` vector loads from shared memory for `tm·tn` multiply-adds: the float4 layout
//! of GPU SGEMMs, which reads shared memory without bank conflicts. On Mesa's lavapipe,
//! where every load that differs between units is a loop over the SIMD lanes, the count of
//! load instructions is what bounds a GEMM, and a vector load pays for four elements at once.
//!
//! With `col_sums`, the cubes of the first block row also sum B's columns over all of K (the
//! bias gradient `Σ_rows dY[.., win]` of a weight-gradient step) from the tiles they already
//! hold, so the bias gradient costs no second pass over dY.

use cubecl::prelude::*;

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

/// The shape of a launch: units per cube along M and N, outputs per unit (multiples of 4),
/// and the depth of one K slice. Chosen per device by the launch code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Tiling {
    /// Units along the rows of C.
    pub units_m: usize,
    /// Units along the columns of C.
    pub units_n: usize,
    /// Rows of C per unit (a multiple of 4).
    pub tm: usize,
    /// Columns of C per unit (a multiple of 4).
    pub tn: usize,
    /// K slice held in shared memory per sync.
    pub depth: usize,
}

impl Tiling {
    /// Rows of C per cube.
    pub fn block_m(&self) -> usize {
        self.units_m * self.tm
    }

    /// Columns of C per cube.
    pub fn block_n(&self) -> usize {
        self.units_n * self.tn
    }

    /// Whether the kernel's index arithmetic holds for this shape: whole vectors per unit
    /// along M and N, and K slices of whole 4 × 4 blocks (units past the last vector of a
    /// slice stage nothing).
    pub fn is_valid(&self) -> bool {
        self.tm.is_multiple_of(4)
            && self.tn.is_multiple_of(4)
            && self.depth.is_multiple_of(4)
            && self.tm > 0
            && self.tn > 0
            && self.depth > 0
            && self.units_m * self.units_n > 0
    }
}

/// A 4-wide vector of `F`: the unit of shared memory and of the register tile.
type Quad<F> = Vector<F, Const<4>>;

/// Four consecutive elements of `t` (along its contiguous dimension), from element `base` on: element `i`
/// is zero unless `inside` and `first + i < extent`. With vectors of 4 (`N`), the launch
/// guarantees `base % 4 == 0` and `extent % 4 == 0`, so a vector lies wholly inside or out
/// and one load fetches it; with vectors of 1, four loads.
#[cube]
fn load_quad<F: Float, N: Size>(
    t: &Tensor<Vector<F, N>>,
    base: usize,
    inside: bool,
    first: usize,
    extent: usize,
) -> Quad<F> {
    let mut q = Quad::<F>::new(F::new(0.0));
    let size = N::value();
    if comptime!(size == 4) {
        if inside && first < extent {
            let v = t[base / 4];
            #[unroll]
            for i in 0..4usize {
                q[i] = v[i];
            }
        }
    } else {
        #[unroll]
        for i in 0..4usize {
            if inside && first + i < extent {
                q[i] = t[base + i][0];
            }
        }
    }
    q
}

/// Writes `v` to four elements of `t` from element `base` on, `step` apart (adding what is
/// there when `accumulate`): element `i` only if `first + i < extent`. With vectors of 4 the
/// launch guarantees `step == 1`, `base % 4 == 0` and `extent % 4 == 0`: one store.
#[cube]
fn store_quad<F: Float, N: Size>(
    t: &mut Tensor<Vector<F, N>>,
    base: usize,
    step: usize,
    first: usize,
    extent: usize,
    v: Quad<F>,
    #[comptime] accumulate: bool,
) {
    let size = N::value();
    if comptime!(size == 4) {
        if first < extent {
            let at = base / 4;
            let mut w = Vector::<F, N>::empty();
            #[unroll]
            for i in 0..4usize {
                w[i] = v[i];
            }
            if accumulate {
                w = t[at] + w;
            }
            t[at] = w;
        }
    } else {
        #[unroll]
        for i in 0..4usize {
            if first + i < extent {
                let at = base + i * step;
                let mut x = v[i];
                if accumulate {
                    x += t[at][0];
                }
                t[at] = Vector::<F, N>::new(x);
            }
        }
    }
}

/// Stages one K slice of an operand into `tile` (K-major: `depth` rows of `groups` vectors,
/// vector `g` holding four consecutive indices `4g..4g+4` of the operand's other dimension,
/// M for A, N for B). The operand is `op[i, kk] = buf[at.offset + i·at.rows + kk·at.cols]`,
/// with `i` counted from `first_i` and valid below `extent_i`, `kk` from `k0` and valid
/// below `k`.
///
/// With `along_k` the operand's elements are adjacent along K: each unit reads a 4 × 4 block
/// as four vectors along K and transposes it in registers. Otherwise they are adjacent along
/// the other dimension and each vector goes to shared memory as it is read. Either way
/// neighbouring units read neighbouring addresses.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage<F: Float, N: Size>(
    t: &Tensor<Vector<F, N>>,
    tile: &mut SharedMemory<Quad<F>>,
    at: Strided,
    first_i: usize,
    extent_i: usize,
    k0: usize,
    k: usize,
    unit: usize,
    #[comptime] along_k: bool,
    #[comptime] groups: usize,
    #[comptime] depth: usize,
    #[comptime] units: usize,
) {
    if along_k {
        let blocks = comptime!(depth / 4 * groups);
        #[unroll]
        for s in 0..comptime!(blocks.div_ceil(units)) {
            let e = unit + s * units;
            if comptime!(blocks.is_multiple_of(units)) || e < blocks {
                let q = e % comptime!(depth / 4);
                let g = e / comptime!(depth / 4);
                let kq = k0 + q * 4;
                let mut rows = Array::<Quad<F>>::new(4usize);
                #[unroll]
                for r in 0..4usize {
                    let i = first_i + g * 4 + r;
                    rows[r] = load_quad::<F, N>(
                        t,
                        at.offset + i * at.rows + kq * at.cols,
                        i < extent_i,
                        kq,
                        k,
                    );
                }
                #[unroll]
                for c in 0..4usize {
                    let mut v = Quad::<F>::empty();
                    #[unroll]
                    for r in 0..4usize {
                        v[r] = rows[r][c];
                    }
                    tile[(q * 4 + c) * groups + g] = v;
                }
            }
        }
    } else {
        #[unroll]
        for s in 0..comptime!((depth * groups).div_ceil(units)) {
            let e = unit + s * units;
            if comptime!((depth * groups).is_multiple_of(units)) || e < comptime!(depth * groups) {
                let g = e % groups;
                let kk = e / groups;
                let kg = k0 + kk;
                let i = first_i + g * 4;
                tile[kk * groups + g] = load_quad::<F, N>(
                    t,
                    at.offset + i * at.rows + kg * at.cols,
                    kg < k,
                    i,
                    extent_i,
                );
            }
        }
    }
}

/// `c[r, col] = (c[r, col] if accumulate) + Σ_k a[r, k]·b[k, col] (+ bias[col])` for
/// `r < m`, `col < n`; with `col_sums`, `sums[col] = Σ_k b[k, col]` too.
///
/// `a_along_k` / `b_along_n` say along which dimension each operand's elements are adjacent
/// in memory; `NA` / `NB` / `NC` are the vector sizes A's and B's loads and C's stores use (4
/// where the launch found the operand's offset, strides and contiguous extent divisible by 4,
/// else 1). C is adjacent along N when `NC` is 4; the bias, contiguous, is read like C.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_window<F: Float, NA: Size, NB: Size, NC: Size>(
    a: &Tensor<Vector<F, NA>>,
    b: &Tensor<Vector<F, NB>>,
    c: &mut Tensor<Vector<F, NC>>,
    bias: &Tensor<Vector<F, NC>>,
    sums: &mut Tensor<F>,
    a_at: Strided,
    b_at: Strided,
    c_at: Strided,
    m: usize,
    n: usize,
    k: usize,
    #[comptime] tiling: Tiling,
    #[comptime] a_along_k: bool,
    #[comptime] b_along_n: bool,
    #[comptime] accumulate: bool,
    #[comptime] with_bias: bool,
    #[comptime] col_sums: bool,
    #[define(F)] _dtype: StorageType,
) {
    let units_m = comptime!(tiling.units_m);
    let units_n = comptime!(tiling.units_n);
    let units = comptime!(tiling.units_m * tiling.units_n);
    let depth = comptime!(tiling.depth);
    // Vectors per unit along M and N, and per block.
    let vm = comptime!(tiling.tm / 4);
    let vn = comptime!(tiling.tn / 4);
    let gm = comptime!(tiling.block_m() / 4);
    let gn = comptime!(tiling.block_n() / 4);
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let unit = ty * units_n + tx;
    let row0 = CUBE_POS_Y as usize * comptime!(tiling.block_m());
    let col0 = CUBE_POS_X as usize * comptime!(tiling.block_n());
    let summing = col_sums && CUBE_POS_Y == 0 && ty == 0;

    let mut tile_a = SharedMemory::<Quad<F>>::new(comptime!(depth * gm));
    let mut tile_b = SharedMemory::<Quad<F>>::new(comptime!(depth * gn));
    let mut acc = Array::<Quad<F>>::new(comptime!(tiling.tm * vn));
    let mut sum = Array::<Quad<F>>::new(vn);
    let mut va = Array::<Quad<F>>::new(vm);
    let mut vb = Array::<Quad<F>>::new(vn);
    #[unroll]
    for i in 0..comptime!(tiling.tm * vn) {
        acc[i] = Quad::<F>::new(F::new(0.0));
    }
    #[unroll]
    for j in 0..vn {
        sum[j] = Quad::<F>::new(F::new(0.0));
    }
    // B as an (n, k) operand, like A is an (m, k) one.
    let b_nk = Strided {
        offset: b_at.offset,
        rows: b_at.cols,
        cols: b_at.rows,
    };

    let mut k0 = 0usize;
    while k0 < k {
        stage::<F, NA>(
            a,
            &mut tile_a,
            a_at,
            row0,
            m,
            k0,
            k,
            unit,
            a_along_k,
            gm,
            depth,
            units,
        );
        stage::<F, NB>(
            b,
            &mut tile_b,
            b_nk,
            col0,
            n,
            k0,
            k,
            unit,
            comptime!(!b_along_n),
            gn,
            depth,
            units,
        );
        sync_cube();
        #[unroll]
        for kk in 0..depth {
            #[unroll]
            for i in 0..vm {
                va[i] = tile_a[kk * gm + ty + i * units_m];
            }
            #[unroll]
            for j in 0..vn {
                vb[j] = tile_b[kk * gn + tx + j * units_n];
            }
            #[unroll]
            for i in 0..vm {
                #[unroll]
                for r in 0..4usize {
                    let av = Quad::<F>::new(va[i][r]);
                    #[unroll]
                    for j in 0..vn {
                        let at = (i * 4 + r) * vn + j;
                        acc[at] = fma(av, vb[j], acc[at]);
                    }
                }
            }
        }
        if summing {
            #[unroll]
            for kk in 0..depth {
                #[unroll]
                for j in 0..vn {
                    sum[j] += tile_b[kk * gn + tx + j * units_n];
                }
            }
        }
        sync_cube();
        k0 += depth;
    }

    // The bias of each of the unit's column vectors, read once.
    let mut bias_v = Array::<Quad<F>>::new(vn);
    if with_bias {
        #[unroll]
        for j in 0..vn {
            let col = col0 + (tx + j * units_n) * 4;
            bias_v[j] = load_quad::<F, NC>(bias, col, true, col, n);
        }
    }
    #[unroll]
    for i in 0..vm {
        #[unroll]
        for r in 0..4usize {
            let row = row0 + (ty + i * units_m) * 4 + r;
            if row < m {
                #[unroll]
                for j in 0..vn {
                    let col = col0 + (tx + j * units_n) * 4;
                    let mut v = acc[(i * 4 + r) * vn + j];
                    if with_bias {
                        v += bias_v[j];
                    }
                    store_quad::<F, NC>(
                        c,
                        c_at.offset + row * c_at.rows + col * c_at.cols,
                        c_at.cols,
                        col,
                        n,
                        v,
                        accumulate,
                    );
                }
            }
        }
    }
    if summing {
        #[unroll]
        for j in 0..vn {
            let v = sum[j];
            #[unroll]
            for q in 0..4usize {
                let col = col0 + (tx + j * units_n) * 4 + q;
                if col < n {
                    sums[col] = v[q];
                }
            }
        }
    }
}
