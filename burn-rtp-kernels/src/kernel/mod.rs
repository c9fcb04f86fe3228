//! One folder per kernel, each with its generic composition.

pub mod adam;

#[cfg(feature = "cube")]
mod cube;
pub mod embedding;
mod fill;
#[cfg(feature = "flex")]
mod flex;
mod gelu;
pub mod linear;
mod matmul;

/// Burn's fusion backend records ops lazily; its steps stay compositions of its own ops,
/// which it fuses as it sees fit.
#[cfg(feature = "fusion")]
impl<B: burn_fusion::FusionBackend> crate::RotationKernels for burn_fusion::Fusion<B> {}

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
