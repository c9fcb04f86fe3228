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

/// A step given a window its operands were not checked for must stop at the launch, not
/// write outside a buffer: code outside this crate can do this through a `Checked` its own
/// `RotationKernels` impl received (wgpu on lavapipe in CI).
#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use super::*;
    use burn::backend::wgpu::{Wgpu, WgpuDevice};
    use burn::tensor::{Int as IntKind, Tensor, TensorData};

    fn float(values: usize, shape: [usize; 2]) -> Float<Wgpu> {
        let data = TensorData::new(vec![0.5f32; values], shape);
        Tensor::<Wgpu, 2>::from_data(data, &WgpuDevice::default())
            .into_primitive()
            .tensor()
    }

    #[test]
    #[should_panic(expected = "do not hold it")]
    fn a_linear_window_past_the_output_stops_at_the_launch() {
        // Y has 6 columns; the window writes columns 5..13.
        let (y, x, w) = (float(12, [2, 6]), float(6, [2, 3]), float(24, [3, 8]));
        let _ = <Wgpu as RotationKernels>::linear_step(
            y,
            x,
            w,
            None,
            Window::new(5, 8),
            None,
            Checked::after_checks(),
        );
    }

    #[test]
    #[should_panic(expected = "not checked for")]
    fn an_embedding_window_past_the_output_stops_at_the_launch() {
        let device = WgpuDevice::default();
        let y = Tensor::<Wgpu, 3>::from_data(TensorData::new(vec![0f32; 8], [1, 2, 4]), &device)
            .into_primitive()
            .tensor();
        let table = float(15, [5, 3]);
        let indices: Int<Wgpu> =
            Tensor::<Wgpu, 2, IntKind>::from_data(TensorData::new(vec![1i32, 4], [1, 2]), &device)
                .into_primitive();
        // The output has 4 columns; the window is columns 3..6.
        let _ = <Wgpu as RotationKernels>::embedding_step(
            y,
            table,
            indices,
            Window::new(3, 3),
            Checked::after_checks(),
        );
    }
}
