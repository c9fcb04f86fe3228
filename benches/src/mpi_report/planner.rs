//! The memory planner's predictions against each process's resident set under `mpirun`.

use super::launch::run_job;
use super::{Job, STRATEGIES};
use crate::InnerBackend;
use burn::backend::NdArray;
use burn_rtp::{human_bytes, ActivationCheckpointing, MpiProgress};
use serde_json::{json, Value};
use std::path::Path;

/// glibc's mmap threshold fixed at 128 KiB, its starting value. Fixed, every block of that size
/// or more (every tensor of the grid's models but the smallest) is mapped on its own and
/// unmapped when freed, so the resident set follows the bytes alive. By default glibc raises
/// the threshold after each freed mapping (up to 32 MiB) and serves later tensors from its
/// heap, which keeps freed blocks resident: the RSS then also holds memory the program no
/// longer uses, in amounts set by the order of frees, which no shape-based plan can know.
const FIXED_MMAP_THRESHOLD: (&str, &str) = ("MALLOC_MMAP_THRESHOLD_", "131072");

/// The memory planner, probed in this process at N = 1, against each grid point's RSS
/// growth under mpirun (rank 0's `VmHWM` minus its value just before the model was built),
/// each job's communication thread paced as `mpi_progress` asks.
pub fn planner_rows(
    grid: &[crate::planner_check::PlanPoint],
    mpi_progress: MpiProgress,
    exe: &Path,
    scratch: &Path,
    log: &dyn Fn(&str),
) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let mut planner_rows = Vec::new();
    for p in grid {
        let b = p.batch_per_rank;
        // The variants measured rotate their weights.
        let plan_config = burn_rtp::PlanConfig::default()
            .with_batch(b)
            .with_routing(burn_rtp::Routing::Weights);
        let planner = burn_rtp_gpt::plan::probe_gpt::<NdArray>(&p.model, plan_config)?;
        // The planner plans the default DDP (with buckets); the unbucketed one is a baseline.
        for variant in STRATEGIES.into_iter().filter(|v| v.buckets) {
            let prediction = planner.predict(variant.strategy, variant.rotation, p.ranks, b);
            let predicted = prediction.total;
            let job = Job {
                variant,
                model: p.model.clone(),
                batch_per_rank: b,
                warmup: 0,
                steps: 3,
                out: scratch.join(format!("planner-{}.json", variant.name())),
                mpi_progress,
                timeline: None,
                activation_checkpointing: ActivationCheckpointing::None,
                backend: InnerBackend::Ndarray,
                threads: None,
                fused_activations: true,
            };
            // The same job under glibc's default allocator and with its mmap threshold fixed.
            let growth = |env: &[(&str, &str)]| -> Result<(u64, u64), String> {
                let r = run_job(exe, p.ranks, &job, None, env)?.expect("failures are errors here");
                let growth = r.peak_rss_bytes[0].saturating_sub(r.baseline_rss_bytes[0]);
                Ok((growth, r.ledger_peak_bytes[0]))
            };
            let (default_growth, _) = growth(&[])?;
            let (fixed_growth, ledger) = growth(&[FIXED_MMAP_THRESHOLD])?;
            let rel = |growth: u64| (predicted as f64 - growth as f64) / growth.max(1) as f64;
            log(&format!(
                "planner: d_model {} x {} layers, context {}, N = {} {:<7}: predicted {}, RSS growth {} ({:+.1}%; {} {:+.1}% with glibc's default mmap threshold), ledger {}",
                p.model.d_model,
                p.model.layers,
                p.model.seq,
                p.ranks,
                variant.name(),
                human_bytes(predicted),
                human_bytes(fixed_growth),
                rel(fixed_growth) * 100.0,
                human_bytes(default_growth),
                rel(default_growth) * 100.0,
                human_bytes(ledger)
            ));
            planner_rows.push(json!({
                "d_model": p.model.d_model, "layers": p.model.layers, "seq": p.model.seq,
                "ranks": p.ranks, "strategy": variant.name(), "predicted_total": predicted,
                "rss_growth": fixed_growth, "ledger_total": ledger, "rel_error_rss": rel(fixed_growth),
                "rss_growth_default_malloc": default_growth,
                "rel_error_rss_default_malloc": rel(default_growth),
            }));
        }
    }
    Ok(planner_rows)
}
