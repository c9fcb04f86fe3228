//! The in-process report's plots.

use super::measure::{CapacityRow, Measured, MemoryRow, TimeRow};
use super::ReportConfig;
use crate::plot::Res;
use crate::runner::Failure;
use std::path::Path;

/// Draws `memory.svg`, `efficiency.svg`, `step_time.svg`, `capacity.svg` and `planner.svg`.
pub(super) fn plots(cfg: &ReportConfig, m: &Measured) -> Result<Vec<&'static str>, Failure> {
    let out = &cfg.out;
    memory(&out.join("memory.svg"), &m.memory, &cfg.ranks)?;
    efficiency(&out.join("efficiency.svg"), &cfg.ranks, &|n| {
        m.efficiency(n)
    })?;
    step_time(&out.join("step_time.svg"), &m.times, &cfg.ranks)?;
    capacity(&out.join("capacity.svg"), &m.capacity)?;
    crate::planner_check::plot(&out.join("planner.svg"), &m.planner_rows)?;
    Ok(vec![
        "memory.svg",
        "efficiency.svg",
        "step_time.svg",
        "capacity.svg",
        "planner.svg",
    ])
}

/// The strategies of `rows`, each once, in their first order.
fn strategies(rows: impl Iterator<Item = &'static str>) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for s in rows {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// Each strategy's peak against N, beside the ideal model state.
fn memory(path: &Path, rows: &[MemoryRow], ranks: &[usize]) -> Res {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut series: Vec<(String, Vec<(usize, f64)>)> = strategies(rows.iter().map(|r| r.strategy))
        .into_iter()
        .map(|s| {
            let pts = rows
                .iter()
                .filter(|r| r.strategy == s)
                .map(|r| (r.ranks, mib(r.total)))
                .collect();
            (format!("{s} peak"), pts)
        })
        .collect();
    let ideal = ranks
        .iter()
        .filter_map(|&n| {
            rows.iter()
                .find(|r| r.ranks == n)
                .map(|r| (n, mib(r.ideal_model_state)))
        })
        .collect();
    series.push(("ideal model state (single / N)".into(), ideal));
    crate::plot::lines(path, "Peak memory per rank", "MiB", ranks, &series)
}

/// RTP's memory-scaling efficiency against N.
fn efficiency(path: &Path, ranks: &[usize], eff: &dyn Fn(usize) -> f64) -> Res {
    let pts = ranks.iter().map(|&n| (n, eff(n))).collect();
    crate::plot::lines(
        path,
        "RTP memory-scaling efficiency (ideal / measured model state)",
        "efficiency",
        ranks,
        &[("rtp".into(), pts)],
    )
}

/// Each strategy's step time over DDP's against N.
fn step_time(path: &Path, rows: &[TimeRow], ranks: &[usize]) -> Res {
    let series: Vec<(String, Vec<(usize, f64)>)> = strategies(rows.iter().map(|r| r.strategy))
        .into_iter()
        .map(|s| {
            let pts = rows
                .iter()
                .filter(|r| r.strategy == s)
                .map(|r| (r.ranks, r.over_ddp))
                .collect();
            (s.to_string(), pts)
        })
        .collect();
    crate::plot::lines(path, "Step time / DDP step time", "ratio", ranks, &series)
}

/// The largest model each strategy trains under the cap.
fn capacity(path: &Path, rows: &[CapacityRow]) -> Res {
    let bars_of: Vec<(&str, f64)> = rows
        .iter()
        .map(|r| (r.strategy, r.params as f64 / 1e6))
        .collect();
    crate::plot::bars(
        path,
        "Largest trainable model under the per-rank cap (N=4)",
        &bars_of,
    )
}
