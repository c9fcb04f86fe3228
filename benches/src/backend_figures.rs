//! The inner backends side by side: config A in-process, single-device training (DDP on one
//! rank) and RTP and DDP at N = 4, each on NdArray and on Flex, in one run with the cells
//! alternating. It says which CPU backend a rank should run on, and what the decorator costs
//! on each.

use crate::runner::add_section;
use crate::{median, models, Case, Driver, InnerBackend, Variant};
use burn::backend::{Flex, NdArray};
use serde_json::{json, Map, Value};
use std::path::Path;

/// Heading of the report section this module writes.
pub const HEADING: &str = "## Inner backends: NdArray against Flex (config A, in-process)";

/// The key of these figures in `report.json`.
pub const KEY: &str = "inner_backends_config_a";

/// One measured cell: a strategy at a world size on one inner backend.
struct Cell {
    backend: InnerBackend,
    label: &'static str,
    ranks: usize,
    driver: Driver,
    times: Vec<f64>,
    peak_bytes: u64,
}

fn start(backend: InnerBackend, case: Case) -> Result<Driver, burn_rtp::RtpError> {
    match backend {
        InnerBackend::Flex => Driver::start_on::<Flex>(case),
        InnerBackend::Ndarray => Driver::start_on::<NdArray>(case),
    }
}

/// Runs `repeats` rounds of `steps` steps in every cell, in an order that rotates each round,
/// and returns the medians (ms per step), the ledger's peak per rank and Flex / NdArray.
pub fn measure(
    repeats: usize,
    steps: usize,
    log: &dyn Fn(&str),
) -> Result<Value, Box<dyn std::error::Error>> {
    let shapes = [
        ("single", Variant::DDP, 1),
        ("ddp", Variant::DDP, 4),
        ("rtp", Variant::RTP_OUT_OF_PLACE, 4),
    ];
    let mut cells = Vec::new();
    for (label, variant, ranks) in shapes {
        for backend in InnerBackend::ALL {
            log(&format!(
                "backends: starting {label} at N = {ranks} on {}",
                backend.name()
            ));
            let case = Case {
                variant,
                ranks,
                model: models::config_a(),
                batch: 8 * ranks,
                memory_cap: None,
                shard_threshold: None,
                activation_checkpointing: burn_rtp::ActivationCheckpointing::None,
            };
            let mut driver = start(backend, case)?;
            driver.steps(1)?; // warm-up: first allocations stay out of the timings
            cells.push(Cell {
                backend,
                label,
                ranks,
                driver,
                times: Vec::new(),
                peak_bytes: 0,
            });
        }
    }
    let n = cells.len();
    for round in 0..repeats {
        for k in 0..n {
            let cell = &mut cells[(round + k) % n];
            cell.driver.reset_peaks()?;
            let seconds = cell.driver.steps(steps)?;
            cell.times.push(seconds / steps as f64 * 1e3);
            let peak = cell.driver.peaks()?.iter().map(|m| m.total).max();
            cell.peak_bytes = cell.peak_bytes.max(peak.unwrap_or(0));
        }
        log(&format!("backends: round {}/{repeats}", round + 1));
    }
    let mut out = Map::new();
    let mut rows = Vec::new();
    for cell in &cells {
        let ms = median(&cell.times);
        let spread = cell
            .times
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), t| (lo.min(*t), hi.max(*t)));
        rows.push(json!({
            "backend": cell.backend.name(),
            "strategy": cell.label,
            "ranks": cell.ranks,
            "step_ms_median": ms,
            "step_ms_min": spread.0,
            "step_ms_max": spread.1,
            "ledger_peak_bytes_per_rank": cell.peak_bytes,
        }));
    }
    for (label, _, ranks) in shapes {
        let of = |backend: InnerBackend| {
            cells
                .iter()
                .find(|c| c.backend == backend && c.label == label && c.ranks == ranks)
                .map(|c| median(&c.times))
                .unwrap_or(f64::NAN)
        };
        out.insert(
            format!("flex_over_ndarray_step_{label}_n{ranks}"),
            json!(of(InnerBackend::Flex) / of(InnerBackend::Ndarray)),
        );
    }
    out.insert(
        "model".into(),
        json!("config A (d_model 256, 4 layers, context 64, 8 sequences per rank)"),
    );
    out.insert("steps_per_sample".into(), json!(steps));
    out.insert("samples".into(), json!(repeats));
    let threads = |ranks| burn_rtp::RtpConfig::new(ranks).threads_per_rank_here();
    out.insert(
        "threads".into(),
        json!(format!(
            "each rank computes in a rayon pool of the host's cores divided by the ranks ({} \
             thread(s) at N = 1, {} at N = 4), which both backends' parallel kernels use",
            threads(1),
            threads(4)
        )),
    );
    out.insert("cells".into(), Value::Array(rows));
    Ok(Value::Object(out))
}

/// The report section for `v` (what [`measure`] returned).
pub fn markdown(v: &Value) -> String {
    let mut text = format!(
        "\n{HEADING}\n\n{} samples of {} steps per cell, the cells alternating; median ms per \
         step (min-max) and the ledger's peak per rank. Threads: {}. On this 2-core machine \
         the 4 ranks of N = 4 time-share the cores.\n\n\
         | strategy | N | backend | step (ms) | peak per rank |\n|---|---|---|---|---|\n",
        v["samples"],
        v["steps_per_sample"],
        v["threads"].as_str().unwrap_or("")
    );
    for row in v["cells"].as_array().into_iter().flatten() {
        let f = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
        text += &format!(
            "| {} | {} | {} | {:.1} ({:.1}-{:.1}) | {} |\n",
            row["strategy"].as_str().unwrap_or(""),
            row["ranks"],
            row["backend"].as_str().unwrap_or(""),
            f("step_ms_median"),
            f("step_ms_min"),
            f("step_ms_max"),
            burn_rtp::human_bytes(row["ledger_peak_bytes_per_rank"].as_u64().unwrap_or(0)),
        );
    }
    text += "\nFlex / NdArray, step time:";
    for key in [
        "flex_over_ndarray_step_single_n1",
        "flex_over_ndarray_step_ddp_n4",
        "flex_over_ndarray_step_rtp_n4",
    ] {
        text += &format!(" `{key}` **{:.2}**;", v[key].as_f64().unwrap_or(f64::NAN));
    }
    text.pop();
    text += ".\n";
    text
}

/// Measures and adds the section to the report in `out`; returns a one-line summary.
pub fn add_to_report(
    out: &Path,
    repeats: usize,
    steps: usize,
    log: &dyn Fn(&str),
) -> Result<String, Box<dyn std::error::Error>> {
    let v = measure(repeats, steps, log)?;
    add_section(out, HEADING, &markdown(&v), KEY, &v)?;
    let r = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Ok(format!(
        "Flex / NdArray: single {:.2}, ddp N=4 {:.2}, rtp N=4 {:.2}",
        r("flex_over_ndarray_step_single_n1"),
        r("flex_over_ndarray_step_ddp_n4"),
        r("flex_over_ndarray_step_rtp_n4"),
    ))
}
