//! Ops that Burn's backend traits give a default body reach the inner backend through the
//! decorator: `gather_nd` and `scatter_nd` (which Burn's defaults refuse) forward and
//! backward, and `prod` on negative values (which Burn's default, `exp(sum(log x))`, turns
//! into NaN), on local tensors and on a parameter's shards, at N = 2, against the plain
//! backend: equal bits, since the same inner kernels run on the same values.

use burn::backend::{Autodiff, NdArray};
use burn::module::Param;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData, TensorPrimitive};
use burn_rtp::{launch, RotationKernels, Rtp, RtpConfig};

const VALUES: [f32; 12] = [
    -1.5, 2.0, -3.0, 4.0, 0.5, -0.25, 1.25, -2.0, 3.0, -1.0, 0.75, 2.5,
];

fn flat(t: TensorData) -> Vec<f32> {
    t.convert::<f32>().to_vec::<f32>().unwrap()
}

/// Products of local values and of a parameter's values, on the backend `B` itself (Burn's
/// autodiff composes `prod` from `exp(sum(log x))` above any backend, so the backend's own
/// op is what a user's inference code and Burn's conformance suite reach).
fn products<B: Backend>(device: &B::Device) -> Vec<Vec<f32>> {
    let data = Tensor::<B, 2>::from_data(TensorData::new(VALUES.to_vec(), [3, 4]), device);
    let weight = weight::<B>(device);
    vec![
        flat(data.clone().prod().into_data()),
        flat(data.clone().prod_dim(0).into_data()),
        flat(data.prod_dim(1).into_data()),
        flat(weight.clone().prod().into_data()),
        flat(weight.clone().prod_dim(0).into_data()),
        flat(weight.prod_dim(1).into_data()),
    ]
}

/// `gather_nd` and `scatter_nd` and their gradients, on the autodiff backend `B`.
fn nd_indexing<B: AutodiffBackend>(device: &B::Device) -> Vec<Vec<f32>> {
    let data = Tensor::<B, 2>::from_data(TensorData::new(VALUES.to_vec(), [3, 4]), device);
    let mut out = Vec::new();

    // gather_nd: rows (0, 1), (2, 3) and (1, 0) of the [3, 4] data, with their gradient.
    let x = data.clone().require_grad();
    let idx =
        Tensor::<B, 2, Int>::from_data(TensorData::new(vec![0i64, 1, 2, 3, 1, 0], [3, 2]), device);
    let gathered: Tensor<B, 1> = x.clone().gather_nd(idx.clone());
    let scale = Tensor::<B, 1>::from_data(TensorData::new(vec![1.0f32, -2.0, 3.0], [3]), device);
    let grads = (gathered.clone() * scale.clone()).sum().backward();
    out.push(flat(gathered.into_data()));
    out.push(flat(
        x.grad(&grads).expect("gather_nd's gradient").into_data(),
    ));

    // scatter_nd: three updates added at those positions, gradients for data and values.
    let x = data.require_grad();
    let v = scale.require_grad();
    let scattered = x.clone().scatter_nd(idx, v.clone(), IndexingUpdateOp::Add);
    let grads = (scattered.clone() * scattered.clone()).sum().backward();
    out.push(flat(scattered.into_data()));
    out.push(flat(
        x.grad(&grads)
            .expect("scatter_nd's data gradient")
            .into_data(),
    ));
    out.push(flat(
        v.grad(&grads)
            .expect("scatter_nd's values gradient")
            .into_data(),
    ));
    out
}

/// `VALUES` as a `[3, 4]` parameter: sharded by the decorator at `with_shard_threshold(0)`.
fn weight<B: Backend>(device: &B::Device) -> Tensor<B, 2> {
    Param::<Tensor<B, 2>>::from_data(TensorData::new(VALUES.to_vec(), [3, 4]), device).val()
}

fn matches_plain_backend<I: RotationKernels>()
where
    I::Device: Default,
{
    let device = I::Device::default();
    let mut want = products::<I>(&device);
    want.extend(nd_indexing::<Autodiff<I>>(&device));
    assert!(
        want[0][0] < 0.0 && want[0][0].is_finite(),
        "the product of the values is negative: {:?}",
        want[0]
    );
    let got = launch(RtpConfig::new(2).with_shard_threshold(0), |device| {
        let TensorPrimitive::Float(w) = weight::<Rtp<I>>(&device).into_primitive() else {
            unreachable!("a float parameter")
        };
        let layout = format!("{:?}", w.layout());
        assert!(layout.starts_with("Sharded"), "the parameter is {layout}");
        let mut got = products::<Rtp<I>>(&device);
        got.extend(nd_indexing::<Autodiff<Rtp<I>>>(&device));
        got
    })
    .expect("launch");
    for (rank, got) in got.iter().enumerate() {
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{}: rank {rank}, result {i}: {g:?} against the plain backend's {w:?}",
                std::any::type_name::<I>()
            );
        }
    }
}

#[test]
fn gather_scatter_nd_and_prod_reach_ndarray() {
    matches_plain_backend::<NdArray>();
}

#[cfg(feature = "flex")]
#[test]
fn gather_scatter_nd_and_prod_reach_flex() {
    matches_plain_backend::<burn::backend::Flex>();
}
