//! The learning-rate schedule: an optional linear warm-up, then a constant rate or a cosine
//! decay, built from Burn's own schedulers.

use burn::lr_scheduler::cosine::{CosineAnnealingLrScheduler, CosineAnnealingLrSchedulerConfig};
use burn::lr_scheduler::linear::{LinearLrScheduler, LinearLrSchedulerConfig};
use burn::lr_scheduler::LrScheduler;

/// What the learning rate does after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LrSchedule {
    /// Stays at the peak rate.
    #[default]
    Constant,
    /// Falls from the peak rate to a tenth of it, along a half cosine, by the last step.
    Cosine,
}

impl std::str::FromStr for LrSchedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "constant" => Ok(Self::Constant),
            "cosine" => Ok(Self::Cosine),
            other => Err(format!(
                "unknown learning-rate schedule `{other}`: expected constant or cosine"
            )),
        }
    }
}

impl std::fmt::Display for LrSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Constant => "constant",
            Self::Cosine => "cosine",
        })
    }
}

/// The rate of each step of a run, in order: an endless iterator, one item per step from
/// step 0.
///
/// A resumed run builds the same schedule over the same horizon and skips the steps already
/// trained, so that it continues bit-exactly.
#[derive(Clone)]
pub struct Schedule {
    warmup: Option<LinearLrScheduler>,
    warmup_left: usize,
    after: After,
}

#[derive(Clone)]
enum After {
    Constant(f64),
    Cosine(CosineAnnealingLrScheduler),
}

impl Schedule {
    /// The schedule of a run of `total` steps that peaks at `lr` after `warmup` steps.
    pub fn new(lr: f64, warmup: usize, total: usize, kind: LrSchedule) -> Result<Self, String> {
        if warmup > total {
            return Err(format!(
                "--warmup-steps {warmup} is more than the {total} steps of the run"
            ));
        }
        // Step i of the warm-up runs at lr·(i+1)/warmup, reaching the peak on its last step.
        let warmup_sched = if warmup > 1 {
            Some(LinearLrSchedulerConfig::new(lr / warmup as f64, lr, warmup - 1).init()?)
        } else {
            None
        };
        let decay = total - warmup;
        let after = match kind {
            LrSchedule::Cosine if decay > 0 => After::Cosine(
                CosineAnnealingLrSchedulerConfig::new(lr, decay)
                    .with_min_lr(lr / 10.0)
                    .init()?,
            ),
            _ => After::Constant(lr),
        };
        Ok(Self {
            warmup: warmup_sched,
            warmup_left: warmup,
            after,
        })
    }

    /// Skips the first `steps` steps (a resumed run's).
    pub fn advance(&mut self, steps: usize) {
        for _ in 0..steps {
            self.next();
        }
    }
}

impl Iterator for Schedule {
    type Item = f64;

    /// The rate of the next step.
    fn next(&mut self) -> Option<f64> {
        if self.warmup_left > 0 {
            self.warmup_left -= 1;
            if let Some(w) = &mut self.warmup {
                return Some(w.step());
            }
        }
        Some(match &mut self.after {
            After::Constant(lr) => *lr,
            After::Cosine(c) => c.step(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(lr: f64, warmup: usize, total: usize, kind: LrSchedule) -> Vec<f64> {
        Schedule::new(lr, warmup, total, kind)
            .unwrap()
            .take(total)
            .collect()
    }

    #[test]
    fn warmup_rises_linearly_to_the_peak_then_cosine_falls_to_a_tenth() {
        let r = rates(0.01, 4, 14, LrSchedule::Cosine);
        for (i, want) in [0.0025, 0.005, 0.0075, 0.01].iter().enumerate() {
            assert!((r[i] - want).abs() < 1e-12, "step {i}: {} vs {want}", r[i]);
        }
        assert!((r[4] - 0.01).abs() < 1e-12);
        assert!(r[5..].windows(2).all(|w| w[1] < w[0]), "{r:?}");
        // Ten decay steps of a ten-step half cosine: the last is one step short of 0.001.
        let last = 0.001 + 0.5 * 0.009 * (1.0 + (0.9 * std::f64::consts::PI).cos());
        assert!((r[13] - last).abs() < 1e-12, "{} vs {last}", r[13]);
    }

    #[test]
    fn constant_without_warmup_is_the_rate() {
        assert_eq!(rates(0.003, 0, 5, LrSchedule::Constant), vec![0.003; 5]);
        assert_eq!(rates(0.003, 1, 3, LrSchedule::Constant), vec![0.003; 3]);
    }

    #[test]
    fn a_resumed_schedule_continues_where_it_stopped() {
        let all = rates(0.01, 3, 12, LrSchedule::Cosine);
        let mut s = Schedule::new(0.01, 3, 12, LrSchedule::Cosine).unwrap();
        s.advance(5);
        let rest: Vec<f64> = s.take(7).collect();
        assert_eq!(rest, all[5..]);
    }

    #[test]
    fn warmup_longer_than_the_run_is_refused() {
        assert!(Schedule::new(0.01, 6, 5, LrSchedule::Constant).is_err());
    }
}
