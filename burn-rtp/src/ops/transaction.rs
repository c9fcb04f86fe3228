//! Transactions read through the float/int/bool ops, so sharded tensors are gathered there.

use crate::backend::Rtp;
use burn::tensor::backend::Backend;
use burn::tensor::ops::TransactionOps;

impl<B: Backend> TransactionOps<Self> for Rtp<B> {}
