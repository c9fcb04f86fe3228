//! What moves for a sharded Linear, under MPI: RTP with its weight shards rotating, RTP with
//! each rank's activations routed to the shards' owners (`Routing::Activations`), and RTP
//! choosing per pass (`Routing::Auto`), at configs A and B on N = 4 processes, each as its
//! own `mpirun` job, the cells alternating.
//! Step times between barriers, and the bytes each rank's transport sent per step (its own
//! count). Added to the MPI report by `scaling-report --transport mpi --routing`.

use crate::mpi_report::{run_job, MpiReportConfig};
use crate::runner::add_section;
use crate::{median, Variant};
use burn_rtp::human_bytes;
use serde_json::{json, Map, Value};
use std::path::Path;

/// Heading of the report section this module writes.
pub const HEADING: &str =
    "## What moves under MPI: weights rotating, activations routed, or per pass (N = 4)";

/// The key of these figures in `report.json`.
pub const KEY: &str = "mpi_routing_n4";

/// Processes per job.
const RANKS: usize = 4;

/// The ways, rotation (the baseline) first.
const WAYS: [Variant; 3] = [
    Variant::RTP_OUT_OF_PLACE,
    Variant::RTP_ROUTED,
    Variant::RTP_AUTO,
];

/// One cell's samples: step times (ms) and bytes sent per step by the median rank.
#[derive(Default)]
struct Samples {
    step_ms: Vec<f64>,
    sent: Vec<f64>,
}

/// Runs `repeats` rounds of the six jobs (configs A and B, each every way; the order rotating
/// each round) with the MPI report's settings `cfg`; `exe` is the `scaling-report` binary that
/// `mpirun` starts as the workers.
pub fn measure(
    cfg: &MpiReportConfig,
    exe: &Path,
    repeats: usize,
    log: &dyn Fn(&str),
) -> Result<Value, Box<dyn std::error::Error>> {
    let scratch = cfg.out.join("jobs");
    std::fs::create_dir_all(&scratch)?;
    let mut cells = Vec::new();
    for config in &cfg.configs {
        for variant in WAYS {
            cells.push((config, variant, Samples::default()));
        }
    }
    let n = cells.len();
    for round in 0..repeats {
        for k in 0..n {
            let (config, variant, samples) = &mut cells[(round + k) % n];
            let name = format!("{}-{}", config.name, variant.name());
            let out = scratch.join(format!("routing-{RANKS}-{name}.json"));
            let job = cfg.job(config, *variant, out);
            let r = run_job(exe, RANKS, &job, None, &[])?.ok_or("a job failed")?;
            let step = median(&r.step_s) * 1e3;
            let sent = median(&r.sent_bytes_per_step);
            log(&format!(
                "routing, config {} N={RANKS} {:<10} step {step:>8.1} ms, sent {} per step",
                config.name.to_uppercase(),
                variant.name(),
                human_bytes(sent as u64)
            ));
            samples.step_ms.push(step);
            samples.sent.push(sent);
        }
    }
    let mut out = Map::new();
    let mut rows = Vec::new();
    for (config, variant, s) in &cells {
        rows.push(json!({
            "config": config.name,
            "strategy": variant.name(),
            "step_ms_median": median(&s.step_ms),
            "step_ms_min": s.step_ms.iter().copied().fold(f64::INFINITY, f64::min),
            "step_ms_max": s.step_ms.iter().copied().fold(0.0, f64::max),
            "sent_bytes_per_step": median(&s.sent),
        }));
    }
    for config in &cfg.configs {
        let of = |variant: Variant, pick: fn(&Samples) -> &Vec<f64>| {
            cells
                .iter()
                .find(|c| c.0.name == config.name && c.1 == variant)
                .map_or(f64::NAN, |c| median(pick(&c.2)))
        };
        let c = config.name;
        for (way, name) in [(WAYS[1], "routed"), (WAYS[2], "auto")] {
            let ratio = |pick: fn(&Samples) -> &Vec<f64>| of(way, pick) / of(WAYS[0], pick);
            out.insert(
                format!("rtp_{name}_over_rotated_wire_bytes_{c}_n{RANKS}"),
                json!(ratio(|s| &s.sent)),
            );
            out.insert(
                format!("mpi_rtp_{name}_over_rotated_step_{c}_n{RANKS}"),
                json!(ratio(|s| &s.step_ms)),
            );
        }
    }
    out.insert("ranks".into(), json!(RANKS));
    out.insert("samples".into(), json!(repeats));
    out.insert("steps_per_sample".into(), json!(cfg.steps));
    out.insert("cells".into(), Value::Array(rows));
    Ok(Value::Object(out))
}

/// The report section for `v` (what [`measure`] returned).
pub fn markdown(v: &Value) -> String {
    let mut text = format!(
        "\n{HEADING}\n\n{} jobs per cell of {} timed steps, the cells alternating; median ms \
         per step (min-max) and the bytes the median rank's transport sent per step. On a \
         2-core machine the 4 processes time-share the cores, so a step's time counts every \
         rank's compute and copies, not only the wire.\n\n\
         | config | strategy | step (ms) | sent per step |\n|---|---|---|---|\n",
        v["samples"], v["steps_per_sample"],
    );
    for row in v["cells"].as_array().into_iter().flatten() {
        let f = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
        text += &format!(
            "| {} | {} | {:.1} ({:.1}-{:.1}) | {} |\n",
            row["config"].as_str().unwrap_or("").to_uppercase(),
            row["strategy"].as_str().unwrap_or(""),
            f("step_ms_median"),
            f("step_ms_min"),
            f("step_ms_max"),
            human_bytes(f("sent_bytes_per_step") as u64),
        );
    }
    let r = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    for name in ["routed", "auto"] {
        text += &format!("\n{name} / rotated:");
        for c in ["a", "b"] {
            let (bytes, step) = (
                format!("rtp_{name}_over_rotated_wire_bytes_{c}_n4"),
                format!("mpi_rtp_{name}_over_rotated_step_{c}_n4"),
            );
            if v.get(&bytes).is_some() {
                text += &format!(
                    " bytes `{bytes}` **{:.3}**, step `{step}` **{:.2}**;",
                    r(&bytes),
                    r(&step)
                );
            }
        }
        text.pop();
        text += ".\n";
    }
    text
}

/// Measures and adds the section to the MPI report in `cfg.out`; returns a one-line summary.
pub fn add_to_report(
    cfg: &MpiReportConfig,
    exe: &Path,
    repeats: usize,
    log: &dyn Fn(&str),
) -> Result<String, Box<dyn std::error::Error>> {
    let v = measure(cfg, exe, repeats, log)?;
    add_section(&cfg.out, HEADING, &markdown(&v), KEY, &v)?;
    let r = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Ok(format!(
        "over rotation at N = {RANKS}: routed B bytes {:.3}, step {:.2}; auto B step {:.2}, A \
         step {:.2}",
        r("rtp_routed_over_rotated_wire_bytes_b_n4"),
        r("mpi_rtp_routed_over_rotated_step_b_n4"),
        r("mpi_rtp_auto_over_rotated_step_b_n4"),
        r("mpi_rtp_auto_over_rotated_step_a_n4"),
    ))
}
