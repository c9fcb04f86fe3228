//! The prediction: each rank's model state, in-flight buffers and peak at any world size,
//! from the shapes, the placement policy and the probe.

use super::*;

impl Planner {
    /// Rank 0's parameter bytes under `strategy` at `world` ranks (one copy: the parameter).
    pub fn param_bytes(&self, strategy: Strategy, world: usize) -> u64 {
        param_bytes(
            &self.shapes,
            self.elem,
            strategy,
            world,
            self.config.shard_threshold,
        )
    }

    /// Rank 0's model state: parameters, gradients and optimizer state, to the byte.
    pub fn model_state(&self, strategy: Strategy, world: usize) -> u64 {
        self.param_bytes(strategy, world) * (2 + self.config.optimizer_copies as u64)
    }

    /// Rank 0's peak in-flight bytes: the largest of [`Self::buffers`]'s three moments.
    pub fn in_flight(&self, strategy: Strategy, world: usize) -> u64 {
        let b = self.buffers(strategy, world);
        b.forward.max(b.backward).max(b.update)
    }

    /// Rank 0's in-flight bytes at the two moments that can make the peak (see the module
    /// docs for the rule of each strategy), without activation checkpointing.
    pub fn buffers(&self, strategy: Strategy, world: usize) -> Buffers {
        self.buffers_of(strategy, world, &self.split, &[])
    }

    /// [`Self::buffers`] where the weights of shapes `split` run their backward as two
    /// passes (dX with the weight rotating, then dW travelling on its own), as the probe saw,
    /// and those of shapes `routed` never rotate (every pass of theirs routes).
    fn buffers_of(
        &self,
        strategy: Strategy,
        world: usize,
        split: &[Shape],
        routed: &[Shape],
    ) -> Buffers {
        if world == 1 {
            return Buffers::default();
        }
        let model = ModelShapes {
            shapes: &self.shapes,
            elem: self.elem,
            threshold: self.config.shard_threshold,
            bucket_bytes: self.config.ddp_bucket_bytes,
            split,
            routed,
        };
        rules(strategy).in_flight(&model, world)
    }

    /// Rank 0's predicted peak under `strategy` at `world` ranks with `batch` samples per rank,
    /// without activation checkpointing.
    pub fn predict(
        &self,
        strategy: Strategy,
        rotation: RotationMode,
        world: usize,
        batch: usize,
    ) -> Prediction {
        self.predict_with(
            ActivationCheckpointing::None,
            strategy,
            rotation,
            world,
            batch,
        )
    }

    /// [`Planner::predict`] under `checkpointing`.
    ///
    /// # Panics
    /// If `checkpointing` is on and [`Planner::with_checkpointed_probe`] did not run (see
    /// [`Planner::plans_checkpointing`]).
    pub fn predict_with(
        &self,
        checkpointing: ActivationCheckpointing,
        strategy: Strategy,
        rotation: RotationMode,
        world: usize,
        batch: usize,
    ) -> Prediction {
        assert!(world > 0, "a world has at least one rank");
        let probe = self.probe_with(checkpointing, strategy).unwrap_or_else(|| {
            panic!(
                "planning {strategy} at N={world} with {checkpointing} activation checkpointing: \
                 that was not probed (Planner::with_checkpointed_probe)"
            )
        });
        let params = self.param_bytes(strategy, world) as f64;
        let split = match (checkpointing, &self.checkpointed) {
            (ActivationCheckpointing::Balanced, Some((_, split))) => split,
            _ => &self.split,
        };
        let recomputed: &[Shape] = match checkpointing {
            ActivationCheckpointing::Balanced => split,
            ActivationCheckpointing::None => &[],
        };
        let routed = self.routed(strategy, world, batch, recomputed);
        let rotating = self.buffers_of(strategy, world, split, &routed.weights);
        let buffers = Buffers {
            forward: rotating.forward.max(routed.forward),
            backward: rotating.backward.max(routed.backward),
            update: rotating.update,
        };
        let share = params / self.param_bytes(Strategy::Ddp, 1).max(1) as f64;
        // The probe's local bytes at a batch of zero are weight-sized temporaries (gradient
        // contributions, gathered copies), which shrink with the rank's share of the model.
        let local = |line: &PerSample| {
            (line.fixed * share + line.per_sample * batch as f64)
                .max(0.0)
                .round() as u64
        };
        let resident = (params * (1 + self.config.optimizer_copies) as f64).round() as u64;
        // The peers' inputs routed forwards left on their owners are alive from the end of
        // the forward to the start of the backward.
        let activations = local(&probe.local_peak) + routed.kept;
        let per_sample = (probe.local_peak.per_sample * batch as f64)
            .max(0.0)
            .round() as u64
            + routed.kept;
        // The three moments that can make the peak: the end of the forward pass (all
        // activations, the last layer's buffers), the start of the backward pass (the
        // activations without the weight-sized temporaries, the backward's buffers), and
        // the update (what the probe saw then, scaled).
        let forward = resident + activations + buffers.forward;
        let backward = resident + per_sample + buffers.backward;
        let update = (probe.update.state * params).round() as u64
            + local(&probe.update.local)
            + buffers.update;
        Prediction {
            strategy,
            rotation,
            routing: match strategy {
                Strategy::Rtp => self.config.routing,
                _ => Routing::Weights,
            },
            activation_checkpointing: checkpointing,
            world,
            batch,
            model_state: self.model_state(strategy, world),
            activations,
            in_flight: buffers.forward.max(buffers.backward).max(buffers.update),
            total: forward.max(backward).max(update),
        }
    }

    /// Every planned strategy at every world size in `worlds`, without checkpointing and,
    /// once probed, with it.
    pub fn table(&self, worlds: &[usize], batch: usize) -> Vec<Prediction> {
        worlds
            .iter()
            .flat_map(|&n| {
                self.checkpointings()
                    .into_iter()
                    .flat_map(move |ac| PLANNED.map(|(s, r)| self.predict_with(ac, s, r, n, batch)))
            })
            .collect()
    }

    /// The smallest world, up to `max_world`, at which some strategy's predicted peak fits
    /// `budget` bytes per rank, with that strategy (the first to fit in [`PLANNED`] order).
    /// Activation checkpointing, when probed, is chosen only where nothing fits at that world
    /// without it.
    pub fn recommend(
        &self,
        budget: u64,
        batch: usize,
        max_world: usize,
    ) -> Result<Prediction, PlanError> {
        if max_world == 0 {
            return Err(PlanError::Config(
                "the largest world must be at least 1".into(),
            ));
        }
        let at = |world: usize| {
            self.checkpointings().into_iter().flat_map(move |ac| {
                PLANNED
                    .iter()
                    .map(move |&(s, r)| self.predict_with(ac, s, r, world, batch))
            })
        };
        for world in 1..=max_world {
            if let Some(p) = at(world).find(|p| p.total <= budget) {
                return Ok(p);
            }
        }
        let best = at(max_world)
            .min_by_key(|p| p.total)
            .expect("strategies are planned");
        Err(PlanError::NothingFits {
            budget,
            max_world,
            best,
        })
    }
}

/// Rank 0's bytes of one copy of every parameter.
pub(super) fn param_bytes(
    shapes: &[Shape],
    elem: usize,
    strategy: Strategy,
    world: usize,
    threshold: usize,
) -> u64 {
    shapes
        .iter()
        .map(|s| {
            let n = s.num_elements();
            if placement(strategy, s, world, threshold).is_some() {
                rank0_shard_bytes(s, world, elem)
            } else {
                (n * elem) as u64
            }
        })
        .sum()
}

/// Bytes of rank 0's shard (the largest) of a parameter of `shape` split over `world` ranks.
pub(super) fn rank0_shard_bytes(shape: &Shape, world: usize, elem: usize) -> u64 {
    let spec = ShardSpec {
        full: shape.clone(),
        world,
    };
    (spec.shard_shape(0).num_elements() * elem) as u64
}
