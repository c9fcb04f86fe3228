//! RTP choosing per pass (`Routing::Auto`) over a shaped link: config B at N = 2 hosts on the
//! 1 Gbit/s link, beside DDP and RTP with its weights rotating, the three alternating job by
//! job. At B a rank's tokens weigh far less than its weights, so `Auto` routes every Linear
//! and sends a small part of rotation's bytes, where the link is what a step waits for. Added
//! to the shaped-network report by `scaling-report --transport mpi --net --routing` (with
//! `--routing-only`, without measuring the rest of the report again).

use super::measure::{net_job, Sample};
use super::probe::{cluster, probe_link};
use super::{Link, NetReportConfig};
use crate::mpi_report::{job_output, worker_command};
use crate::runner::{add_section, Failure};
use crate::Variant;
use burn_rtp::human_bytes;
use serde_json::{json, Map, Value};
use std::path::Path;

/// The section's heading in `report.md`.
pub const HEADING: &str = "## RTP choosing per pass over a shaped link (config B, N = 2, 1 Gbit/s)";

/// The section's key in `report.json`.
pub const KEY: &str = "net_routing_b_n2";

/// Hosts, one rank each.
const RANKS: usize = 2;

/// The link.
const LINK: Link = Link::Mbit(1000);

/// The ways, in their first order: DDP (the baseline), rotation, `Auto`.
const WAYS: [Variant; 3] = [Variant::DDP, Variant::RTP_OUT_OF_PLACE, Variant::RTP_AUTO];

/// Probes the link, then runs `repeats` rounds of the three jobs on the report's config B
/// cell at N = 2 (the order rotating each round); `exe` is the `scaling-report` binary.
pub fn measure(
    cfg: &NetReportConfig,
    exe: &Path,
    repeats: usize,
    log: &dyn Fn(&str),
) -> Result<Value, Failure> {
    let cell = (cfg.cells.iter())
        .find(|c| c.config.name == "b" && c.ranks == RANKS)
        .ok_or("the shaped-network report has no config B cell at N = 2")?;
    let scratch = cfg.out.join("jobs");
    std::fs::create_dir_all(&scratch)?;
    let gbit = probe_link(cfg, exe, LINK, &scratch)?;
    log(&format!(
        "link {}: the probe moved {gbit:.3} Gbit/s",
        LINK.label()
    ));
    let mut samples = vec![Sample::default(); WAYS.len()];
    for round in 0..repeats {
        for k in 0..WAYS.len() {
            let i = (round + k) % WAYS.len();
            let variant = WAYS[i];
            let job = net_job(cfg, &cell.config, variant, scratch.join("net-routing.json"));
            let what = format!(
                "{} on config B over {RANKS} hosts at {}",
                variant.name(),
                LINK.label()
            );
            let cmd = worker_command(cluster(cfg, RANKS, LINK), exe, &job);
            let r = job_output(cmd, &job, &what, false)?.expect("failures are errors");
            samples[i].add(&r);
            log(&format!(
                "{what}: step {:>8.1} ms, {} sent per rank per step",
                samples[i].step_ms.last().copied().unwrap_or(f64::NAN),
                human_bytes(*samples[i].sent_bytes.last().unwrap_or(&0.0) as u64)
            ));
        }
    }
    let mut out = Map::new();
    out.insert("ranks".into(), json!(RANKS));
    out.insert("link".into(), json!(LINK.label()));
    out.insert("probed_gbit".into(), json!(gbit));
    out.insert("samples".into(), json!(repeats));
    out.insert("steps_per_sample".into(), json!(cfg.steps));
    let rows: Vec<Value> = WAYS
        .iter()
        .zip(&samples)
        .map(|(v, s)| {
            json!({
                "strategy": v.name(),
                "step_ms_median": s.step(),
                "step_ms_min": s.step_ms.iter().copied().fold(f64::INFINITY, f64::min),
                "step_ms_max": s.step_ms.iter().copied().fold(0.0, f64::max),
                "sent_bytes_per_step": crate::median(&s.sent_bytes),
            })
        })
        .collect();
    out.insert("cells".into(), Value::Array(rows));
    let step = |i: usize| samples[i].step();
    let sent = |i: usize| crate::median(&samples[i].sent_bytes);
    out.insert(
        "net_rtp_auto_over_ddp_step_b_n2_1gbit".into(),
        json!(step(2) / step(0)),
    );
    out.insert(
        "net_rtp_rotated_over_ddp_step_b_n2_1gbit".into(),
        json!(step(1) / step(0)),
    );
    out.insert(
        "net_rtp_auto_over_rotated_wire_bytes_b_n2".into(),
        json!(sent(2) / sent(1)),
    );
    Ok(Value::Object(out))
}

/// The section's markdown for `v` (what [`measure`] returned).
pub fn markdown(v: &Value) -> String {
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let mut text = format!(
        "\n{HEADING}\n\nThe link's probe moved {:.3} Gbit/s. {} jobs per way of {} timed steps, \
         the ways alternating; median ms per step (min-max) and the bytes each rank's \
         transport sent per step (mean over ranks, median over jobs).\n\n\
         | strategy | step (ms) | sent per step |\n|---|---|---|\n",
        f("probed_gbit"),
        v["samples"],
        v["steps_per_sample"],
    );
    for row in v["cells"].as_array().into_iter().flatten() {
        let g = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
        text += &format!(
            "| {} | {:.1} ({:.1}-{:.1}) | {} |\n",
            row["strategy"].as_str().unwrap_or(""),
            g("step_ms_median"),
            g("step_ms_min"),
            g("step_ms_max"),
            human_bytes(g("sent_bytes_per_step") as u64),
        );
    }
    let keys = [
        "net_rtp_auto_over_ddp_step_b_n2_1gbit",
        "net_rtp_rotated_over_ddp_step_b_n2_1gbit",
    ];
    text += &format!(
        "\nStep over DDP's: `Auto` `{}` **{:.2}**, rotation `{}` **{:.2}**. `Auto` sends \
         `net_rtp_auto_over_rotated_wire_bytes_b_n2` **{:.3}** of rotation's bytes.\n",
        keys[0],
        f(keys[0]),
        keys[1],
        f(keys[1]),
        f("net_rtp_auto_over_rotated_wire_bytes_b_n2"),
    );
    text
}

/// Measures and adds the section to the shaped-network report in `cfg.out`; returns a
/// one-line summary.
pub fn add_to_report(
    cfg: &NetReportConfig,
    exe: &Path,
    repeats: usize,
    log: &dyn Fn(&str),
) -> Result<String, Failure> {
    let v = measure(cfg, exe, repeats, log)?;
    add_section(&cfg.out, HEADING, &markdown(&v), KEY, &v)?;
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Ok(format!(
        "step over DDP's: Auto {:.2}, rotation {:.2}; Auto sends {:.3} of rotation's bytes",
        f("net_rtp_auto_over_ddp_step_b_n2_1gbit"),
        f("net_rtp_rotated_over_ddp_step_b_n2_1gbit"),
        f("net_rtp_auto_over_rotated_wire_bytes_b_n2"),
    ))
}
