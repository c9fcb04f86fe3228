//! One folder per kernel, each with its generic composition.

pub mod columns;
pub mod embedding;
pub mod linear;

/// An output a cube kernel may write into: `t` itself when no other handle shares its buffer
/// and it is contiguous, else a private contiguous copy (Burn tensors are values; a shared
/// buffer is never written).
#[cfg(feature = "cube")]
pub(crate) fn writable<R: burn_cubecl::CubeRuntime>(
    t: burn_cubecl::tensor::CubeTensor<R>,
) -> burn_cubecl::tensor::CubeTensor<R> {
    if t.can_mut() && t.is_contiguous() {
        t
    } else {
        t.copy()
    }
}
