//! Byte generation with a KV cache: the prompt fills the cache in one pass, then each new
//! byte runs every block's Linears, norms and feed-forward on its own position only (the
//! attention still scores it against every cached position). Under `Rtp` with
//! `Routing::Auto` a decode step has one row per rank, so every Linear routes its activations
//! to the shards' owners and no Linear weight moves per token (the embeddings still rotate).
//! After a prompt or refill whose rows make `Auto` rotate, up to 32 Linear forwards may still
//! rotate, deciding from those rows before the ranks agree again.
//!
//! The model's context is fixed (its position embedding): when the cache is full, the newest
//! half of the window is kept and fills a fresh cache, so a long generation re-reads half a
//! context once every half context of bytes.

use crate::model::{Gpt, GptCache};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// Samples bytes from logits at a temperature, with a seeded xorshift generator: the same
/// seed gives the same choices on every rank and every backend that gives the same logits.
pub struct Sampler {
    state: u64,
    temperature: f32,
}

impl Sampler {
    /// A sampler at `temperature` (> 0) seeded by `seed`.
    pub fn new(seed: u64, temperature: f32) -> Self {
        Self {
            state: seed | 1,
            temperature,
        }
    }

    /// Draws one index from `softmax(logits / temperature)`, `logits` `[vocab]`.
    pub fn pick<B: Backend>(&mut self, logits: Tensor<B, 1>) -> usize {
        let vocab = logits.dims()[0];
        let probs = softmax(logits / self.temperature, 0)
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .expect("f32 probabilities");
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let mut u = (self.state >> 11) as f32 / (1u64 << 53) as f32;
        for (i, p) in probs.iter().enumerate() {
            if u < *p {
                return i;
            }
            u -= p;
        }
        vocab - 1
    }
}

/// A decode in progress: the model, its cache and the bytes so far.
pub struct Decoder<'m, B: Backend> {
    model: &'m Gpt<B>,
    cache: GptCache<B>,
    device: B::Device,
    context: usize,
    bytes: Vec<u8>,
    /// Passes that refilled the cache from a window (the prompt's included).
    refills: usize,
}

impl<'m, B: Backend> Decoder<'m, B> {
    /// A decoder for `model` with a context of `context` positions (its `seq`), on `device`.
    ///
    /// # Panics
    /// If `context` is 0.
    pub fn new(model: &'m Gpt<B>, context: usize, device: &B::Device) -> Self {
        assert!(
            context > 0,
            "Decoder::new: the context must hold a position"
        );
        Self {
            model,
            cache: model.new_cache(),
            device: device.clone(),
            context,
            bytes: Vec::new(),
            refills: 0,
        }
    }

    fn tokens(&self, bytes: &[u8]) -> Tensor<B, 2, Int> {
        let ids: Vec<i64> = bytes.iter().map(|&b| i64::from(b)).collect();
        let n = ids.len();
        Tensor::from_data(TensorData::new(ids, [1, n]), &self.device)
    }

    /// Fills a fresh cache with the last `keep` bytes (at least one), returning the logits
    /// after them.
    fn refill(&mut self, keep: usize) -> Tensor<B, 1> {
        let start = self.bytes.len() - keep.clamp(1, self.bytes.len());
        let window = self.tokens(&self.bytes[start..]);
        self.cache = self.model.new_cache();
        self.refills += 1;
        let logits = self.model.logits_cached(window, &mut self.cache);
        let vocab = logits.dims()[1];
        logits.reshape([vocab])
    }

    /// Starts from `prompt` (a newline if empty; its last `context` bytes if longer) and
    /// returns the logits of the next byte.
    pub fn start(&mut self, prompt: &[u8]) -> Tensor<B, 1> {
        self.bytes = if prompt.is_empty() {
            b"\n".to_vec()
        } else {
            prompt.to_vec()
        };
        self.refill(self.context)
    }

    /// Appends `byte` and returns the logits of the byte after it.
    pub fn push(&mut self, byte: u8) -> Tensor<B, 1> {
        self.bytes.push(byte);
        if self.cache.len() >= self.context {
            return self.refill(self.context.div_ceil(2));
        }
        let logits = self
            .model
            .logits_cached(self.tokens(&[byte]), &mut self.cache);
        let vocab = logits.dims()[1];
        logits.reshape([vocab])
    }

    /// The bytes so far, the prompt's included.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes the cache holds, at positions `0..`: the window the next logits read.
    pub fn window(&self) -> &[u8] {
        &self.bytes[self.bytes.len() - self.cache.len()..]
    }

    /// How many passes filled the cache from a window (the prompt's included).
    pub fn refills(&self) -> usize {
        self.refills
    }
}

/// Generates `n` bytes after `prompt` with `sampler`, through a KV cache of `context`
/// positions; returns the prompt (a newline if it was empty) and the bytes generated.
pub fn generate<B: Backend>(
    model: &Gpt<B>,
    device: &B::Device,
    prompt: &[u8],
    n: usize,
    context: usize,
    sampler: &mut Sampler,
) -> Vec<u8> {
    let mut decoder = Decoder::new(model, context, device);
    if n == 0 {
        return if prompt.is_empty() {
            b"\n".to_vec()
        } else {
            prompt.to_vec()
        };
    }
    let mut logits = decoder.start(prompt);
    for i in 0..n {
        let byte = sampler.pick(logits) as u8;
        if i + 1 == n {
            decoder.bytes.push(byte);
            break;
        }
        logits = decoder.push(byte);
    }
    decoder.bytes
}
