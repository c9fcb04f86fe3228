//! The GPT's train and validation steps for burn-train's `Learner` (feature `learner`).
//!
//! They live here, beside [`Gpt`], because Rust lets only the crate of a type or of a trait
//! implement one for the other; the Learner example (`examples/learner`, package
//! `burn-rtp-learner`) turns the feature on, so that the quick start's build, which does not
//! include that package, leaves burn-train out.

use crate::model::Gpt;
use burn::prelude::*;
use burn::train::metric::{Adaptor, LossInput};
use burn::train::{InferenceStep, ItemLazy, TrainOutput, TrainStep};
use burn_rtp::{RotationKernels, Rtp, RtpDevice};

/// The training backend of every rank, over the inner backend `I` (NdArray by default).
pub type LearnerBackend<I = burn::backend::NdArray> = burn::backend::Autodiff<Rtp<I>>;

/// This rank's slice of one step's batch.
#[derive(Clone, Debug)]
pub struct GptBatch<B: Backend> {
    /// Input tokens, one row per sequence.
    pub tokens: Tensor<B, 2, Int>,
    /// The next token of each position.
    pub targets: Tensor<B, 2, Int>,
}

/// What a train or validation step reports: the loss averaged over every rank.
#[derive(Clone, Debug)]
pub struct GlobalLoss {
    /// Mean of the ranks' losses.
    pub value: f64,
}

impl ItemLazy for GlobalLoss {
    type ItemSync = Self;

    fn sync(self) -> Self {
        self
    }
}

impl<I: Backend> Adaptor<LossInput<I>> for GlobalLoss {
    fn adapt(&self) -> LossInput<I> {
        LossInput::new(Tensor::from_floats(
            [self.value as f32],
            &Default::default(),
        ))
    }
}

/// The mean over ranks of a rank's loss (a collective every rank runs in the same order).
fn global<I: Backend, B: Backend<Device = RtpDevice<I>>>(loss: &Tensor<B, 1>) -> GlobalLoss {
    let local = loss.clone().into_scalar().elem::<f32>();
    GlobalLoss {
        value: f64::from(loss.device().all_reduce_mean(local)),
    }
}

impl<I: RotationKernels> TrainStep for Gpt<LearnerBackend<I>> {
    type Input = GptBatch<LearnerBackend<I>>;
    type Output = GlobalLoss;

    fn step(&self, batch: Self::Input) -> TrainOutput<GlobalLoss> {
        let loss = self.loss(batch.tokens, batch.targets);
        let report = global(&loss);
        TrainOutput::new(self, loss.backward(), report)
    }
}

impl<I: RotationKernels> InferenceStep for Gpt<Rtp<I>> {
    type Input = GptBatch<Rtp<I>>;
    type Output = GlobalLoss;

    fn step(&self, batch: Self::Input) -> GlobalLoss {
        global(&self.loss(batch.tokens, batch.targets))
    }
}
