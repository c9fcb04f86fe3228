//! The MPI report's plots.

use super::capacity::Largest;
use super::cells::Cell;
use super::{MpiReportConfig, STRATEGIES};
use crate::median;
use std::collections::BTreeMap;

/// Draws `mpi_step_time.svg`, `mpi_rss.svg` and `mpi_capacity.svg`.
pub(super) fn plots(
    cfg: &MpiReportConfig,
    cells: &BTreeMap<(&str, usize, &str), Cell>,
    capacity: &[Largest],
) -> Result<(), Box<dyn std::error::Error>> {
    let ranks = &cfg.ranks;
    let series = |metric: &dyn Fn(&Cell) -> f64, only: Option<&str>| {
        let mut out = Vec::new();
        for c in &cfg.configs {
            if only.is_some_and(|o| o != c.name) {
                continue;
            }
            for v in STRATEGIES {
                let pts = ranks
                    .iter()
                    .filter_map(|&n| {
                        cells
                            .get(&(c.name, n, v.name()))
                            .map(|cell| (n, metric(cell)))
                    })
                    .collect();
                out.push((format!("{} {}", c.name.to_uppercase(), v.name()), pts));
            }
        }
        out
    };
    crate::plot::lines(
        &cfg.out.join("mpi_step_time.svg"),
        "Step time, one MPI process per rank",
        "ms",
        ranks,
        &series(&|cell| median(&cell.step_ms), None),
    )?;
    crate::plot::lines(
        &cfg.out.join("mpi_rss.svg"),
        "Peak resident set per process (config B)",
        "MiB",
        ranks,
        &series(&|cell| median(&cell.rss) / (1024.0 * 1024.0), Some("b")),
    )?;
    crate::plot::bars(
        &cfg.out.join("mpi_capacity.svg"),
        "Largest model that trains under a per-process limit (N=4)",
        &capacity
            .iter()
            .map(|(v, _, p)| (v.name(), *p as f64 / 1e6))
            .collect::<Vec<_>>(),
    )
}
