//! The MPI report's activation section: RTP on config A at N = 4 with and without balanced
//! activation checkpointing, the settings alternating.

use super::cells::{summary, Cell};
use super::launch::run_job;
use super::{Config, Job, MpiReportConfig};
use crate::{median, Variant};
use burn_rtp::{human_bytes, ActivationCheckpointing};
use serde_json::{json, Value};
use std::path::Path;

/// The activation section's heading in `report.md`.
pub const ACTIVATION_HEADING: &str = "## Activations: balanced activation checkpointing";

/// RTP on config A at N = 4 with and without balanced activation checkpointing: each
/// setting's jobs, the settings alternating.
pub struct Activations {
    /// The configuration measured.
    config: Config,
    ranks: usize,
    /// Per setting (`none`, `balanced`): step (ms), peak RSS and ledger peak (bytes) per job.
    cells: Vec<(ActivationCheckpointing, Cell)>,
}

/// Runs the activation section's jobs: config A's RTP (out-of-place) at N = 4, once per
/// repeat under each setting, alternating which goes first.
pub fn activation_cells(
    cfg: &MpiReportConfig,
    exe: &Path,
    log: &dyn Fn(&str),
) -> Result<Activations, Box<dyn std::error::Error>> {
    let scratch = cfg.out.join("jobs");
    std::fs::create_dir_all(&scratch)?;
    let config = cfg
        .configs
        .iter()
        .find(|c| c.name == "a")
        .ok_or("the MPI report has no config A")?
        .clone();
    let ranks = 4;
    let settings = [
        ActivationCheckpointing::None,
        ActivationCheckpointing::Balanced,
    ];
    let mut cells: Vec<(ActivationCheckpointing, Cell)> =
        settings.iter().map(|&ac| (ac, Cell::default())).collect();
    for repeat in 0..cfg.repeats {
        for k in 0..settings.len() {
            let i = if repeat % 2 == 0 {
                k
            } else {
                settings.len() - 1 - k
            };
            let ac = settings[i];
            let out = scratch.join(format!("activations-{ac}.json"));
            let job = Job {
                activation_checkpointing: ac,
                ..cfg.job(&config, Variant::RTP_OUT_OF_PLACE, out)
            };
            let r = run_job(exe, ranks, &job, None, &[])?.expect("failures are errors here");
            let step = median(&r.step_s) * 1e3;
            let rss = r.peak_rss_bytes.iter().copied().max().unwrap_or(0);
            let ledger = r.ledger_peak_bytes.iter().copied().max().unwrap_or(0);
            log(&format!(
                "activations: config A N={ranks} rtp-oop {ac:<8} step {step:>8.1} ms, peak RSS {} (ledger {})",
                human_bytes(rss),
                human_bytes(ledger)
            ));
            let cell = &mut cells[i].1;
            cell.step_ms.push(step);
            cell.rss.push(rss as f64);
            cell.ledger.push(ledger as f64);
            cell.params = r.params;
        }
    }
    Ok(Activations {
        config,
        ranks,
        cells,
    })
}

impl Activations {
    fn median_of(&self, ac: ActivationCheckpointing, pick: fn(&Cell) -> &Vec<f64>) -> f64 {
        self.cells
            .iter()
            .find(|(a, _)| *a == ac)
            .map_or(f64::NAN, |(_, c)| median(pick(c)))
    }

    fn ratio(&self, pick: fn(&Cell) -> &Vec<f64>) -> f64 {
        self.median_of(ActivationCheckpointing::Balanced, pick)
            / self.median_of(ActivationCheckpointing::None, pick)
    }

    /// The section's headline figures (checkpointed ÷ not, medians over jobs).
    pub fn figures(&self) -> Value {
        json!({
            "mpi_activation_checkpoint_rss_ratio_a_n4": self.ratio(|c| &c.rss),
            "mpi_activation_checkpoint_ledger_ratio_a_n4": self.ratio(|c| &c.ledger),
            "mpi_activation_checkpoint_step_ratio_a_n4": self.ratio(|c| &c.step_ms),
        })
    }

    /// Each setting's jobs, summarised, for `report.json`.
    pub fn cells(&self) -> Value {
        json!(self
            .cells
            .iter()
            .map(|(ac, c)| json!({
                "config": self.config.name, "ranks": self.ranks, "strategy": "rtp-oop",
                "activation_checkpointing": ac.to_string(), "params": c.params,
                "step_ms": summary(&c.step_ms),
                "peak_rss_bytes": summary(&c.rss),
                "ledger_peak_bytes": summary(&c.ledger),
            }))
            .collect::<Vec<_>>())
    }

    /// The section of `report.md`.
    pub fn markdown(&self, cfg: &MpiReportConfig) -> String {
        let m = &self.config.model;
        let mut md = format!(
            "\n{ACTIVATION_HEADING}\n\nRTP (out-of-place), d_model {}, {} layer(s), context {}, {} sequence(s) per rank, at N = {}: {} job(s) of `mpirun -np {}` per setting, the settings alternating; a job times {} step(s) after {} warm-up step(s). `balanced` trains on `Autodiff<Rtp<NdArray>, BalancedCheckpointing>`, which recomputes memory-bound ops in the backward pass. Peak RSS is each process's VmHWM (the largest of the job's processes), which also holds the program, Open MPI and the allocator's free lists: memory that checkpointing does not touch.\n\n| checkpointing | step (ms) median [min–max] | peak RSS / process | ledger peak |\n|---|---|---|---|\n",
            m.d_model, m.layers, m.seq, self.config.batch_per_rank, self.ranks, cfg.repeats, self.ranks, cfg.steps, cfg.warmup
        );
        for (ac, c) in &self.cells {
            let min = c.step_ms.iter().copied().fold(f64::INFINITY, f64::min);
            let max = c.step_ms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            md += &format!(
                "| {ac} | {:.1} [{min:.1}–{max:.1}] | {} | {} |\n",
                median(&c.step_ms),
                human_bytes(median(&c.rss) as u64),
                human_bytes(median(&c.ledger) as u64)
            );
        }
        md
    }
}
