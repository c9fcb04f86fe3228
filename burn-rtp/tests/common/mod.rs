//! Test models and a reference trainer shared by the integration tests.
#![allow(dead_code)]

use burn::backend::autodiff::checkpoint::strategy::{CheckpointStrategy, NoCheckpointing};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{
    Embedding, EmbeddingConfig, Gelu, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use burn_rtp::{RotationKernels, Rtp, RtpConfig, RtpOptimizer, RtpResult};

pub const VOCAB: usize = 67;
pub const D_MODEL: usize = 36;
pub const D_FF: usize = 100;
pub const HEADS: usize = 4;
pub const SEQ: usize = 8;
pub const GLOBAL_BATCH: usize = 24;
pub const STEPS: usize = 20;
pub const LR: f64 = 1e-2;
/// Seed of the initial weights of the equivalence tests.
pub const SEED: u64 = 7;

/// A two-layer perceptron classifier.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub fc1: Linear<B>,
    pub fc2: Linear<B>,
    pub act: Gelu,
}

impl<B: Backend> Mlp<B> {
    pub fn new(device: &B::Device) -> Self {
        Self {
            fc1: LinearConfig::new(D_MODEL, D_FF).init(device),
            fc2: LinearConfig::new(D_FF, VOCAB).init(device),
            act: Gelu::new(),
        }
    }

    pub fn loss(&self, x: Tensor<B, 2>, y: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        let logits = self.fc2.forward(self.act.forward(self.fc1.forward(x)));
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, y)
    }
}

/// A small causal language model built only from `burn::nn`.
#[derive(Module, Debug)]
pub struct TinyLm<B: Backend> {
    pub tok: Embedding<B>,
    pub pos: Embedding<B>,
    pub encoder: TransformerEncoder<B>,
    pub norm: LayerNorm<B>,
    pub head: Linear<B>,
}

impl<B: Backend> TinyLm<B> {
    pub fn new(device: &B::Device) -> Self {
        Self::sized(D_MODEL, D_FF, 1, device)
    }

    pub fn sized(d_model: usize, d_ff: usize, layers: usize, device: &B::Device) -> Self {
        Self {
            tok: EmbeddingConfig::new(VOCAB, d_model).init(device),
            pos: EmbeddingConfig::new(SEQ, d_model).init(device),
            encoder: TransformerEncoderConfig::new(d_model, d_ff, HEADS, layers)
                .with_dropout(0.0)
                .with_norm_first(true)
                .init(device),
            norm: LayerNormConfig::new(d_model).init(device),
            head: LinearConfig::new(d_model, VOCAB).init(device),
        }
    }

    pub fn loss(&self, tokens: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let device = tokens.device();
        let [batch, seq] = tokens.dims();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let x = self.tok.forward(tokens) + self.pos.forward(positions);
        let mask = generate_autoregressive_mask::<B>(batch, seq, &device);
        let h = self
            .encoder
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        let logits = self.head.forward(self.norm.forward(h));
        let d = logits.dims()[2];
        CrossEntropyLossConfig::new().init(&device).forward(
            logits.reshape([batch * seq, d]),
            targets.reshape([batch * seq]),
        )
    }
}

/// Deterministic data: rows `[from, to)` of the global batch.
pub struct Data {
    pub x: Vec<f32>,
    pub labels: Vec<i64>,
    pub tokens: Vec<i64>,
    pub targets: Vec<i64>,
}

pub fn data(step: usize) -> Data {
    let mut s = 0x2545_F491_4F6C_DD1Du64 ^ (step as u64).wrapping_mul(0x9E37_79B9);
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let x = (0..GLOBAL_BATCH * D_MODEL)
        .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let labels = (0..GLOBAL_BATCH)
        .map(|_| (next() % VOCAB as u64) as i64)
        .collect();
    let stream: Vec<i64> = (0..GLOBAL_BATCH * (SEQ + 1))
        .map(|_| (next() % VOCAB as u64) as i64)
        .collect();
    let mut tokens = Vec::new();
    let mut targets = Vec::new();
    for row in 0..GLOBAL_BATCH {
        let base = row * (SEQ + 1);
        tokens.extend_from_slice(&stream[base..base + SEQ]);
        targets.extend_from_slice(&stream[base + 1..base + SEQ + 1]);
    }
    Data {
        x,
        labels,
        tokens,
        targets,
    }
}

/// Which model a run trains.
#[derive(Clone, Copy, Debug)]
pub enum Which {
    Mlp,
    Lm,
}

/// The rows of the global batch that rank `rank` of `world` trains on.
pub fn rows(rank: usize, world: usize) -> std::ops::Range<usize> {
    let per = GLOBAL_BATCH / world;
    rank * per..(rank + 1) * per
}

/// Rows `r` of step `step`'s global batch for the MLPs: inputs and labels.
pub fn mlp_batch<B: Backend>(
    step: usize,
    r: std::ops::Range<usize>,
    d: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let data = data(step);
    let n = r.len();
    let x = Tensor::<B, 2>::from_data(
        TensorData::new(
            data.x[r.start * D_MODEL..r.end * D_MODEL].to_vec(),
            [n, D_MODEL],
        ),
        d,
    );
    let y = Tensor::<B, 1, Int>::from_data(TensorData::new(data.labels[r].to_vec(), [n]), d);
    (x, y)
}

pub fn step_loss_mlp<B: Backend>(
    m: &Mlp<B>,
    step: usize,
    r: std::ops::Range<usize>,
    d: &B::Device,
) -> Tensor<B, 1> {
    let (x, y) = mlp_batch::<B>(step, r, d);
    m.loss(x, y)
}

pub fn step_loss_lm<B: Backend>(
    m: &TinyLm<B>,
    step: usize,
    r: std::ops::Range<usize>,
    d: &B::Device,
) -> Tensor<B, 1> {
    let data = data(step);
    let n = r.len();
    let tokens = Tensor::<B, 2, Int>::from_data(
        TensorData::new(data.tokens[r.start * SEQ..r.end * SEQ].to_vec(), [n, SEQ]),
        d,
    );
    let targets = Tensor::<B, 2, Int>::from_data(
        TensorData::new(data.targets[r.start * SEQ..r.end * SEQ].to_vec(), [n, SEQ]),
        d,
    );
    m.loss(tokens, targets)
}

pub fn adam() -> AdamConfig {
    AdamConfig::new().with_weight_decay(Some(WeightDecayConfig::new(0.01)))
}

/// Every float parameter's values, in visit order (gathers shards: call on every rank).
pub fn param_values<B: Backend, M: Module<B>>(m: &M) -> Vec<Vec<f32>> {
    struct Collect(Vec<Vec<f32>>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(
                param
                    .val()
                    .into_data()
                    .convert::<f32>()
                    .to_vec::<f32>()
                    .unwrap(),
            );
        }
    }
    let mut c = Collect(Vec::new());
    m.visit(&mut c);
    c.0
}

/// Trains `model` for `steps` steps on `rows` and returns the per-step losses.
pub fn train<B, M, O>(
    mut model: M,
    mut optim: O,
    which: Which,
    steps: usize,
    rows: std::ops::Range<usize>,
    device: &B::Device,
    loss_fn: impl Fn(&M, usize, std::ops::Range<usize>, &B::Device) -> Tensor<B, 1>,
) -> (M, Vec<f32>)
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let _ = which;
    let mut losses = Vec::new();
    for step in 0..steps {
        let loss = loss_fn(&model, step, rows.clone(), device);
        losses.push(loss.clone().into_scalar().elem_f32());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(LR, model, grads);
    }
    (model, losses)
}

trait ElemF32 {
    fn elem_f32(self) -> f32;
}
impl<E: burn::tensor::ElementConversion> ElemF32 for E {
    fn elem_f32(self) -> f32 {
        self.elem::<f32>()
    }
}

/// A model's weights as bytes, for loading the same weights on another backend.
pub fn to_bytes<B: Backend, M: Module<B>>(m: M) -> Vec<u8> {
    BinBytesRecorder::<FullPrecisionSettings>::default()
        .record(m.into_record(), ())
        .expect("recording weights")
}

/// Loads weights saved by [`to_bytes`] into `m` (on any backend).
pub fn load_bytes<B: Backend, M: Module<B>>(m: M, bytes: &[u8], device: &B::Device) -> M {
    let record = BinBytesRecorder::<FullPrecisionSettings>::default()
        .load(bytes.to_vec(), device)
        .expect("loading weights");
    m.load_record(record)
}

pub fn rel_close(a: f32, b: f32, tol: f32) -> bool {
    (a - b).abs() <= tol * a.abs().max(b.abs()).max(1e-6)
}

/// The largest parameter difference between `runs` and single-device training, as a share of
/// the tolerance (1.0 is the limit of [`compare`]).
pub fn worst_share_of_tolerance(ref_params: &[Vec<f32>], runs: &[RankRun]) -> f32 {
    let mut worst = 0f32;
    for (_, params) in runs {
        for (got, want) in params.iter().zip(ref_params) {
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
            for (g, w) in got.iter().zip(want) {
                worst = worst.max((g - w).abs() / (TOL * scale));
            }
        }
    }
    worst
}

/// Tolerance of the comparison with single-device training (relative to each parameter's
/// largest magnitude).
pub const TOL: f32 = 1e-4;

/// Per-step losses and final parameter values of one rank.
pub type RankRun = (Vec<f32>, Vec<Vec<f32>>);

/// Checks every rank's run against single-device training: the mean per-step loss, then
/// every element of every parameter. Returns the first difference.
pub fn compare(
    which: Which,
    ref_losses: &[f32],
    ref_params: &[Vec<f32>],
    runs: &[RankRun],
    label: &str,
) -> Result<(), String> {
    let world = runs.len();
    for step in 0..ref_losses.len() {
        let mean = runs.iter().map(|(l, _)| l[step]).sum::<f32>() / world as f32;
        if !rel_close(mean, ref_losses[step], TOL) {
            return Err(format!(
                "{label} {which:?}: step {step} loss {mean} vs single-device {}",
                ref_losses[step]
            ));
        }
    }
    for (rank, (_, params)) in runs.iter().enumerate() {
        if params.len() != ref_params.len() {
            return Err(format!("{label}: parameter count"));
        }
        for (i, (got, want)) in params.iter().zip(ref_params).enumerate() {
            if got.len() != want.len() {
                return Err(format!("{label}: parameter {i} size"));
            }
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
            for (k, (g, w)) in got.iter().zip(want).enumerate() {
                if (g - w).abs() > TOL * scale {
                    return Err(format!(
                        "{label} {which:?} rank {rank}: parameter {i} element {k}: {g} vs {w}"
                    ));
                }
            }
        }
    }
    Ok(())
}

type RefB = burn::backend::Autodiff<burn::backend::NdArray>;
type DistB = burn::backend::Autodiff<Rtp<burn::backend::NdArray>>;

/// Replaces every randomly initialised parameter with values drawn from `seed`: uniform in
/// ±1/sqrt(fan-in) for matrices (Burn's Kaiming scale) and ±0.1 for vectors; constant
/// parameters (LayerNorm's ones and zeros) stay. Burn's own generator is seeded from OS
/// entropy and shared by the tests that run at once, so without this every run trains
/// different weights.
pub fn seeded<B: Backend, M: Module<B>>(module: M, seed: u64) -> M {
    struct Seeded {
        state: u64,
    }
    impl Seeded {
        fn next(&mut self) -> f32 {
            self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }
    impl<B: Backend> ModuleMapper<B> for Seeded {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let device = tensor.device();
            let shape = tensor.shape();
            let values = tensor.into_data().convert::<f32>().to_vec::<f32>().unwrap();
            let constant = values.iter().all(|v| *v == values[0]);
            let values = if constant {
                values
            } else {
                let scale = if D >= 2 {
                    1.0 / (shape[0] as f32).sqrt()
                } else {
                    0.1
                };
                values.iter().map(|_| self.next() * scale).collect()
            };
            let t = Tensor::from_data(TensorData::new(values, shape), &device);
            Param::from_mapped_value(id, t, mapper)
        }
    }
    module.map(&mut Seeded {
        state: seed ^ 0x5EED_5EED,
    })
}

/// Initial weights of the MLP drawn from `seed`, as bytes any backend loads.
pub fn mlp_weights(seed: u64) -> Vec<u8> {
    to_bytes(seeded(Mlp::<RefB>::new(&Default::default()), seed))
}

/// Initial weights of the language model drawn from `seed`, as bytes any backend loads.
pub fn lm_weights(seed: u64) -> Vec<u8> {
    to_bytes(seeded(TinyLm::<RefB>::new(&Default::default()), seed))
}

/// Single-device training of the MLP from `weights`: per-step losses and final parameters.
pub fn reference_mlp(weights: &[u8]) -> RankRun {
    reference_mlp_split(weights, 1)
}

/// Single-device training of the MLP whose loss is the mean of the mean losses of `blocks`
/// row blocks: the same mathematics as [`reference_mlp`], rounded the way data parallelism
/// rounds. Comparing the two measures how far rounding alone moves training.
pub fn reference_mlp_split(weights: &[u8], blocks: usize) -> RankRun {
    reference_mlp_on::<RefB>(weights, blocks)
}

/// [`reference_mlp_split`] on the single-device autodiff backend `B` (its checkpointing
/// strategy is the point).
pub fn reference_mlp_on<B: AutodiffBackend>(weights: &[u8], blocks: usize) -> RankRun {
    let device = Default::default();
    let mut model = load_bytes(Mlp::<B>::new(&device), weights, &device);
    let mut optim = adam().init();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let loss = (0..blocks)
            .map(|b| step_loss_mlp(&model, step, rows(b, blocks), &device))
            .reduce(|a, b| a + b)
            .expect("at least one block");
        let loss = if blocks == 1 {
            loss
        } else {
            loss / blocks as f32
        };
        losses.push(loss.clone().into_scalar().elem_f32());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(LR, model, grads);
    }
    (losses, param_values(&model))
}

/// Distributed training of the MLP from `weights` under `config`, every rank's run.
pub fn rtp_mlp(config: RtpConfig, weights: &[u8]) -> RtpResult<Vec<RankRun>> {
    rtp_run_on::<burn::backend::NdArray>(Which::Mlp, config, weights)
}

/// Single-device training of the tiny LM from `weights`: losses and final parameters.
pub fn reference_lm(weights: &[u8]) -> RankRun {
    reference_lm_on::<RefB>(weights)
}

/// [`reference_lm`] on the single-device autodiff backend `B`.
pub fn reference_lm_on<B: AutodiffBackend>(weights: &[u8]) -> RankRun {
    let device = Default::default();
    let reference = load_bytes(TinyLm::<B>::new(&device), weights, &device);
    let (trained, losses) = train(
        reference,
        adam().init(),
        Which::Lm,
        STEPS,
        0..GLOBAL_BATCH,
        &device,
        step_loss_lm,
    );
    (losses, param_values(&trained))
}

/// Distributed training of the MLP or the tiny LM from `weights` under `config`, on the
/// inner backend `I`: every rank's run.
pub fn rtp_run_on<I: RotationKernels>(
    which: Which,
    config: RtpConfig,
    weights: &[u8],
) -> RtpResult<Vec<RankRun>> {
    Ok(rtp_run_counting::<I>(which, config, weights)?
        .into_iter()
        .map(|(run, _)| run)
        .collect())
}

/// [`rtp_run_on`], with the steps each rank's thread ran on burn-rtp-kernels' own kernels
/// (a per-thread count, which tests running beside it cannot move).
pub fn rtp_run_counting<I: RotationKernels>(
    which: Which,
    config: RtpConfig,
    weights: &[u8],
) -> RtpResult<Vec<(RankRun, u64)>> {
    Ok(
        rtp_run_checkpointed::<I, NoCheckpointing>(which, config, weights)?
            .into_iter()
            .map(|r| (r.run, r.launches))
            .collect(),
    )
}

/// One rank's run with what it counted.
pub struct Counted {
    /// Losses and final parameters.
    pub run: RankRun,
    /// Steps run on burn-rtp-kernels' own kernels.
    pub launches: u64,
    /// Exchanges with other ranks over the whole run.
    pub exchanges: u64,
    /// Bytes of tensor data this rank's messages carried over the whole run.
    pub message_bytes: u64,
    /// What DDP's gradient buckets did over the whole run.
    pub buckets: burn_rtp::DdpBuckets,
    /// What FSDP's prefetch did over the whole run.
    pub prefetches: burn_rtp::FsdpPrefetches,
}

/// Distributed training on `Autodiff<Rtp<I>, C>`: autodiff's checkpointing strategy `C`
/// (`BalancedCheckpointing` recomputes memory-bound ops in the backward pass).
pub fn rtp_run_checkpointed<I: RotationKernels, C: CheckpointStrategy>(
    which: Which,
    config: RtpConfig,
    weights: &[u8],
) -> RtpResult<Vec<Counted>> {
    rtp_run_checkpointed_on::<I, C>(which, config, weights, |_| Default::default())
}

/// Like [`rtp_run_checkpointed`], with rank `r`'s inner device `inner_device(r)`.
pub fn rtp_run_checkpointed_on<I: RotationKernels, C: CheckpointStrategy>(
    which: Which,
    config: RtpConfig,
    weights: &[u8],
    inner_device: impl Fn(usize) -> I::Device,
) -> RtpResult<Vec<Counted>> {
    type Dist<I, C> = burn::backend::Autodiff<Rtp<I>, C>;
    let world = config.world_size;
    burn_rtp::try_launch_on(config, inner_device, |device| {
        let before = burn_rtp_kernels::fused_launches_on_this_thread();
        let exchanges = device.exchanges();
        let message_bytes = device.message_bytes();
        let rows = rows(device.rank(), world);
        let run = match which {
            Which::Mlp => {
                let model = load_bytes(Mlp::<Dist<I, C>>::new(&device), weights, &device);
                let optim = RtpOptimizer::new(adam().init());
                let (model, losses) =
                    train(model, optim, which, STEPS, rows, &device, step_loss_mlp);
                (losses, param_values(&model))
            }
            Which::Lm => {
                let model = load_bytes(TinyLm::<Dist<I, C>>::new(&device), weights, &device);
                let optim = RtpOptimizer::new(adam().init());
                let (model, losses) =
                    train(model, optim, which, STEPS, rows, &device, step_loss_lm);
                (losses, param_values(&model))
            }
        };
        Ok::<_, std::convert::Infallible>(Counted {
            run,
            launches: burn_rtp_kernels::fused_launches_on_this_thread() - before,
            exchanges: device.exchanges() - exchanges,
            message_bytes: device.message_bytes() - message_bytes,
            buckets: device.ddp_buckets(),
            prefetches: device.fsdp_prefetches(),
        })
    })
}

/// RTP on `Autodiff<Rtp<I>>` (a cube backend: the fused kernels) at `n` ranks against
/// single-device `Autodiff<NdArray>`, for the MLP and the language model; fails if no fused
/// kernel launched.
pub fn fused_matches_single_device<I: RotationKernels>(n: usize) {
    fused_matches_single_device_on::<I>(n, |_| Default::default());
}

/// Like [`fused_matches_single_device`], with rank `r` on the inner device `inner_device(r)`.
pub fn fused_matches_single_device_on<I: RotationKernels>(
    n: usize,
    inner_device: impl Fn(usize) -> I::Device + Copy,
) {
    use burn_rtp::KernelPath;
    assert_eq!(
        I::kernel_path(),
        KernelPath::Fused,
        "{} runs no fused kernels",
        std::any::type_name::<I>()
    );
    let config = || RtpConfig::new(n).with_shard_threshold(0);
    for which in [Which::Mlp, Which::Lm] {
        let label = format!("{which:?} on {} at N={n}", std::any::type_name::<I>());
        let (weights, (ref_losses, ref_params)) = match which {
            Which::Mlp => {
                let w = mlp_weights(SEED);
                let r = reference_mlp(&w);
                (w, r)
            }
            Which::Lm => {
                let w = lm_weights(SEED);
                let r = reference_lm(&w);
                (w, r)
            }
        };
        let counted =
            rtp_run_checkpointed_on::<I, NoCheckpointing>(which, config(), &weights, inner_device)
                .expect("RTP run");
        for (rank, c) in counted.iter().enumerate() {
            assert!(
                c.launches > 0,
                "{label}: rank {rank} launched no fused kernel"
            );
        }
        let runs: Vec<RankRun> = counted.into_iter().map(|c| c.run).collect();
        if let Err(e) = compare(which, &ref_losses, &ref_params, &runs, &label) {
            panic!("{e}");
        }
    }
}
