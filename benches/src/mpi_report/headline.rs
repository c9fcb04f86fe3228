//! The MPI report's `report.json`: its headline figures and the details behind them.

use super::capacity::CAPACITY_N;
use super::cells::{self, Cell};
use super::{Measured, MpiReportConfig};
use crate::{median, Variant};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// The headline figures ([`crate::figures::MPI`], and [`crate::figures::MPI_PYTORCH`] with a
/// PyTorch peer): step, memory and hiding ratios per cell, capacity, the activation section's
/// and the planner's.
pub(super) fn headline(cfg: &MpiReportConfig, m: &Measured) -> Map<String, Value> {
    let by_name = |c: &str, n: usize, name: &str, pick: &dyn Fn(&Cell) -> &Vec<f64>| {
        m.cells
            .get(&(c, n, name))
            .map_or(f64::NAN, |cell| median(pick(cell)))
    };
    let med = |c: &str, n: usize, v: Variant, pick: &dyn Fn(&Cell) -> &Vec<f64>| {
        by_name(c, n, v.name(), pick)
    };
    let step = |c, n, v| med(c, n, v, &|cell| &cell.step_ms);
    let rss = |c, n, v| med(c, n, v, &|cell| &cell.rss);
    let mut headline = serde_json::Map::new();
    for c in ["a", "b"] {
        for n in [2, 4] {
            headline.insert(
                format!("mpi_rtp_over_ddp_step_{c}_n{n}"),
                json!(step(c, n, Variant::RTP_OUT_OF_PLACE) / step(c, n, Variant::DDP)),
            );
        }
        for n in [2, 4] {
            headline.insert(
                format!("mpi_ddp_over_unbucketed_ddp_step_{c}_n{n}"),
                json!(step(c, n, Variant::DDP) / step(c, n, Variant::DDP_UNBUCKETED)),
            );
        }
        headline.insert(
            format!("mpi_rtp_over_fsdp_step_{c}_n4"),
            json!(step(c, 4, Variant::RTP_OUT_OF_PLACE) / step(c, 4, Variant::FSDP)),
        );
    }
    headline.insert(
        "mpi_rtp_over_ddp_rss_b_n4".into(),
        json!(rss("b", 4, Variant::RTP_OUT_OF_PLACE) / rss("b", 4, Variant::DDP)),
    );
    // DDP hides its all-reduces under the backward: the wire time its rank did not spend
    // waiting for them (its only waits are for the buckets at the step, and for the few
    // collectives of its own thread).
    headline.insert(
        "mpi_ddp_hidden_fraction_b_n4".into(),
        json!(1.0 - med("b", 4, Variant::DDP, &|cell| &cell.in_waits)),
    );
    // FSDP's prefetched gathers run on the worker while the layer before computes; what its
    // rank still waited for is the rest.
    headline.insert(
        "mpi_fsdp_hidden_fraction_b_n4".into(),
        json!(1.0 - med("b", 4, Variant::FSDP, &|cell| &cell.in_waits)),
    );
    headline.insert(
        "mpi_overlap_fraction_b_n4".into(),
        json!(med("b", 4, Variant::RTP_OUT_OF_PLACE, &|cell| &cell.overlap)),
    );

    if cfg.pytorch.is_some() {
        let steps = |c: &'static str, v: Variant, name: &str| {
            step(c, 4, v) / by_name(c, 4, name, &|cell| &cell.step_ms)
        };
        for (key, value) in [
            (
                "mpi_rtp_over_pytorch_ddp_step_a_n4",
                steps("a", Variant::RTP_OUT_OF_PLACE, "pytorch-ddp"),
            ),
            (
                "mpi_rtp_over_pytorch_ddp_step_b_n4",
                steps("b", Variant::RTP_OUT_OF_PLACE, "pytorch-ddp"),
            ),
            (
                "mpi_ddp_over_pytorch_ddp_step_a_n4",
                steps("a", Variant::DDP, "pytorch-ddp"),
            ),
            (
                "mpi_ddp_over_pytorch_ddp_step_b_n4",
                steps("b", Variant::DDP, "pytorch-ddp"),
            ),
            (
                "mpi_fsdp_over_pytorch_fsdp_step_b_n4",
                steps("b", Variant::FSDP, "pytorch-fsdp"),
            ),
            (
                "mpi_rtp_over_pytorch_fsdp_step_b_n4",
                steps("b", Variant::RTP_OUT_OF_PLACE, "pytorch-fsdp"),
            ),
            (
                "mpi_rtp_over_pytorch_ddp_rss_b_n4",
                rss("b", 4, Variant::RTP_OUT_OF_PLACE)
                    / by_name("b", 4, "pytorch-ddp", &|cell| &cell.rss),
            ),
        ] {
            headline.insert(key.into(), json!(value));
        }
    }
    let capacity = &m.capacity;
    headline.insert(
        "mpi_capacity_rtp_over_ddp_n4".into(),
        json!(capacity[1].2 as f64 / capacity[0].2 as f64),
    );
    for (key, value) in m.activations.figures().as_object().expect("an object") {
        headline.insert(key.clone(), value.clone());
    }
    let worst = |key: &str| {
        m.planner_rows
            .iter()
            .filter_map(|r| r[key].as_f64())
            .map(f64::abs)
            .fold(0.0, f64::max)
    };
    headline.insert(
        "planner_max_rel_error_rss".into(),
        json!(worst("rel_error_rss")),
    );
    headline.insert(
        "planner_max_rel_error_rss_default_malloc".into(),
        json!(worst("rel_error_rss_default_malloc")),
    );
    headline
}

/// Each cell's jobs, the planner's rows, capacity, the PyTorch peer (if any), the activation
/// section's jobs and a note on the machine.
pub(super) fn details(cfg: &MpiReportConfig, m: &Measured) -> Map<String, Value> {
    let mut report = Map::new();
    report.insert("cells".into(), json!(cells::details(&m.cells)));
    report.insert("planner".into(), json!(m.planner_rows));
    report.insert("capacity".into(), json!(m.capacity
        .iter()
        .map(|(v, model, p)| json!({"strategy": v.name(), "ranks": CAPACITY_N, "d_model": model.d_model, "layers": model.layers, "params": p}))
        .collect::<Vec<_>>()));
    report.insert(
        "capacity_limit_bytes_per_process".into(),
        json!(cfg.capacity_limit_bytes),
    );
    if let Some(python) = &cfg.pytorch {
        // What the peer's processes said they ran (torch version, backend, threads).
        let version: BTreeSet<&String> = m
            .cells
            .iter()
            .filter(|((_, _, name), _)| name.starts_with("pytorch"))
            .flat_map(|(_, cell)| &cell.progress)
            .collect();
        report.insert(
            "pytorch".into(),
            json!({
                "python": python,
                "script": "benches/peers/pytorch/gpt_peer.py",
                "version": version.into_iter().cloned().collect::<Vec<_>>().join("; "),
                "command": format!("scaling-report --transport mpi --pytorch {}", python.display()),
            }),
        );
    }
    report.insert("activation_checkpointing".into(), m.activations.cells());
    let most = cfg.ranks.iter().copied().max().unwrap_or(0);
    let cores = std::thread::available_parallelism().map_or(0, |p| p.get());
    // Each rank runs a compute thread and a communication thread.
    let sharing = if 2 * most > cores {
        "ranks share cores, so step times include time-slicing, and a message's copy (CPU work of the receiving process) can overlap compute only by taking turns with it on a core"
    } else {
        "a core for each rank's compute and communication threads, unless mpirun's binding (one core per process at -np 2) puts them on one"
    };
    report.insert("machine_note".into(), json!(format!(
        "up to {most} processes per job on {cores} cores: {sharing}; \
         RSS is each process's VmHWM; overlap uses the MPI transport's own timestamps of when received bytes were moving; \
         wire in waits is the share of that time during which the receiving rank was blocked on a transfer instead of working"
    )));
    report
}
