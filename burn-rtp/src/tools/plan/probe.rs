//! The probe: a few training steps on one rank, under each strategy, that measure what the
//! planner cannot derive from shapes (activations and temporaries, and what each phase's
//! peak is made of).

use super::predict::param_bytes;
use super::*;

impl Planner {
    /// Measures what the plan needs: `step(device, batch)` builds the model on `device`,
    /// trains it for a few steps (two, so that the optimizer state exists during one) at
    /// `batch` samples, and returns it. It runs on one in-process rank, once per strategy
    /// and per probe batch, never at a larger world.
    ///
    /// ```
    /// use burn::backend::{Autodiff, NdArray};
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    /// use burn::tensor::Tensor;
    /// use burn_rtp::{PlanConfig, Planner, Rtp, RtpOptimizer, Strategy};
    ///
    /// type B = Autodiff<Rtp<NdArray>>;
    /// let config = PlanConfig::default().with_shard_threshold(0).with_batch(8);
    /// let planner = Planner::probe::<NdArray, B, _, _>(config, |device, batch| {
    ///     let mut model: Linear<B> = LinearConfig::new(64, 64).init(device);
    ///     let mut optim = RtpOptimizer::new(AdamConfig::new().init::<B, Linear<B>>());
    ///     for _ in 0..2 {
    ///         let x = Tensor::<B, 2>::ones([batch, 64], device);
    ///         let loss = model.forward(x).powi_scalar(2).mean();
    ///         let grads = GradientsParams::from_grads(loss.backward(), &model);
    ///         model = optim.step(1e-3, model, grads);
    ///     }
    ///     model
    /// })?;
    /// // Exact: 16 of the 64 columns of the weight and the bias per rank at N = 4, held as
    /// // parameter, gradient and Adam's two moments, in f32.
    /// assert_eq!(planner.model_state(Strategy::Rtp, 4), (64 * 16 + 16) * 4 * 4);
    /// let fit = planner.recommend(1 << 30, 8, 8)?;
    /// assert_eq!((fit.world, fit.strategy), (1, Strategy::Ddp));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn probe<I, B, M, F>(config: PlanConfig, step: F) -> RtpResult<Self>
    where
        I: Backend,
        B: Backend<Device = RtpDevice<I>>,
        M: Module<B>,
        F: Fn(&RtpDevice<I>, usize) -> M + Send + Sync,
    {
        let (shapes, elem, probes, split, calls) = measure::<I, B, M, F>(&config, step)?;
        Ok(Self {
            shapes,
            elem,
            config,
            probes,
            split,
            calls,
            checkpointed: None,
        })
    }

    /// Adds the probes of the same model trained with balanced activation checkpointing:
    /// `step` is [`Planner::probe`]'s step on `Autodiff<Rtp<I>, BalancedCheckpointing>`. It
    /// must build the same parameters.
    ///
    /// ```
    /// use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    /// use burn::backend::{Autodiff, NdArray};
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    /// use burn::tensor::backend::AutodiffBackend;
    /// use burn::tensor::Tensor;
    /// use burn_rtp::{ActivationCheckpointing, PlanConfig, Planner, Rtp, RtpDevice, RtpOptimizer};
    /// use burn_rtp::{RotationMode, Strategy};
    ///
    /// // Four blocks of two Linears with a GELU between them, whose output checkpointing
    /// // recomputes in the backward pass instead of keeping it.
    /// fn step<B>(device: &B::Device, batch: usize) -> Vec<Linear<B>>
    /// where
    ///     B: AutodiffBackend<Device = RtpDevice<NdArray>, InnerBackend = Rtp<NdArray>>,
    /// {
    ///     let mut model: Vec<Linear<B>> = (0..8)
    ///         .map(|i| match i % 2 {
    ///             0 => LinearConfig::new(64, 256).init(device),
    ///             _ => LinearConfig::new(256, 64).init(device),
    ///         })
    ///         .collect();
    ///     let mut optim = RtpOptimizer::new(AdamConfig::new().init::<B, Vec<Linear<B>>>());
    ///     for _ in 0..2 {
    ///         let mut h = Tensor::<B, 2>::ones([batch, 64], device);
    ///         for pair in model.chunks(2) {
    ///             h = pair[1].forward(burn::tensor::activation::gelu(pair[0].forward(h)));
    ///         }
    ///         let loss = h.powi_scalar(2).mean();
    ///         let grads = GradientsParams::from_grads(loss.backward(), &model);
    ///         model = optim.step(1e-3, model, grads);
    ///     }
    ///     model
    /// }
    /// type Plain = Autodiff<Rtp<NdArray>>;
    /// type Balanced = Autodiff<Rtp<NdArray>, BalancedCheckpointing>;
    /// let config = PlanConfig::default().with_shard_threshold(0).with_batch(256);
    /// let planner = Planner::probe::<NdArray, Plain, _, _>(config, step::<Plain>)?
    ///     .with_checkpointed_probe::<NdArray, Balanced, _, _>(step::<Balanced>)?;
    /// let (rtp, oop) = (Strategy::Rtp, RotationMode::OutOfPlace);
    /// let plain = planner.predict_with(ActivationCheckpointing::None, rtp, oop, 4, 256);
    /// let balanced = planner.predict_with(ActivationCheckpointing::Balanced, rtp, oop, 4, 256);
    /// // The GELU's output is recomputed instead of kept: less activation memory.
    /// assert!(balanced.activations < plain.activations);
    /// assert_eq!(balanced.model_state, plain.model_state);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_checkpointed_probe<I, B, M, F>(mut self, step: F) -> Result<Self, PlanError>
    where
        I: Backend,
        B: Backend<Device = RtpDevice<I>>,
        M: Module<B>,
        F: Fn(&RtpDevice<I>, usize) -> M + Send + Sync,
    {
        let (shapes, _, probes, split, _) = measure::<I, B, M, F>(&self.config, step)?;
        if shapes != self.shapes {
            return Err(PlanError::Config(format!(
                "the checkpointed probe built other parameters ({} shapes) than the first \
                 probe ({} shapes): both must train the same model",
                shapes.len(),
                self.shapes.len()
            )));
        }
        self.checkpointed = Some((probes, split));
        Ok(self)
    }

    /// Whether [`Planner::with_checkpointed_probe`] ran, so that checkpointed plans exist.
    pub fn plans_checkpointing(&self) -> bool {
        self.checkpointed.is_some()
    }

    /// The parameter shapes the probe found, in the model's visiting order.
    pub fn shapes(&self) -> &[Shape] {
        &self.shapes
    }

    /// What the probe measured for `strategy` (without checkpointing).
    pub fn probe_of(&self, strategy: Strategy) -> Probe {
        pick(&self.probes, strategy)
    }

    /// What the probe measured for `strategy` under `checkpointing`, if that was probed.
    pub fn probe_with(
        &self,
        checkpointing: ActivationCheckpointing,
        strategy: Strategy,
    ) -> Option<Probe> {
        match checkpointing {
            ActivationCheckpointing::None => Some(pick(&self.probes, strategy)),
            ActivationCheckpointing::Balanced => {
                self.checkpointed.as_ref().map(|(p, _)| pick(p, strategy))
            }
        }
    }

    /// The settings a plan covers: without checkpointing, and with it once probed.
    pub(super) fn checkpointings(&self) -> Vec<ActivationCheckpointing> {
        let mut all = vec![ActivationCheckpointing::None];
        if self.plans_checkpointing() {
            all.push(ActivationCheckpointing::Balanced);
        }
        all
    }
}

/// The probe of `strategy` among `probes`.
pub(super) fn pick(probes: &Probes, strategy: Strategy) -> Probe {
    probes
        .iter()
        .find(|(s, _)| *s == strategy)
        .map(|(_, p)| *p)
        .expect("every strategy is probed")
}

/// Runs the probe's steps for every strategy at both probe batches (see [`Planner::probe`]):
/// the parameter shapes, their element size, each strategy's figures, the weights whose
/// backward ran as two passes and RTP's Linear forwards of its last step at the larger batch.
#[allow(clippy::type_complexity)]
pub(super) fn measure<I, B, M, F>(
    config: &PlanConfig,
    step: F,
) -> RtpResult<(
    Vec<Shape>,
    usize,
    Probes,
    Vec<Shape>,
    Vec<routing::ProbedCall>,
)>
where
    I: Backend,
    B: Backend<Device = RtpDevice<I>>,
    M: Module<B>,
    F: Fn(&RtpDevice<I>, usize) -> M + Send + Sync,
{
    let (b1, b2) = config.probe_batches;
    let mut shapes = None;
    let mut split: Vec<Shape> = Vec::new();
    let mut calls = Vec::new();
    let mut probes = [Strategy::Rtp, Strategy::Fsdp, Strategy::Ddp].map(|s| (s, Probe::default()));
    for (strategy, probe) in probes.iter_mut() {
        let mut at = Vec::new();
        for batch in [b1, b2] {
            let rtp = RtpConfig::new(1)
                .with_strategy(*strategy)
                .with_shard_threshold(config.shard_threshold)
                .with_transport(crate::TransportKind::InProcess);
            let step = &step;
            let mut out = crate::runtime::launch::launch::<I, _, _>(rtp, move |device| {
                device.reset_memory_peak();
                device.ctx.linear.observe();
                let model = step(&device, batch);
                let mut visitor = Shapes {
                    shapes: Vec::new(),
                    elem: 4,
                };
                model.visit(&mut visitor);
                let peak = device.memory_peak();
                let (mut compute, update) = device.memory_phase_peaks();
                if compute.total == 0 {
                    // No RtpOptimizer marked the phases: the whole step is one.
                    compute = device.memory_at_peak();
                }
                let measured = Measured {
                    batch,
                    peak,
                    compute,
                    update,
                };
                let halves = device.ctx.linear.split_passes.lock().unwrap().clone();
                let calls = device.ctx.linear.observed();
                (visitor.shapes, visitor.elem, measured, halves, calls)
            })?;
            let (s, elem, measured, halves, seen) = out.remove(0);
            if *strategy == Strategy::Rtp && batch == b2 {
                calls = seen
                    .iter()
                    .map(|c| routing::ProbedCall::new(c, batch))
                    .collect();
            }
            for h in halves {
                let h = Shape::from(h);
                if !split.contains(&h) {
                    split.push(h);
                }
            }
            shapes.get_or_insert((s, elem));
            at.push(measured);
        }
        let (shapes, elem) = shapes.as_ref().expect("probed");
        let params = param_bytes(shapes, *elem, Strategy::Ddp, 1, 0).max(1) as f64;
        let line = |f: &dyn Fn(&Measured) -> u64| {
            PerSample::through((at[0].batch, f(&at[0])), (at[1].batch, f(&at[1])))
        };
        let phase = |pick: fn(&Measured) -> MemoryStats| PhaseMakeUp {
            state: pick(&at[1]).sharded as f64 / params,
            local: line(&|m| pick(m).local),
        };
        *probe = Probe {
            local_peak: line(&|m| m.peak.local),
            compute: phase(|m| m.compute),
            update: phase(|m| m.update),
        };
    }
    let (shapes, elem) = shapes.expect("probed");
    Ok((shapes, elem, probes, split, calls))
}
