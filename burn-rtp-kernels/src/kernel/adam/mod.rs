//! One Adam step over a shard in one pass: parameter, gradient and both moments read once,
//! the parameter and the moments written in place.
//!
//! Burn's `Adam` (burn-optim 0.21) is about a dozen whole-tensor ops per parameter, each a new
//! tensor, and burn-ndarray copies a shared buffer before each in-place write; PyTorch's Adam
//! is one fused `foreach` kernel. `AdamStep::element` performs Burn's arithmetic, operation
//! by operation in f32 and in Burn's order (its scalars computed as Burn computes them), so
//! the result is Burn's Adam bit for bit: the tests below check it against burn-optim's own
//! `Adam` on NdArray. AMSGrad is not fused (the decorator runs Burn's Adam for it).

pub(crate) mod ndarray;

pub use crate::adam_step::AdamStep;

#[cfg(test)]
mod tests {
    use super::AdamStep;
    use burn::backend::NdArray;
    use burn::optim::{AdamConfig, SimpleOptimizer};
    use burn::tensor::{Tensor, TensorData};

    type N = NdArray<f32>;

    fn values(n: usize, salt: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.618_034 + salt).fract() - 0.5) * 2.0 * (1.0 + i as f32 * 1e-3))
            .collect()
    }

    #[test]
    fn three_steps_are_burns_adam_bit_for_bit() {
        for decay in [None, Some(0.01f32)] {
            let mut config = AdamConfig::new();
            if let Some(penalty) = decay {
                config = config
                    .with_weight_decay(Some(burn::optim::decay::WeightDecayConfig::new(penalty)));
            }
            let adam = config.build();
            let device = Default::default();
            let n = 1000;
            let mut param =
                Tensor::<N, 1>::from_data(TensorData::new(values(n, 0.1), [n]), &device);
            let mut ours = values(n, 0.1);
            let mut moments: Option<Vec<(f32, f32)>> = None;
            let mut state = None;
            for time in 1..=3 {
                let grad_values = values(n, 0.3 * time as f32);
                let grad =
                    Tensor::<N, 1>::from_data(TensorData::new(grad_values.clone(), [n]), &device);
                let lr = 1e-3 * time as f64;
                let (p, s) = adam.step(lr, param, grad, state);
                param = p;
                state = s;
                let step = AdamStep {
                    beta_1: 0.9,
                    beta_2: 0.999,
                    epsilon: 1e-5,
                    weight_decay: decay,
                    lr: lr as f32,
                    time,
                };
                let c = step.corrections();
                let mut next = Vec::with_capacity(n);
                for i in 0..n {
                    let (p, m1, m2) =
                        step.element(ours[i], grad_values[i], moments.as_ref().map(|m| m[i]), c);
                    ours[i] = p;
                    next.push((m1, m2));
                }
                moments = Some(next);
                let want = param.clone().into_data().to_vec::<f32>().unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&ours), bits(&want), "step {time}, decay {decay:?}");
            }
        }
    }
}
