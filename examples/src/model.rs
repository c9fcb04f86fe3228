//! A decoder-only GPT: token and position embeddings, pre-norm causal blocks, a final
//! LayerNorm and an LM head. Written once, generic over the backend.

use burn::config::Config;
use burn::module::Module;
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderAutoregressiveCache, TransformerEncoderConfig,
    TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// The shape of a GPT.
#[derive(Config, Debug, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size (256 for bytes).
    #[config(default = 256)]
    pub vocab: usize,
    /// Context length.
    pub seq: usize,
    /// Model width.
    pub d_model: usize,
    /// Number of transformer blocks.
    pub layers: usize,
    /// Attention heads per block.
    pub heads: usize,
    /// Use the token embedding, transposed, as the LM head (GPT-2's weight tying).
    #[config(default = false)]
    pub tie_embeddings: bool,
}

impl GptConfig {
    /// Builds the model on `device`; under RTP each rank creates only its shards.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Gpt<B> {
        Gpt {
            tok: EmbeddingConfig::new(self.vocab, self.d_model).init(device),
            pos: EmbeddingConfig::new(self.seq, self.d_model).init(device),
            blocks: TransformerEncoderConfig::new(
                self.d_model,
                4 * self.d_model,
                self.heads,
                self.layers,
            )
            .with_dropout(0.0)
            .with_norm_first(true)
            .init(device),
            norm: LayerNormConfig::new(self.d_model).init(device),
            head: (!self.tie_embeddings)
                .then(|| LinearConfig::new(self.d_model, self.vocab).init(device)),
        }
    }

    /// Which of the model's Linears route their activations under `routing` at `tokens`
    /// per rank (the mean over ranks) on `world` ranks, as every rank decides it: a line for
    /// the trainer's start.
    pub fn routing_summary(&self, routing: burn_rtp::Routing, world: usize, tokens: f64) -> String {
        let d = self.d_model;
        let mut linears = vec![
            ("attention", d, d),
            ("MLP in", d, 4 * d),
            ("MLP out", 4 * d, d),
        ];
        if !self.tie_embeddings {
            linears.push(("head", d, self.vocab));
        }
        let each: Vec<String> = linears
            .into_iter()
            .map(|(name, d_in, d_out)| {
                let way = match burn_rtp::plan::linear_routes(routing, world, tokens, d_in, d_out) {
                    (true, true) => "routes activations",
                    (false, false) => "rotates weights",
                    (true, false) => "routes activations forward, rotates weights backward",
                    (false, true) => "rotates weights forward, routes activations backward",
                };
                format!("{name} {way}")
            })
            .collect();
        format!(
            "Linears at {tokens:.0} tokens per rank ({routing} routing): {}",
            each.join(", ")
        )
    }

    /// Checks that the heads divide the width.
    pub fn validate(&self) -> Result<(), String> {
        if self.heads == 0 || !self.d_model.is_multiple_of(self.heads) {
            return Err(format!(
                "--heads {} must divide --d-model {}",
                self.heads, self.d_model
            ));
        }
        if self.seq == 0 || self.layers == 0 {
            return Err("--seq and --layers must be positive".into());
        }
        Ok(())
    }
}

/// The GPT model.
#[derive(Module, Debug)]
pub struct Gpt<B: Backend> {
    tok: Embedding<B>,
    pos: Embedding<B>,
    blocks: TransformerEncoder<B>,
    norm: LayerNorm<B>,
    /// `None` when the head is the token embedding (tied).
    head: Option<Linear<B>>,
}

/// What a decode keeps between tokens: each block's cache (Burn's autoregressive cache, which
/// computes a block's Linears, norms and feed-forward for the newest position only) and the
/// embedded positions so far.
pub struct GptCache<B: Backend> {
    blocks: TransformerEncoderAutoregressiveCache<B>,
    x: Option<Tensor<B, 3>>,
    len: usize,
}

impl<B: Backend> GptCache<B> {
    /// Positions the cache holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no position yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<B: Backend> Gpt<B> {
    /// Token plus position embeddings of `tokens` `[batch, n]` at positions `start..start+n`.
    fn embed(&self, tokens: Tensor<B, 2, Int>, start: usize) -> Tensor<B, 3> {
        let device = tokens.device();
        let [batch, n] = tokens.dims();
        let positions = Tensor::<B, 1, Int>::arange(start as i64..(start + n) as i64, &device)
            .reshape([1, n])
            .repeat_dim(0, batch);
        self.tok.forward(tokens) + self.pos.forward(positions)
    }

    /// The final norm and the LM head.
    fn head(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        let h = self.norm.forward(h);
        match &self.head {
            Some(head) => head.forward(h),
            // Tied: logits = h Eᵀ with the token embedding E [vocab, d_model].
            None => burn::tensor::module::linear(h, self.tok.weight.val().transpose(), None),
        }
    }

    /// Next-byte logits `[batch, seq, vocab]` for `tokens` `[batch, seq]`.
    pub fn logits(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let device = tokens.device();
        let [batch, seq] = tokens.dims();
        let x = self.embed(tokens, 0);
        let mask = generate_autoregressive_mask::<B>(batch, seq, &device);
        let h = self
            .blocks
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        self.head(h)
    }

    /// An empty decode cache.
    pub fn new_cache(&self) -> GptCache<B> {
        GptCache {
            blocks: self.blocks.new_autoregressive_cache(),
            x: None,
            len: 0,
        }
    }

    /// Next-byte logits `[batch, vocab]` after `tokens` `[batch, n]`, the tokens that follow
    /// those `cache` holds, which it then holds too. An empty cache takes a whole prompt in
    /// one pass; after that, one token a call (Burn's block cache computes the newest
    /// position only). The caller keeps the positions within the model's context.
    ///
    /// # Panics
    /// If a non-empty cache is given more than one token, or the positions would pass the
    /// model's context.
    pub fn logits_cached(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: &mut GptCache<B>,
    ) -> Tensor<B, 2> {
        let [batch, n] = tokens.dims();
        assert!(
            cache.is_empty() || n == 1,
            "logits_cached: a cache holding {} positions takes one token a call, got {n}",
            cache.len
        );
        let context = self.pos.weight.dims()[0];
        assert!(
            cache.len + n <= context,
            "logits_cached: {} cached positions and {n} new ones pass the context of {context}",
            cache.len
        );
        let device = tokens.device();
        let x_new = self.embed(tokens, cache.len);
        let x = match cache.x.take() {
            Some(x) => Tensor::cat(vec![x, x_new], 1),
            None => x_new,
        };
        let total = cache.len + n;
        let mask = generate_autoregressive_mask::<B>(batch, total, &device);
        let h = self.blocks.forward_autoregressive_inference(
            TransformerEncoderInput::new(x.clone()).mask_attn(mask),
            &mut cache.blocks,
        );
        cache.x = Some(x);
        cache.len = total;
        let d_model = h.dims()[2];
        let last = h.slice([0..batch, total - 1..total, 0..d_model]);
        let logits = self.head(last);
        let vocab = logits.dims()[2];
        logits.reshape([batch, vocab])
    }

    /// Mean cross-entropy (nats per byte) of predicting `targets` from `tokens`.
    pub fn loss(&self, tokens: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let logits = self.logits(tokens);
        let [b, s, v] = logits.dims();
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.reshape([b * s, v]), targets.reshape([b * s]))
    }
}
