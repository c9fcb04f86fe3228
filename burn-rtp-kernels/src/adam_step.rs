//! The scalars of one Adam step and its arithmetic for one element, as burn-optim's `Adam`
//! computes them: what the dispatch trait's `fused_adam` takes, and what each backend's
//! one-pass kernel (`kernel/adam`) runs per element.

/// The scalars of one Adam step, as burn-optim's `Adam` computes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// The first moment's decay.
    pub beta_1: f32,
    /// The second moment's decay.
    pub beta_2: f32,
    /// Added to the second moment's square root.
    pub epsilon: f32,
    /// Weight decay's penalty (`grad + param · penalty`), if any.
    pub weight_decay: Option<f32>,
    /// The learning rate, as the element type.
    pub lr: f32,
    /// The step's count, from 1: the bias corrections' exponent.
    pub time: i32,
}

impl AdamStep {
    /// `sqrt(1 - β₂ᵗ)` and `sqrt(1 - β₂ᵗ) / (1 - β₁ᵗ)`, as Burn computes them.
    pub(crate) fn corrections(&self) -> (f32, f32) {
        let bias_correction2_sqrt = (1.0 - self.beta_2.powi(self.time)).sqrt();
        let combined = bias_correction2_sqrt / (1.0 - self.beta_1.powi(self.time));
        (bias_correction2_sqrt, combined)
    }

    /// One element: `(param, grad, moments)` to the new `(param, moment 1, moment 2)`;
    /// `moments` is `None` on a parameter's first step.
    #[inline(always)]
    pub(crate) fn element(
        &self,
        param: f32,
        grad: f32,
        moments: Option<(f32, f32)>,
        corrections: (f32, f32),
    ) -> (f32, f32, f32) {
        let grad = match self.weight_decay {
            Some(penalty) => param * penalty + grad,
            None => grad,
        };
        let (f1, f2) = (1.0 - self.beta_1, 1.0 - self.beta_2);
        let (m1, m2) = match moments {
            Some((m1, m2)) => (
                m1 * self.beta_1 + grad * f1,
                m2 * self.beta_2 + (grad * grad) * f2,
            ),
            None => (grad * f1, (grad * grad) * f2),
        };
        let (bc2, combined) = corrections;
        let update = (m1 * combined) / (m2.sqrt() + self.epsilon * bc2);
        (param - update * self.lr, m1, m2)
    }
}
