//! The whole user story in one file: an ordinary Burn MLP trained on 3 ranks with RTP, each
//! rank holding a third of every weight and of Adam's state, checked against the same
//! training on one device. Run: `cargo run --release --example minimal`.

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::{Gelu, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use burn_rtp::{human_bytes, launch, Rtp, RtpConfig, RtpOptimizer};

const RANKS: usize = 3;
const ROWS: usize = 12; // the global batch; rank r trains on rows r*4..r*4+4
const STEPS: usize = 10;

/// An ordinary Burn model: nothing in it knows about ranks. (50 is not a multiple of 3.)
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    act: Gelu,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        let (fc1, fc2) = (LinearConfig::new(20, 50), LinearConfig::new(50, 10));
        let act = Gelu::new();
        Self {
            fc1: fc1.init(device),
            fc2: fc2.init(device),
            act,
        }
    }

    /// Mean squared error on `rows` of step `step`'s batch (a fixed synthetic regression).
    fn loss(&self, step: usize, rows: std::ops::Range<usize>, device: &B::Device) -> Tensor<B, 1> {
        let value = |i: usize, j: usize| ((i * 31 + j * 7 + step * 13) % 17) as f32 / 17.0 - 0.5;
        let batch = |width: usize| {
            let v: Vec<f32> = rows
                .clone()
                .flat_map(|i| (0..width).map(move |j| value(i, j)))
                .collect();
            Tensor::<B, 2>::from_data(TensorData::new(v, [rows.len(), width]), device)
        };
        let (x, y) = (batch(20), batch(10));
        let out = self.fc2.forward(self.act.forward(self.fc1.forward(x)));
        (out - y).powf_scalar(2.0).mean()
    }
}

/// `Mlp` with the weights saved in `bytes` (an RTP model keeps only this rank's slice).
fn load<B: Backend>(bytes: &[u8], device: &B::Device) -> Mlp<B> {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    Mlp::new(device).load_record(recorder.load(bytes.to_vec(), device).unwrap())
}

/// The training loop, the same for one device and for every rank.
fn train<B: AutodiffBackend>(
    mut model: Mlp<B>,
    mut optim: impl Optimizer<Mlp<B>, B>,
    rows: std::ops::Range<usize>,
    device: &B::Device,
) -> Vec<f32> {
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let loss = model.loss(step, rows.clone(), device);
        losses.push(loss.clone().into_scalar().elem::<f32>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
    }
    losses
}

fn main() -> Result<(), burn_rtp::RtpError> {
    type Single = Autodiff<NdArray>;
    let device = Default::default();
    // Both runs start from these bytes. (Burn initialises parameters lazily: a clone of a fresh
    // model would draw weights of its own.)
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let weights = recorder
        .record(Mlp::<Single>::new(&device).into_record(), ())
        .unwrap();
    let reference = train(
        load::<Single>(&weights, &device),
        AdamConfig::new().init(),
        0..ROWS,
        &device,
    );

    type Dist = Autodiff<Rtp<NdArray>>; // the only change to the model's type
    let per_rank = launch(RtpConfig::new(RANKS).with_shard_threshold(0), |device| {
        let rows = device.rank() * ROWS / RANKS..(device.rank() + 1) * ROWS / RANKS;
        let optim = RtpOptimizer::new(AdamConfig::new().init()); // the one extra line
        let losses = train(load::<Dist>(&weights, &device), optim, rows, &device);
        (losses, device.memory_peak().sharded)
    })?;

    for (step, want) in reference.iter().enumerate() {
        let got = per_rank.iter().map(|(l, _)| l[step]).sum::<f32>() / RANKS as f32;
        println!("step {step:2}: loss {got:.6} on {RANKS} ranks, {want:.6} on one device");
        assert!(
            (got - want).abs() <= 1e-4 * want.abs(),
            "step {step}: {got} vs {want}"
        );
    }
    let state: Vec<String> = per_rank.iter().map(|(_, b)| human_bytes(*b)).collect();
    println!(
        "model state per rank (weights, gradients, Adam): {}",
        state.join(", ")
    );
    Ok(())
}
