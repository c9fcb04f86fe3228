//! Trains a small byte-level GPT with Rotated Tensor Parallelism on in-process CPU ranks and
//! prints what each rank holds against what one device would hold.
//!
//! `cargo run --release --example gpt -- --help`

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_rtp::{human_bytes, launch, MemoryStats, RotationMode, Rtp, RtpConfig, RtpOptimizer};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

const CORPUS: &str = include_str!("data/tiny.txt");
const VOCAB: usize = 256;

/// Command line of the example.
#[derive(Parser, Debug, Clone)]
#[command(about = "Train a byte-level GPT with Rotated Tensor Parallelism on CPU ranks")]
struct Args {
    /// Number of in-process ranks.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Rotation variant: out-of-place or in-place.
    #[arg(long, default_value = "out-of-place")]
    rotation: RotationMode,
    /// Training steps.
    #[arg(long, default_value_t = 150)]
    steps: usize,
    /// Sequences per rank per step.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Sequence length in bytes.
    #[arg(long, default_value_t = 32)]
    seq: usize,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    d_model: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
}

/// A decoder-only GPT built from `burn::nn` modules.
#[derive(Module, Debug)]
struct Gpt<B: Backend> {
    tok: Embedding<B>,
    pos: Embedding<B>,
    blocks: TransformerEncoder<B>,
    norm: LayerNorm<B>,
    head: Linear<B>,
}

impl<B: Backend> Gpt<B> {
    fn new(args: &Args, device: &B::Device) -> Self {
        Self {
            tok: EmbeddingConfig::new(VOCAB, args.d_model).init(device),
            pos: EmbeddingConfig::new(args.seq, args.d_model).init(device),
            blocks: TransformerEncoderConfig::new(
                args.d_model,
                4 * args.d_model,
                args.heads,
                args.layers,
            )
            .with_dropout(0.0)
            .with_norm_first(true)
            .init(device),
            norm: LayerNormConfig::new(args.d_model).init(device),
            head: LinearConfig::new(args.d_model, VOCAB).init(device),
        }
    }

    fn logits(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let device = tokens.device();
        let [batch, seq] = tokens.dims();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let x = self.tok.forward(tokens) + self.pos.forward(positions);
        let mask = generate_autoregressive_mask::<B>(batch, seq, &device);
        let h = self
            .blocks
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        self.head.forward(self.norm.forward(h))
    }

    fn loss(&self, tokens: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let logits = self.logits(tokens);
        let [b, s, v] = logits.dims();
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.reshape([b * s, v]), targets.reshape([b * s]))
    }
}

/// A batch of `batch` windows of the corpus for this rank and step.
fn batch<B: Backend>(
    args: &Args,
    rank: usize,
    step: usize,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let bytes = CORPUS.as_bytes();
    let span = bytes.len() - args.seq - 1;
    let mut tokens = Vec::with_capacity(args.batch * args.seq);
    let mut targets = Vec::with_capacity(args.batch * args.seq);
    for i in 0..args.batch {
        let k = (step * args.ranks + rank) * args.batch + i;
        let start = (k.wrapping_mul(7919)) % span;
        tokens.extend(bytes[start..start + args.seq].iter().map(|&b| b as i64));
        targets.extend(
            bytes[start + 1..start + args.seq + 1]
                .iter()
                .map(|&b| b as i64),
        );
    }
    let shape = [args.batch, args.seq];
    (
        Tensor::from_data(TensorData::new(tokens, shape), device),
        Tensor::from_data(TensorData::new(targets, shape), device),
    )
}

type B = Autodiff<Rtp<NdArray>>;

fn main() {
    let args = Args::parse();
    println!(
        "Training a byte-level GPT (d_model {}, {} layers) with RTP ({}) on {} in-process CPU ranks, {} steps",
        args.d_model, args.layers, args.rotation, args.ranks, args.steps
    );
    let config = RtpConfig::new(args.ranks).with_rotation(args.rotation);
    let results = launch(config, |device| {
        device.reset_memory_peak();
        let mut model = Gpt::<B>::new(&args, &device);
        let mut optim = RtpOptimizer::new(AdamConfig::new().init());
        let progress = (device.rank() == 0).then(|| {
            let bar = ProgressBar::new(args.steps as u64);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} steps  {msg}  [{elapsed_precise}]",
                )
                .expect("valid template"),
            );
            bar
        });
        let mut first = f32::NAN;
        let mut last = f32::NAN;
        for step in 0..args.steps {
            let (tokens, targets) = batch::<B>(&args, device.rank(), step, &device);
            let loss = model.loss(tokens, targets);
            let value = loss.clone().into_scalar();
            if step == 0 {
                first = value;
            }
            last = value;
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(args.lr, model, grads);
            if let Some(bar) = &progress {
                bar.set_message(format!("loss {value:.3} nats/byte"));
                bar.inc(1);
            }
        }
        if let Some(bar) = progress {
            bar.finish();
        }
        (
            device.rank(),
            first,
            last,
            model.num_params(),
            device.memory_peak(),
        )
    })
    .unwrap_or_else(|e| {
        eprintln!("training failed: {e}");
        std::process::exit(1);
    });
    report(&args, &results);
}

fn report(args: &Args, results: &[(usize, f32, f32, usize, MemoryStats)]) {
    let params = results[0].3;
    // fp32 parameters, gradients and Adam's two moments on one device.
    let single = (params * 4 * 4) as u64;
    let ideal = single / args.ranks as u64;
    println!(
        "\nloss (rank 0's batch): {:.3} -> {:.3} nats/byte; model: {params} parameters",
        results[0].1, results[0].2
    );
    println!(
        "model state on one device (params + grads + Adam): {}",
        human_bytes(single)
    );
    println!(
        "\n{:>4}  {:>12}  {:>12}  {:>8}  {:>12}  {:>12}",
        "rank", "model state", "ideal 1/N", "ratio", "in flight", "activations"
    );
    for (rank, _, _, _, peak) in results {
        println!(
            "{:>4}  {:>12}  {:>12}  {:>7.3}x  {:>12}  {:>12}",
            rank,
            human_bytes(peak.sharded),
            human_bytes(ideal),
            peak.sharded as f64 / ideal as f64,
            human_bytes(peak.in_flight),
            human_bytes(peak.local),
        );
    }
}
