//! The MPI report's cells: every configuration at every world size, each strategy's jobs
//! alternating, and what they measured, summarised.

use super::job::timeline_file;
use super::launch::{run_job, run_peer, Runner};
use super::{Job, MpiReportConfig, STRATEGIES};
use crate::{median, InnerBackend, Variant};
use burn_rtp::timeline::IntervalKind;
use burn_rtp::{human_bytes, ActivationCheckpointing};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Checks that each of a job's `ranks` wrote a readable timeline with some compute in it, so
/// that a report run with timelines never leaves a silent gap.
fn check_timelines(stem: &Path, ranks: usize) -> Result<(), String> {
    for rank in 0..ranks {
        let path = timeline_file(stem, rank);
        let text = std::fs::read(&path)
            .map_err(|e| format!("rank {rank} wrote no timeline ({}): {e}", path.display()))?;
        let intervals: Vec<burn_rtp::timeline::Interval> = serde_json::from_slice(&text)
            .map_err(|e| format!("unreadable timeline {}: {e}", path.display()))?;
        if !intervals.iter().any(|i| i.kind == IntervalKind::Compute) {
            return Err(format!("timeline {} holds no compute", path.display()));
        }
    }
    Ok(())
}

/// The mean over the ranks that timed something (`None` if none did).
fn mean_of_ranks(per_rank: &[Option<f64>]) -> Option<f64> {
    let timed: Vec<f64> = per_rank.iter().flatten().copied().collect();
    (!timed.is_empty()).then(|| timed.iter().sum::<f64>() / timed.len() as f64)
}

/// Median and spread (min, max) of a sample.
pub(super) fn summary(values: &[f64]) -> Value {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    json!({ "median": median(values), "min": min, "max": max, "samples": values.len() })
}

/// What one cell's jobs measured, job by job.
#[derive(Default)]
pub(super) struct Cell {
    /// Per job, the median step (ms).
    pub(super) step_ms: Vec<f64>,
    /// Per job, the largest peak resident set of its processes (bytes).
    pub(super) rss: Vec<f64>,
    /// Per job, the largest ledger peak of its ranks (bytes).
    pub(super) ledger: Vec<f64>,
    /// Per job, the ranks' mean share of wire time hidden under compute.
    pub(super) overlap: Vec<f64>,
    /// Per job, the ranks' mean share of wire time spent blocked on transfers.
    pub(super) in_waits: Vec<f64>,
    /// Parameters of the model.
    pub(super) params: usize,
    /// The communication threads' pacings seen across the cell's jobs and ranks.
    pub(super) progress: BTreeSet<String>,
}

/// The cells, keyed by (config, N, runner).
pub(super) type Cells = BTreeMap<(&'static str, usize, &'static str), Cell>;

/// Runs every cell's jobs, strategies (and PyTorch's, with a peer) alternating between jobs;
/// `scratch` takes each job's result.
pub(super) fn measure(
    cfg: &MpiReportConfig,
    exe: &Path,
    scratch: &Path,
    log: &dyn Fn(&str),
) -> Result<Cells, Box<dyn std::error::Error>> {
    let mut cells = Cells::new();
    for c in &cfg.configs {
        for &n in &cfg.ranks {
            for repeat in 0..cfg.repeats {
                let mut order: Vec<Runner> = STRATEGIES.map(Runner::Ours).to_vec();
                if cfg.pytorch.is_some() {
                    order.extend([Runner::PyTorch("ddp"), Runner::PyTorch("fsdp")]);
                }
                let len = order.len();
                order.rotate_left(repeat % len);
                for runner in order {
                    let variant = match runner {
                        Runner::Ours(v) => v,
                        // The peer reads the model, the batch and the steps; not the variant.
                        Runner::PyTorch(_) => Variant::DDP,
                    };
                    let job = Job {
                        variant,
                        model: c.model.clone(),
                        batch_per_rank: c.batch_per_rank,
                        warmup: cfg.warmup,
                        steps: cfg.steps,
                        out: scratch.join(format!("{}-{n}-{}.json", c.name, runner.name())),
                        mpi_progress: cfg.mpi_progress,
                        timeline: (cfg.timelines && matches!(runner, Runner::Ours(_))).then(|| {
                            scratch.join(format!(
                                "timeline-{}-{n}-{}-{repeat}",
                                c.name,
                                runner.name()
                            ))
                        }),
                        activation_checkpointing: ActivationCheckpointing::None,
                        backend: InnerBackend::Ndarray,
                        threads: None,
                        fused_activations: true,
                    };
                    if let Some(stem) = &job.timeline {
                        // A file left by an earlier run must not pass for this job's.
                        for rank in 0..n {
                            let _ = std::fs::remove_file(timeline_file(stem, rank));
                        }
                    }
                    let r = match (runner, &cfg.pytorch) {
                        (Runner::PyTorch(strategy), Some(python)) => {
                            run_peer(python, strategy, n, &job)?
                        }
                        _ => run_job(exe, n, &job, None, &[])?.expect("failures are errors here"),
                    };
                    if let Some(stem) = &job.timeline {
                        check_timelines(stem, n)?;
                    }
                    let step = median(&r.step_s) * 1e3;
                    let rss = r.peak_rss_bytes.iter().copied().max().unwrap_or(0);
                    let ledger = r.ledger_peak_bytes.iter().copied().max().unwrap_or(0);
                    log(&format!(
                        "config {} N={n} {:<14} step {step:>8.1} ms, peak RSS {} (ledger {})",
                        c.name.to_uppercase(),
                        runner.name(),
                        human_bytes(rss),
                        human_bytes(ledger)
                    ));
                    let cell = cells.entry((c.name, n, runner.name())).or_default();
                    cell.step_ms.push(step);
                    cell.rss.push(rss as f64);
                    cell.ledger.push(ledger as f64);
                    if let Some(hidden) = mean_of_ranks(&r.overlap) {
                        cell.overlap.push(hidden);
                    }
                    if let Some(waits) = mean_of_ranks(&r.wire_in_waits) {
                        cell.in_waits.push(waits);
                    }
                    cell.params = r.params;
                    cell.progress.extend(r.progress);
                }
            }
        }
    }
    Ok(cells)
}

/// Each cell's jobs, summarised, for `report.json`.
pub(super) fn details(cells: &Cells) -> Vec<Value> {
    let mut details = Vec::new();
    for ((c, n, v), cell) in cells {
        details.push(json!({
            "config": c, "ranks": n, "strategy": v, "params": cell.params,
            "step_ms": summary(&cell.step_ms),
            "peak_rss_bytes": summary(&cell.rss),
            "ledger_peak_bytes": summary(&cell.ledger),
            "overlap_fraction": if cell.overlap.is_empty() { Value::Null } else { summary(&cell.overlap) },
            "wire_in_waits_fraction": if cell.in_waits.is_empty() { Value::Null } else { summary(&cell.in_waits) },
            "mpi_progress": cell.progress,
        }));
    }
    details
}
