//! The inner backends under MPI: config A at N = 4 processes, RTP and DDP on NdArray and on
//! Flex, each as its own `mpirun` job, the four alternating; step times between barriers,
//! the ledger's peak and each process's peak resident set. Added to the MPI report by
//! `scaling-report --transport mpi --backends`.

use crate::mpi_report::{run_job, Job, MpiReportConfig};
use crate::runner::add_section;
use crate::{median, InnerBackend, Variant};
use burn_rtp::human_bytes;
use serde_json::{json, Map, Value};
use std::path::Path;

/// Heading of the report section this module writes.
pub const HEADING: &str = "## Inner backends under MPI: NdArray against Flex (config A, N = 4)";

/// The key of these figures in `report.json`.
pub const KEY: &str = "mpi_inner_backends_config_a_n4";

/// Processes per job.
const RANKS: usize = 4;

/// Runs `repeats` rounds of the four jobs (the order rotating each round) with the MPI
/// report's settings `cfg` (its config A, warm-up and steps); `exe` is the `scaling-report`
/// binary that `mpirun` starts as the workers.
pub fn measure(
    cfg: &MpiReportConfig,
    exe: &Path,
    repeats: usize,
    log: &dyn Fn(&str),
) -> Result<Value, Box<dyn std::error::Error>> {
    let a = cfg
        .configs
        .iter()
        .find(|c| c.name == "a")
        .ok_or("the MPI report's settings have no config A")?;
    let scratch = cfg.out.join("jobs");
    std::fs::create_dir_all(&scratch)?;
    let mut cells = Vec::new();
    for variant in [Variant::DDP, Variant::RTP_OUT_OF_PLACE] {
        for backend in InnerBackend::ALL {
            cells.push((variant, backend, Vec::new(), Vec::new(), Vec::new()));
        }
    }
    let n = cells.len();
    for round in 0..repeats {
        for k in 0..n {
            let (variant, backend, steps, ledgers, rss) = &mut cells[(round + k) % n];
            let name = format!("{}-{}", variant.name(), backend.name());
            let out = scratch.join(format!("backends-a-{RANKS}-{name}.json"));
            let job = Job {
                backend: *backend,
                ..cfg.job(a, *variant, out)
            };
            let r = run_job(exe, RANKS, &job, None, &[])?.ok_or("a job failed")?;
            let step = median(&r.step_s) * 1e3;
            let ledger = r.ledger_peak_bytes.iter().copied().max().unwrap_or(0);
            let peak = r.peak_rss_bytes.iter().copied().max().unwrap_or(0);
            log(&format!(
                "backends, config A N={RANKS} {name:<12} step {step:>8.1} ms, peak RSS {} \
                 (ledger {})",
                human_bytes(peak),
                human_bytes(ledger)
            ));
            steps.push(step);
            ledgers.push(ledger as f64);
            rss.push(peak as f64);
        }
    }
    let mut out = Map::new();
    let mut rows = Vec::new();
    for (variant, backend, steps, ledgers, rss) in &cells {
        rows.push(json!({
            "strategy": variant.name(),
            "backend": backend.name(),
            "step_ms_median": median(steps),
            "step_ms_min": steps.iter().copied().fold(f64::INFINITY, f64::min),
            "step_ms_max": steps.iter().copied().fold(0.0, f64::max),
            "ledger_peak_bytes_per_rank": median(ledgers),
            "peak_rss_bytes_per_process": median(rss),
        }));
    }
    for variant in [Variant::DDP, Variant::RTP_OUT_OF_PLACE] {
        let of = |backend: InnerBackend| {
            cells
                .iter()
                .find(|c| c.0 == variant && c.1 == backend)
                .map_or(f64::NAN, |c| median(&c.2))
        };
        let strategy = variant.strategy.to_string();
        out.insert(
            format!("mpi_flex_over_ndarray_step_{strategy}_a_n{RANKS}"),
            json!(of(InnerBackend::Flex) / of(InnerBackend::Ndarray)),
        );
    }
    out.insert("ranks".into(), json!(RANKS));
    out.insert("samples".into(), json!(repeats));
    out.insert("steps_per_sample".into(), json!(cfg.steps));
    out.insert(
        "threads".into(),
        json!(format!(
            "each process computes in a pool of {} thread(s): the host's cores divided by its \
             ranks",
            // All ranks on this host: the rule `RtpConfig` applies under mpirun too.
            burn_rtp::RtpConfig::new(RANKS)
                .with_transport(burn_rtp::TransportKind::InProcess)
                .threads_per_rank_here()
        )),
    );
    out.insert("cells".into(), Value::Array(rows));
    Ok(Value::Object(out))
}

/// The report section for `v` (what [`measure`] returned).
pub fn markdown(v: &Value) -> String {
    let mut text = format!(
        "\n{HEADING}\n\n{} jobs per cell of {} timed steps, the four cells alternating; median \
         ms per step (min-max), the ledger's peak per rank and the largest process's peak \
         resident set. Threads: {}. On a 2-core machine the 4 processes time-share the \
         cores.\n\n| strategy | backend | step (ms) | ledger peak | peak RSS |\n\
         |---|---|---|---|---|\n",
        v["samples"],
        v["steps_per_sample"],
        v["threads"].as_str().unwrap_or("")
    );
    for row in v["cells"].as_array().into_iter().flatten() {
        let f = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
        text += &format!(
            "| {} | {} | {:.1} ({:.1}-{:.1}) | {} | {} |\n",
            row["strategy"].as_str().unwrap_or(""),
            row["backend"].as_str().unwrap_or(""),
            f("step_ms_median"),
            f("step_ms_min"),
            f("step_ms_max"),
            human_bytes(f("ledger_peak_bytes_per_rank") as u64),
            human_bytes(f("peak_rss_bytes_per_process") as u64),
        );
    }
    let r = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    text += &format!(
        "\nFlex / NdArray, step time: `mpi_flex_over_ndarray_step_ddp_a_n4` **{:.2}**; \
         `mpi_flex_over_ndarray_step_rtp_a_n4` **{:.2}**.\n",
        r("mpi_flex_over_ndarray_step_ddp_a_n4"),
        r("mpi_flex_over_ndarray_step_rtp_a_n4"),
    );
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
    Ok(format!(
        "Flex / NdArray at N = {RANKS}: ddp {:.2}, rtp {:.2}",
        v["mpi_flex_over_ndarray_step_ddp_a_n4"]
            .as_f64()
            .unwrap_or(f64::NAN),
        v["mpi_flex_over_ndarray_step_rtp_a_n4"]
            .as_f64()
            .unwrap_or(f64::NAN),
    ))
}
