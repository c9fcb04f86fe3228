//! A Linear's input packed once for every step of a ring pass.

use std::any::Any;

/// Which step reads a packed input: the forward multiplies by X, the weight gradient by `Xᵀ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XUse {
    /// `Y[.., win] = X · W_j`.
    Forward,
    /// `dW_j = Xᵀ · dY[.., win]`.
    WeightGrad,
}

/// A Linear's input X packed once for every step of a ring pass that reads it as one
/// [`XUse`]. A GEMM packs both operands on every call, so without it a pass of N steps packs
/// the same X N times, where data parallelism's one GEMM packs it once. Only NdArray with f32
/// on a CPU with AVX2 and FMA packs ([`pack_x`](crate::pack_x)); the steps read the packing
/// instead of packing X again, with the same bits.
#[derive(Debug)]
pub struct PackedX {
    pub(crate) use_: XUse,
    /// The packing, as the backend that made it knows it (NdArray: `packed_lhs::PackedLhs`).
    pub(crate) lhs: Box<dyn Any + Send + Sync>,
    /// The bytes the packing holds.
    pub(crate) bytes: usize,
    /// X itself, held so that its buffer outlives the packing: a step recognises X by the
    /// address of its first element, which no other tensor can take while X lives (and a
    /// shared buffer is copied, never written, by any op that would change it).
    pub(crate) _source: Box<dyn std::any::Any + Send + Sync>,
}

impl PackedX {
    /// The bytes the packed copy holds (X's, its rows padded to a multiple of 6): a caller
    /// charges them while it keeps the packing.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
