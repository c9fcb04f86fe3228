//! Byte-level data: the shipped corpus or any UTF-8 file, split into train and validation,
//! served as deterministic windows so every strategy sees the same global batch.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The default corpus: *The Devil's Dictionary* (public domain; see `examples/data/README.md`).
pub const DEFAULT_CORPUS: &str = include_str!("../data/devils-dictionary.txt");

/// Why a corpus could not be used.
#[derive(Debug, Error)]
pub enum DataError {
    /// The file could not be read.
    #[error("cannot read data file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The file is not UTF-8 text.
    #[error("data file {path} is not UTF-8 text (invalid byte at offset {offset})")]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Offset of the first invalid byte.
        offset: usize,
    },
    /// The text is too short for the context length.
    #[error("the corpus has {bytes} bytes, too few for --seq {seq} (need at least {need})")]
    TooShort {
        /// Bytes in the corpus.
        bytes: usize,
        /// Context length.
        seq: usize,
        /// Minimum size.
        need: usize,
    },
}

/// A byte corpus split 90/10 into train and validation text.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// Training bytes.
    pub train: Vec<u8>,
    /// Validation bytes (the last tenth).
    pub val: Vec<u8>,
}

impl Corpus {
    /// The shipped corpus, or `path` if given; validated for the context length `seq`.
    pub fn load(path: Option<&Path>, seq: usize) -> Result<Self, DataError> {
        let bytes = match path {
            None => DEFAULT_CORPUS.as_bytes().to_vec(),
            Some(p) => {
                let raw = std::fs::read(p).map_err(|source| DataError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                if let Err(e) = std::str::from_utf8(&raw) {
                    return Err(DataError::NotUtf8 {
                        path: p.to_path_buf(),
                        offset: e.valid_up_to(),
                    });
                }
                raw
            }
        };
        let need = 20 * (seq + 1);
        if bytes.len() < need {
            return Err(DataError::TooShort {
                bytes: bytes.len(),
                seq,
                need,
            });
        }
        let cut = bytes.len() - bytes.len() / 10;
        Ok(Self {
            val: bytes[cut..].to_vec(),
            train: bytes[..cut].to_vec(),
        })
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Inputs and next-byte targets of the given rows of a batch.
pub struct Windows {
    tokens: Vec<i64>,
    targets: Vec<i64>,
    rows: usize,
    seq: usize,
}

impl Windows {
    /// Training rows `rows` of global batch `step`: random windows of the train split.
    pub fn train(
        corpus: &Corpus,
        seed: u64,
        step: usize,
        rows: std::ops::Range<usize>,
        seq: usize,
    ) -> Self {
        let span = corpus.train.len() - seq - 1;
        let starts =
            rows.map(|row| (mix(seed ^ mix(step as u64 ^ mix(row as u64))) % span as u64) as usize);
        Self::at(&corpus.train, starts, seq)
    }

    /// Validation rows `rows` of `total`: evenly spaced windows over the validation split.
    pub fn val(corpus: &Corpus, rows: std::ops::Range<usize>, total: usize, seq: usize) -> Self {
        let span = corpus.val.len().saturating_sub(seq + 1).max(1);
        Self::at(&corpus.val, rows.map(|row| row * span / total), seq)
    }

    fn at(bytes: &[u8], starts: impl Iterator<Item = usize>, seq: usize) -> Self {
        let mut tokens = Vec::new();
        let mut targets = Vec::new();
        let mut rows = 0;
        for start in starts {
            tokens.extend(bytes[start..start + seq].iter().map(|&b| i64::from(b)));
            targets.extend(
                bytes[start + 1..start + seq + 1]
                    .iter()
                    .map(|&b| i64::from(b)),
            );
            rows += 1;
        }
        Self {
            tokens,
            targets,
            rows,
            seq,
        }
    }

    /// The windows as tensors `[rows, seq]` on `device`.
    pub fn tensors<B: Backend>(
        &self,
        device: &B::Device,
    ) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
        let shape = [self.rows, self.seq];
        (
            Tensor::from_data(TensorData::new(self.tokens.clone(), shape), device),
            Tensor::from_data(TensorData::new(self.targets.clone(), shape), device),
        )
    }
}
