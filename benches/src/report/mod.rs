//! The scaling report: memory, memory-scaling efficiency, step time against DDP, capacity
//! under a memory cap, and transfer/compute overlap, measured side by side in one run.

mod headline;
mod markdown;
mod measure;
mod plots;

pub use measure::{syncs_per_linear_backward, Measured};

use crate::runner::{Failure, Report};
use burn_rtp_gpt::GptConfig;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// What to measure.
#[derive(Debug, Clone)]
pub struct ReportConfig {
    /// Output folder.
    pub out: PathBuf,
    /// World sizes.
    pub ranks: Vec<usize>,
    /// The state-dominated model every figure uses.
    pub model: GptConfig,
    /// Global batch.
    pub batch: usize,
    /// Steps per timing sample.
    pub steps: usize,
    /// Timing samples per strategy (taken in alternation).
    pub repeats: usize,
    /// Per-rank memory cap for the capacity search.
    pub cap_bytes: u64,
    /// Models to try in the capacity search, smallest first.
    pub capacity_candidates: Vec<GptConfig>,
    /// Further models whose step time is compared across strategies.
    pub comparisons: Vec<Comparison>,
    /// Shard thresholds (elements) tried on each comparison model at N=4: parameters
    /// smaller than the threshold are replicated instead of rotated.
    pub thresholds: Vec<usize>,
    /// Where the memory planner's predictions are checked against the ledger.
    pub planner_grid: Vec<crate::planner_check::PlanPoint>,
    /// The activation section: RTP with and without activation checkpointing.
    pub activations: crate::checkpointing::Settings,
    /// The generation section: batch 1 through a KV cache.
    pub decode: crate::decode::Settings,
}

/// A model whose RTP, FSDP and DDP step times (and exchanges per step) are compared.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Short name, used in report keys (`rtp_over_ddp_step_time_{name}_n{N}`).
    pub name: &'static str,
    /// The model.
    pub model: GptConfig,
    /// Sequences per step over all ranks at `N` ranks.
    pub batch: fn(usize) -> usize,
    /// World sizes.
    pub ranks: Vec<usize>,
}

impl Comparison {
    /// Config A of the issues: 8 sequences per rank, N = 2, 4 and 8.
    pub fn config_a(ranks: Vec<usize>) -> Self {
        Self {
            name: "a",
            model: crate::models::config_a(),
            batch: |n| 8 * n,
            ranks,
        }
    }

    /// The small bench model with the criterion bench's global batch of 16.
    pub fn small(ranks: Vec<usize>) -> Self {
        Self {
            name: "small",
            model: crate::models::small(),
            batch: |_| 16,
            ranks,
        }
    }
}

impl ReportConfig {
    /// The full report's defaults.
    pub fn full(out: PathBuf) -> Self {
        Self {
            out,
            ranks: vec![1, 2, 4, 8],
            model: crate::models::state_dominated(),
            batch: 8,
            steps: 4,
            repeats: 7,
            cap_bytes: 48 * 1024 * 1024,
            capacity_candidates: capacity_candidates(16, 32, 2048),
            comparisons: vec![
                Comparison::small(vec![4, 8]),
                Comparison::config_a(vec![2, 4, 8]),
            ],
            thresholds: vec![0, 4096, 16384, 65536, 262144],
            planner_grid: crate::planner_check::full_grid(),
            activations: crate::checkpointing::Settings::full(),
            decode: crate::decode::Settings::full(),
        }
    }

    /// A seconds-long configuration for tests.
    pub fn tiny(out: PathBuf) -> Self {
        Self {
            out,
            ranks: vec![1, 2, 4, 8],
            model: GptConfig::new(8, 32, 1, 4),
            batch: 8,
            steps: 1,
            repeats: 1,
            cap_bytes: 4 * 1024 * 1024,
            capacity_candidates: capacity_candidates(8, 16, 256),
            comparisons: vec![
                Comparison {
                    name: "small",
                    model: GptConfig::new(8, 16, 1, 2),
                    batch: |_| 8,
                    ranks: vec![4, 8],
                },
                Comparison {
                    name: "a",
                    model: GptConfig::new(8, 24, 2, 2),
                    batch: |n| 2 * n,
                    ranks: vec![2, 4, 8],
                },
            ],
            thresholds: vec![0, 1024],
            planner_grid: crate::planner_check::tiny_grid(),
            activations: crate::checkpointing::Settings::tiny(),
            decode: crate::decode::Settings::tiny(),
        }
    }
}

/// Widths from `from` up to `to`, each `factor` times the one before, rounded up to a
/// multiple of 8 (what the GPT's 4 heads and the kernels' vectors divide).
fn widths(from: usize, to: usize, factor: f64) -> impl Iterator<Item = usize> {
    assert!(factor > 1.0, "widths must grow (factor {factor})");
    std::iter::successors(Some(from as f64), move |d| Some(d * factor))
        .take_while(move |d| (*d as usize) <= to)
        .map(|d| (d as usize).div_ceil(8) * 8)
}

/// Models of `layers` blocks whose width grows by `factor` each time (rounded up to a
/// multiple of 8), so that parameter counts grow by about `factor²` from one to the next:
/// bisection over them finds each strategy's largest model to that resolution, whatever its
/// size.
pub fn capacity_ladder(
    seq: usize,
    layers: usize,
    from: usize,
    to: usize,
    factor: f64,
) -> Vec<GptConfig> {
    let mut out: Vec<GptConfig> = Vec::new();
    for width in widths(from, to, factor) {
        // Rounding can make two small widths equal: one rung each.
        if out.last().is_none_or(|m| m.d_model < width) {
            out.push(GptConfig::new(seq, width, layers, 4));
        }
    }
    out
}

/// Models of growing width and depth: width grows by a fifth each time, and a block is
/// added every six widths.
pub fn capacity_candidates(seq: usize, from: usize, to: usize) -> Vec<GptConfig> {
    widths(from, to, 1.2)
        .enumerate()
        .map(|(k, width)| GptConfig::new(seq, width, 1 + k / 6, 4))
        .collect()
}

impl Report for ReportConfig {
    type Measured = measure::Measured;

    fn out(&self) -> &Path {
        &self.out
    }

    fn measure(&self, log: &dyn Fn(&str)) -> Result<measure::Measured, Failure> {
        measure::measure(self, log)
    }

    fn headline(&self, measured: &measure::Measured) -> Map<String, Value> {
        headline::headline(measured)
    }

    fn details(&self, measured: &measure::Measured) -> Result<Map<String, Value>, Failure> {
        headline::details(self, measured)
    }

    fn markdown(&self, measured: &measure::Measured, report: &Value) -> String {
        markdown::markdown(self, measured, report)
    }

    fn plots(&self, measured: &measure::Measured) -> Result<Vec<&'static str>, Failure> {
        plots::plots(self, measured)
    }

    fn check_keys(&self, report: &Value) -> Result<(), String> {
        crate::figures::check_keys(crate::figures::IN_PROCESS, report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capacity_ladder_grows_in_small_steps_of_width_only() {
        let ladder = capacity_ladder(8, 2, 256, 4096, 1.05);
        assert_eq!(ladder.first().unwrap().d_model, 256);
        assert!(ladder.last().unwrap().d_model <= 4096);
        for pair in ladder.windows(2) {
            let (a, b) = (pair[0].d_model, pair[1].d_model);
            assert!(a < b && b % 8 == 0, "{a} -> {b}");
            // Rounding up to a multiple of 8 may add up to 8 to the 5% step.
            assert!(b as f64 <= a as f64 * 1.05 + 8.0, "{a} -> {b}");
        }
        assert!(ladder.iter().all(|m| m.layers == 2));
    }
}
