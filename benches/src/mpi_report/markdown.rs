//! The MPI report's `report.md`.

use super::cells::Cell;
use super::MpiReportConfig;
use crate::median;
use burn_rtp::human_bytes;
use serde_json::Value;
use std::collections::BTreeMap;

/// `report.md`: the models, the figures tables, every cell, capacity, the planner and notes
/// (the activation section follows it).
pub(super) fn markdown(
    cfg: &MpiReportConfig,
    report: &Value,
    cells: &BTreeMap<(&str, usize, &str), Cell>,
) -> String {
    let mut md = String::from("# Scaling report: one MPI process per rank\n\n");
    md += &format!(
        "Each cell is {} job(s) of `mpirun -np N`, strategies alternating; a job times {} step(s) after {} warm-up step(s), barrier to barrier. Medians, with the spread (min–max) across jobs.\n\n",
        cfg.repeats, cfg.steps, cfg.warmup
    );
    // The targets are set for the configurations; say which models these figures
    // come from, so that a quick run's small models are not read as configurations A and B.
    for c in &cfg.configs {
        md += &format!(
            "* config {}: d_model {}, {} layer(s), {} heads, context {}, {} sequence(s) per rank\n",
            c.name.to_uppercase(),
            c.model.d_model,
            c.model.layers,
            c.model.heads,
            c.model.seq,
            c.batch_per_rank
        );
    }
    md += "\n";
    md += &crate::figures::targets_table(crate::figures::MPI, report);
    if let Some(peer) = report.get("pytorch") {
        md += &format!(
            "\nAgainst PyTorch ({}; `{}`), its DDP and FSDP2 on gloo run as the cells' `pytorch-ddp` and `pytorch-fsdp` jobs, alternating with ours, one process per rank, on the same models, batches and optimizer (Adam):\n\n",
            peer["version"].as_str().unwrap_or("?"),
            peer["command"].as_str().unwrap_or("?"),
        );
        md += &crate::figures::targets_table(crate::figures::MPI_PYTORCH, report);
    }
    md += &format!(
        "\nEach process's communication thread paces its tests of transfers in flight as `--mpi-progress {}` asks (spin: back to back while bytes are in flight; backoff: sleeps of up to 200 µs), and asks the kernel for a 100 µs scheduler slice, so that it gets a core as soon as it wakes (taken on Linux 6.12 and later). The last column shows what each cell's processes ran.\n",
        cfg.mpi_progress
    );
    md += "\n| config | N | strategy | params | step (ms) median [min–max] | peak RSS / process | ledger peak | overlap | wire in waits | MPI progress |\n|---|---|---|---|---|---|---|---|---|---|\n";
    for ((c, n, v), cell) in cells {
        let share = |x: &[f64]| {
            if x.is_empty() {
                "–".to_string()
            } else {
                format!("{:.2}", median(x))
            }
        };
        let span = |x: &[f64]| {
            let lo = x.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.1} [{lo:.1}–{hi:.1}]", median(x))
        };
        md += &format!(
            "| {} | {n} | {v} | {} | {} | {} | {} | {} | {} | {} |\n",
            c.to_uppercase(),
            cell.params,
            span(&cell.step_ms),
            human_bytes(median(&cell.rss) as u64),
            human_bytes(median(&cell.ledger) as u64),
            share(&cell.overlap),
            share(&cell.in_waits),
            cell.progress
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(" \\| ")
        );
    }
    md += &format!(
        "\nCapacity: the largest candidate model that trains 3 steps at N=4 with every process under `prlimit --as={}` ({}).\n\n",
        cfg.capacity_limit_bytes,
        human_bytes(cfg.capacity_limit_bytes)
    );
    for c in report["capacity"].as_array().into_iter().flatten() {
        md += &format!(
            "* {}: d_model {}, {} layer(s), {} parameters\n",
            c["strategy"].as_str().unwrap_or("?"),
            c["d_model"],
            c["layers"],
            c["params"]
        );
    }
    md += "\n## Memory planner against the resident set\n\nThe planner probes each model on one rank in-process (N = 1) and predicts rank 0's peak at N; each job trains 3 steps (FSDP prefetches from the third) and its rank 0 reports its peak resident set (`VmHWM`) minus what it was just before the model was built. Each job runs twice: with glibc's mmap threshold fixed at 128 KiB (`MALLOC_MMAP_THRESHOLD_=131072`), so that freed tensors leave the resident set, and with glibc's default, whose rising threshold keeps freed tensors resident in its heap.\n\n| d_model | layers | context | N | strategy | predicted peak | RSS growth | error | RSS growth, default malloc | error | ledger peak |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in report["planner"].as_array().into_iter().flatten() {
        let bytes = |k: &str| human_bytes(r[k].as_u64().unwrap_or(0));
        md += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:+.1}% | {} | {:+.1}% | {} |\n",
            r["d_model"],
            r["layers"],
            r["seq"],
            r["ranks"],
            r["strategy"].as_str().unwrap_or("?"),
            bytes("predicted_total"),
            bytes("rss_growth"),
            r["rel_error_rss"].as_f64().unwrap_or(f64::NAN) * 100.0,
            bytes("rss_growth_default_malloc"),
            r["rel_error_rss_default_malloc"]
                .as_f64()
                .unwrap_or(f64::NAN)
                * 100.0,
            bytes("ledger_total"),
        );
    }
    let timelines = if cfg.timelines {
        "\n* Each timed job's ranks wrote their timelines (compute, waits, and when received bytes were moving, in seconds from the first timed step): `jobs/timeline-<config>-<N>-<strategy>-<job>.rank<r>.json`."
    } else {
        ""
    };
    md += &format!(
        "\n## Notes\n\n* {}.\n* The ledger counts what the decorator holds; the RSS also holds the allocator's free lists, the inner backend's buffers, the MPI library and the program itself.{timelines}\n\nPlots: `mpi_step_time.svg`, `mpi_rss.svg`, `mpi_capacity.svg`.\n",
        report["machine_note"].as_str().unwrap_or("")
    );
    md
}
