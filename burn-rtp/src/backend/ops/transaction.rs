//! Transactions read through the float/int/bool ops, so sharded tensors are gathered there.
//! Burn's default `tr_execute` (each read awaited in turn) is kept on purpose: a batched read
//! of the inner backend would bypass that gather, and NdArray and Flex batch nothing either.

use crate::backend::rtp::Rtp;
use burn::tensor::ops::TransactionOps;
use burn_rtp_kernels::RotationKernels;

impl<B: RotationKernels> TransactionOps<Self> for Rtp<B> {}
