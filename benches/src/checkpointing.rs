//! The scaling report's activation section: RTP with and without Burn's balanced activation
//! checkpointing (`Autodiff<Rtp<NdArray>, BalancedCheckpointing>`), side by side on config
//! A, and the memory planner's checkpointed predictions against the ledger.

use crate::planner_check::{self, PlanPoint, PlanRow};
use crate::{median, Case, Driver, Variant};
use burn_rtp::{human_bytes, ActivationCheckpointing, MemoryStats};
use burn_rtp_gpt::GptConfig;
use serde::Serialize;
use serde_json::{json, Value};

/// The section's heading in `report.md`.
pub const HEADING: &str = "## Activations: balanced activation checkpointing";

/// What the section measures.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The model (config A in the full report).
    pub model: GptConfig,
    /// Sequences per rank.
    pub batch_per_rank: usize,
    /// World sizes; the key figures are read at N = 4.
    pub ranks: Vec<usize>,
    /// Timing samples per setting, taken in alternation.
    pub rounds: usize,
    /// Steps per timing sample.
    pub steps: usize,
    /// Where the checkpointed predictions are checked against the ledger.
    pub planner_grid: Vec<PlanPoint>,
}

impl Settings {
    /// Config A (d_model 256, 4 layers, context 64, 8 sequences per rank) at N = 2, 4, 8,
    /// and the planner's full grid.
    pub fn full() -> Self {
        Self {
            model: crate::models::config_a(),
            batch_per_rank: 8,
            ranks: vec![2, 4, 8],
            rounds: 7,
            steps: 2,
            planner_grid: planner_check::full_grid(),
        }
    }

    /// A seconds-long version for tests (a tiny model under config A's keys).
    pub fn tiny() -> Self {
        Self {
            model: GptConfig::new(8, 24, 2, 2),
            batch_per_rank: 2,
            ranks: vec![4],
            rounds: 2,
            steps: 1,
            planner_grid: planner_check::tiny_grid(),
        }
    }
}

/// One setting at one world size: rank 0's figures and the worst rank's peak.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Ranks.
    pub ranks: usize,
    /// `none` or `balanced`.
    pub activation_checkpointing: String,
    /// Median step time over the alternating samples (ms).
    pub step_ms_median: f64,
    /// Fastest sample (ms).
    pub step_ms_min: f64,
    /// Slowest sample (ms).
    pub step_ms_max: f64,
    /// The worst rank's ledger peak over the timed steps.
    pub peak: MemoryStats,
    /// Exchanges with other ranks per step (rank 0).
    pub exchanges_per_step: f64,
}

/// The section's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct Section {
    /// Both settings at every world size.
    pub rows: Vec<Row>,
    /// The planner's checkpointed predictions against the ledger.
    pub planner: Vec<PlanRow>,
}

const SETTINGS: [ActivationCheckpointing; 2] = [
    ActivationCheckpointing::None,
    ActivationCheckpointing::Balanced,
];

/// Measures both settings side by side at every world size, then the planner's grid.
pub fn run(settings: &Settings, log: &dyn Fn(&str)) -> Result<Section, Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    for &ranks in &settings.ranks {
        let mut drivers = Vec::new();
        for ac in SETTINGS {
            let mut d = Driver::start(Case {
                variant: Variant::RTP_OUT_OF_PLACE,
                ranks,
                model: settings.model.clone(),
                batch: settings.batch_per_rank * ranks,
                memory_cap: None,
                shard_threshold: None,
                activation_checkpointing: ac,
            })?;
            // A warm-up step, so that Adam's moments exist before the peak window opens.
            d.steps(1)?;
            d.reset_peaks()?;
            drivers.push((ac, d));
        }
        let mut samples = vec![Vec::new(); drivers.len()];
        for round in 0..settings.rounds {
            let n = drivers.len();
            for k in 0..n {
                // Alternate which setting goes first.
                let i = if round % 2 == 0 { k } else { n - 1 - k };
                let s = drivers[i].1.steps(settings.steps)? / settings.steps as f64;
                samples[i].push(s * 1e3);
            }
        }
        for (i, (ac, d)) in drivers.iter_mut().enumerate() {
            let peak = d.worst_peak()?;
            let exchanges = d.exchanges_per_step(1)?;
            let s = &samples[i];
            log(&format!(
                "activations: N={ranks} {ac:<8} step {:>7.1} ms, peak {} (local {}), {exchanges} exchanges per step",
                median(s),
                human_bytes(peak.total),
                human_bytes(peak.local)
            ));
            rows.push(Row {
                ranks,
                activation_checkpointing: ac.to_string(),
                step_ms_median: median(s),
                step_ms_min: s.iter().copied().fold(f64::INFINITY, f64::min),
                step_ms_max: s.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                peak,
                exchanges_per_step: exchanges,
            });
        }
    }
    log("activations: the planner's checkpointed predictions against the ledger");
    let planner = planner_check::run(
        &settings.planner_grid,
        ActivationCheckpointing::Balanced,
        log,
    )?;
    Ok(Section { rows, planner })
}

impl Section {
    fn row(&self, ranks: usize, ac: ActivationCheckpointing) -> Option<&Row> {
        let name = ac.to_string();
        self.rows
            .iter()
            .find(|r| r.ranks == ranks && r.activation_checkpointing == name)
    }

    /// Checkpointed ÷ not, at N = 4, of what `pick` reads.
    fn ratio_n4(&self, pick: fn(&Row) -> f64) -> f64 {
        match (
            self.row(4, ActivationCheckpointing::Balanced),
            self.row(4, ActivationCheckpointing::None),
        ) {
            (Some(b), Some(n)) if pick(n) > 0.0 => pick(b) / pick(n),
            _ => f64::NAN,
        }
    }

    /// The section's headline figures, as top-level keys of `report.json`.
    pub fn figures(&self) -> Value {
        json!({
            "activation_checkpoint_peak_ratio_a_n4": self.ratio_n4(|r| r.peak.total as f64),
            "activation_checkpoint_step_ratio_a_n4": self.ratio_n4(|r| r.step_ms_median),
            "activation_checkpoint_exchange_ratio_a_n4": self.ratio_n4(|r| r.exchanges_per_step),
            "activation_checkpoint_planner_max_rel_error": planner_check::max_rel_error(&self.planner),
        })
    }

    /// The section of `report.md`.
    pub fn markdown(&self, settings: &Settings) -> String {
        let m = &settings.model;
        let mut md = format!(
            "\n{HEADING}\n\nRTP (out-of-place) on d_model {}, {} layer(s), {} heads, context {}, {} sequence(s) per rank, trained on `Autodiff<Rtp<NdArray>>` and on `Autodiff<Rtp<NdArray>, BalancedCheckpointing>` in one run, the two alternating ({} samples of {} step(s) each, after a warm-up step). Burn's balanced strategy recomputes memory-bound ops (LayerNorm, GELU, softmax, reshapes) in the backward pass and keeps the outputs of compute-bound ones (matmuls, Linears): no weight rotates twice, and the losses are the same to the bit. A Linear whose input is recomputed sends its weight gradient around the ring in a pass of its own, the extra exchanges below. Peaks are the ledger's (bytes alive, worst rank); ranks are threads of one process here, so the process's resident set is in the MPI report.\n\n| N | checkpointing | step (ms) median [min–max] | peak | local (activations) | exchanges / step |\n|---|---|---|---|---|---|\n",
            m.d_model, m.layers, m.heads, m.seq, settings.batch_per_rank, settings.rounds, settings.steps
        );
        for r in &self.rows {
            md += &format!(
                "| {} | {} | {:.1} [{:.1}–{:.1}] | {} | {} | {} |\n",
                r.ranks,
                r.activation_checkpointing,
                r.step_ms_median,
                r.step_ms_min,
                r.step_ms_max,
                human_bytes(r.peak.total),
                human_bytes(r.peak.local),
                r.exchanges_per_step
            );
        }
        md += &format!(
            "\nThe memory planner with `Planner::with_checkpointed_probe`, probed at N = 1 under balanced checkpointing, against the ledger's peak of a two-step checkpointed run at each point (4 sequences per rank). Largest |error|: {:.1}%.\n\n| d_model | layers | context | N | strategy | predicted peak | measured peak | error |\n|---|---|---|---|---|---|---|---|\n",
            planner_check::max_rel_error(&self.planner) * 100.0
        );
        for r in &self.planner {
            md += &format!(
                "| {} | {} | {} | {} | {} | {} | {} | {:+.1}% |\n",
                r.d_model,
                r.layers,
                r.seq,
                r.ranks,
                r.strategy,
                human_bytes(r.predicted_total),
                human_bytes(r.measured_total),
                r.rel_error * 100.0
            );
        }
        md
    }
}
