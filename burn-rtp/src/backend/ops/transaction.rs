//! Transactions read through the float/int/bool ops, so sharded tensors are gathered there.

use crate::backend::rtp::Rtp;
use burn::tensor::ops::TransactionOps;
use burn_rtp_kernels::RotationKernels;

impl<B: RotationKernels> TransactionOps<Self> for Rtp<B> {}
