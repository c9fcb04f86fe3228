//! The cube backends (wgpu, CUDA, any cubecl runtime) run the fused `#[cube]` kernels: the
//! tiled GEMM of `linear/gemm.rs` and the embedding's gather and scatter.

use crate::columns::Window;
use crate::dispatch::{Checked, KernelPath, RotationKernels};
use crate::generic::embedding as embedding_generic;
use crate::generic::linear as linear_generic;
use crate::kernel::embedding::{gather, scatter};
use crate::kernel::linear::launch;
use crate::packing::PackedX;
use crate::switches::fused_kernels_enabled;
use crate::{Float, Int};
use burn::tensor::backend::DeviceOps;
use burn_cubecl::cubecl::server::ComputeServer;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

/// Cube backends (wgpu, CUDA, ...) run the fused kernels.
impl<R, F, I, BT> RotationKernels for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    R::Server: ComputeServer,
    R::Device: DeviceOps,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn kernel_path() -> KernelPath {
        if fused_kernels_enabled() {
            KernelPath::Fused
        } else {
            KernelPath::Generic
        }
    }

    fn linear_step(
        y: Float<Self>,
        x: Float<Self>,
        w_j: Float<Self>,
        b_j: Option<Float<Self>>,
        window: Window,
        _packed: Option<&PackedX>,
        _checked: Checked,
    ) -> Float<Self> {
        match fused_kernels_enabled() {
            true => launch::forward(y, x, w_j, b_j, window),
            false => linear_generic::forward::<Self>(y, x, w_j, b_j, window),
        }
    }

    fn x_grad_step(
        acc: Option<Float<Self>>,
        w_j: Float<Self>,
        dy: Float<Self>,
        window: Window,
        _checked: Checked,
    ) -> Float<Self> {
        match fused_kernels_enabled() {
            true => launch::x_grad(acc, w_j, dy, window),
            false => linear_generic::x_grad::<Self>(acc, w_j, dy, window),
        }
    }

    fn weight_grad_step(
        x: Float<Self>,
        dy: Float<Self>,
        window: Window,
        with_bias: bool,
        _packed: Option<&PackedX>,
        _checked: Checked,
    ) -> (Float<Self>, Option<Float<Self>>) {
        match fused_kernels_enabled() {
            true => launch::weight_grad(x, dy, window, with_bias),
            false => linear_generic::weight_grad::<Self>(x, dy, window, with_bias),
        }
    }

    fn embedding_step(
        y: Float<Self>,
        w_j: Float<Self>,
        indices: Int<Self>,
        window: Window,
        _checked: Checked,
    ) -> Float<Self> {
        match fused_kernels_enabled() {
            true => gather::launch(y, w_j, indices, window),
            false => embedding_generic::forward::<Self>(y, w_j, indices, window),
        }
    }

    fn embedding_grad_step(
        n_embeddings: usize,
        dy: Float<Self>,
        indices: Int<Self>,
        window: Window,
        _checked: Checked,
    ) -> Float<Self> {
        match fused_kernels_enabled() {
            true => scatter::launch(n_embeddings, dy, indices, window),
            false => embedding_generic::grad::<Self>(n_embeddings, dy, indices, window),
        }
    }
}
