//! The headline figures of each report: one table per report of what it measures against
//! which target, one renderer for those tables, and the generated blocks of `README.md` and
//! `docs/performance.md`.
//!
//! A report computes its headline figures and writes them as top-level keys of its
//! `report.json` (the MPI report builds some of those keys from the config and rank count).
//! The tables below are the only place that says what each key means and what it must reach:
//! the reports' markdown, their key checks (a report missing a key fails) and the
//! documentation's blocks are all read from them, so a figure in the README is the figure the
//! committed report holds.

use burn_rtp::human_bytes;
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// What a figure must reach to meet its target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// At most this value (lower is better).
    AtMost(f64),
    /// At least this value (higher is better).
    AtLeast(f64),
    /// Between these values, both included (a ratio that should be near 1).
    Between(f64, f64),
    /// Reported without a target.
    Reported,
}

/// One headline figure of a report: its JSON key, what it means, and its target.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    /// The top-level key of the report's JSON.
    pub key: &'static str,
    /// What the figure is, in words.
    pub label: &'static str,
    /// Its target.
    pub bound: Bound,
}

const fn fig(key: &'static str, label: &'static str, bound: Bound) -> Figure {
    Figure { key, label, bound }
}

/// The in-process scaling report's headline figures (`benches/report/report.json`).
pub const IN_PROCESS: &[Figure] = &[
    fig(
        "rtp_over_ddp_peak_n4",
        "RTP peak / DDP peak per rank, N=4",
        Bound::AtMost(0.30),
    ),
    fig(
        "rtp_over_fsdp_peak_n4",
        "RTP peak / FSDP peak per rank, N=4",
        Bound::AtMost(0.80),
    ),
    fig(
        "memory_scaling_efficiency_n8",
        "memory-scaling efficiency (ideal / measured model state), N=8",
        Bound::AtLeast(0.95),
    ),
    fig(
        "rtp_over_ddp_step_time_n4",
        "RTP / DDP step time, state-dominated model, N=4",
        Bound::AtMost(1.10),
    ),
    fig(
        "capacity_rtp_over_ddp_n4",
        "largest trainable model under a cap, RTP / DDP, N=4",
        Bound::AtLeast(3.5),
    ),
    fig(
        "rtp_over_ddp_step_time_a_n4",
        "RTP / DDP step time, config A, N=4",
        Bound::AtMost(1.05),
    ),
    fig(
        "rtp_over_ddp_step_time_small_n4",
        "RTP / DDP step time, small model, N=4",
        Bound::AtMost(1.05),
    ),
    fig(
        "rtp_over_ddp_step_time_small_n8",
        "RTP / DDP step time, small model, N=8",
        Bound::AtMost(1.10),
    ),
    fig(
        "syncs_per_linear_backward_n4",
        "exchanges per Linear backward, N=4 (one ring pass: N-1 = 3)",
        Bound::AtMost(3.0),
    ),
    fig(
        "planner_max_rel_error_ledger",
        "memory planner: largest relative error of the predicted peak over its grid",
        Bound::AtMost(0.10),
    ),
    fig(
        "overlap_fraction_n4",
        "share of rotation transfer time hidden behind compute, N=4",
        Bound::Reported,
    ),
    fig(
        "activation_checkpoint_peak_ratio_a_n4",
        "RTP peak with / without balanced activation checkpointing, config A, N=4",
        Bound::AtMost(0.60),
    ),
    fig(
        "activation_checkpoint_step_ratio_a_n4",
        "RTP step time with / without balanced activation checkpointing, config A, N=4",
        Bound::AtMost(1.35),
    ),
    fig(
        "activation_checkpoint_exchange_ratio_a_n4",
        "RTP exchanges per step with / without balanced activation checkpointing, config A, N=4",
        Bound::AtMost(1.0),
    ),
    fig(
        "activation_checkpoint_planner_max_rel_error",
        "memory planner under balanced checkpointing: largest relative error over its grid",
        Bound::AtMost(0.10),
    ),
];

/// The MPI report's figures against PyTorch, present when it ran with `--pytorch`.
pub const MPI_PYTORCH: &[Figure] = &[
    fig(
        "mpi_rtp_over_pytorch_ddp_step_b_n4",
        "our RTP / PyTorch DDP step time, config B, N=4",
        Bound::AtMost(0.80),
    ),
    fig(
        "mpi_ddp_over_pytorch_ddp_step_a_n4",
        "our DDP / PyTorch DDP step time, config A, N=4",
        Bound::AtMost(1.30),
    ),
    fig(
        "mpi_rtp_over_pytorch_ddp_rss_b_n4",
        "our RTP / PyTorch DDP peak RSS per process, config B, N=4",
        Bound::AtMost(0.20),
    ),
    fig(
        "mpi_rtp_over_pytorch_ddp_step_a_n4",
        "our RTP / PyTorch DDP step time, config A, N=4",
        Bound::Reported,
    ),
    fig(
        "mpi_ddp_over_pytorch_ddp_step_b_n4",
        "our DDP / PyTorch DDP step time, config B, N=4",
        Bound::Reported,
    ),
    fig(
        "mpi_fsdp_over_pytorch_fsdp_step_b_n4",
        "our FSDP / PyTorch FSDP2 step time, config B, N=4",
        Bound::Reported,
    ),
    fig(
        "mpi_rtp_over_pytorch_fsdp_step_b_n4",
        "our RTP / PyTorch FSDP2 step time, config B, N=4",
        Bound::Reported,
    ),
];

/// The MPI scaling report's headline figures (`benches/report/mpi/report.json`).
pub const MPI: &[Figure] = &[
    fig(
        "mpi_rtp_over_ddp_rss_b_n4",
        "RTP / DDP (bucketed, its default) peak RSS per process, config B, N=4",
        Bound::AtMost(0.40),
    ),
    fig(
        "mpi_rtp_over_ddp_step_a_n2",
        "RTP / DDP step time, config A, N=2",
        Bound::AtMost(1.05),
    ),
    fig(
        "mpi_rtp_over_ddp_step_a_n4",
        "RTP / DDP step time, config A, N=4",
        Bound::AtMost(1.05),
    ),
    fig(
        "mpi_rtp_over_ddp_step_b_n2",
        "RTP / DDP step time, config B, N=2",
        Bound::AtMost(1.05),
    ),
    fig(
        "mpi_rtp_over_ddp_step_b_n4",
        "RTP / DDP step time, config B, N=4",
        Bound::AtMost(0.80),
    ),
    fig(
        "mpi_ddp_hidden_fraction_b_n4",
        "share of DDP's all-reduce wire time hidden under the backward, config B, N=4",
        Bound::AtLeast(0.5),
    ),
    fig(
        "mpi_fsdp_hidden_fraction_b_n4",
        "share of FSDP's all-gather wire time its rank did not wait for (prefetched), config B, N=4",
        Bound::Reported,
    ),
    fig(
        "mpi_ddp_over_unbucketed_ddp_step_a_n2",
        "DDP with buckets / without, step time, config A, N=2",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_ddp_over_unbucketed_ddp_step_a_n4",
        "DDP with buckets / without, step time, config A, N=4",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_ddp_over_unbucketed_ddp_step_b_n2",
        "DDP with buckets / without, step time, config B, N=2",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_ddp_over_unbucketed_ddp_step_b_n4",
        "DDP with buckets / without, step time, config B, N=4",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_rtp_over_fsdp_step_a_n4",
        "RTP / FSDP step time, config A, N=4",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_rtp_over_fsdp_step_b_n4",
        "RTP / FSDP step time, config B, N=4",
        Bound::AtMost(1.00),
    ),
    fig(
        "mpi_capacity_rtp_over_ddp_n4",
        "largest trainable model under a per-process limit, RTP / DDP, N=4",
        Bound::AtLeast(3.5),
    ),
    fig(
        "mpi_overlap_fraction_b_n4",
        "share of wire time hidden behind compute, config B, N=4",
        Bound::AtLeast(0.8),
    ),
    fig(
        "planner_max_rel_error_rss",
        "memory planner: largest relative error against the resident set's growth",
        Bound::AtMost(0.20),
    ),
    fig(
        "mpi_activation_checkpoint_rss_ratio_a_n4",
        "RTP peak RSS per process with / without balanced activation checkpointing, config A, N=4",
        Bound::AtMost(0.60),
    ),
];

/// The shaped-network report's headline figures (`benches/report/net/report.json`): config A
/// at N = 2 over 2 hosts, and the wire bytes of every cell.
pub const NET: &[Figure] = &[
    fig(
        "net_rtp_hidden_fraction_a_n2",
        "RTP's share of wire time hidden under rotation compute, config A, N=2, slowest link predicted to hide it",
        Bound::AtLeast(0.8),
    ),
    fig(
        "net_rtp_step_over_unshaped_a_n2",
        "RTP step time on that link / on the unshaped link, config A, N=2",
        Bound::AtMost(1.10),
    ),
    fig(
        "net_crossover_measured_over_predicted_a_n2",
        "link rate where RTP's step time stops falling, measured / predicted, config A, N=2",
        Bound::Between(0.7, 1.3),
    ),
    fig(
        "net_rtp_over_ddp_step_slowest_a_n2",
        "RTP / DDP step time on the slowest link, config A, N=2",
        Bound::Reported,
    ),
    fig(
        "net_wire_bytes_over_count_max",
        "largest relative deviation of the bytes sent per rank per step from the algorithm's count, every strategy, link and cell",
        Bound::AtMost(0.05),
    ),
];

/// Config B's twins of [`NET`]'s figures, where its links allowed a measurement (they may be
/// missing: B's predicted rate can lie above what a veth link carries here).
pub const NET_B: &[Figure] = &[
    fig(
        "net_rtp_hidden_fraction_b_n2",
        "RTP's share of wire time hidden under rotation compute, config B, N=2, slowest link predicted to hide it",
        Bound::AtLeast(0.8),
    ),
    fig(
        "net_rtp_step_over_unshaped_b_n2",
        "RTP step time on that link / on the unshaped link, config B, N=2",
        Bound::AtMost(1.10),
    ),
    fig(
        "net_crossover_measured_over_predicted_b_n2",
        "link rate where RTP's step time stops falling, measured / predicted, config B, N=2",
        Bound::Between(0.7, 1.3),
    ),
    fig(
        "net_rtp_over_ddp_step_slowest_b_n2",
        "RTP / DDP step time on the slowest link, config B, N=2",
        Bound::Reported,
    ),
];

/// A report's value for `key`, if it is a finite number.
pub fn value(report: &Value, key: &str) -> Option<f64> {
    report
        .get(key)
        .and_then(Value::as_f64)
        .filter(|v| v.is_finite())
}

/// Checks that `report` holds every figure of `figures` as a finite number.
pub fn check_keys(figures: &[Figure], report: &Value) -> Result<(), String> {
    for f in figures {
        if value(report, f.key).is_none() {
            return Err(format!(
                "{} is {:?}, not a finite number",
                f.key,
                report.get(f.key)
            ));
        }
    }
    Ok(())
}

/// Whether `v` meets `bound`, and by how much it misses if not, in words.
pub fn verdict(v: f64, bound: Bound) -> String {
    if v.is_nan() && bound != Bound::Reported {
        return "not measured".into();
    }
    match bound {
        Bound::Reported => String::new(),
        Bound::AtMost(t) if v <= t => "met".into(),
        Bound::AtLeast(t) if v >= t => "met".into(),
        Bound::Between(lo, hi) if (lo..=hi).contains(&v) => "met".into(),
        Bound::AtMost(t) => format!("missed by {:.0}%", (v / t - 1.0) * 100.0),
        Bound::AtLeast(t) => format!("missed: {:.0}% of the target", v / t * 100.0),
        Bound::Between(lo, _) if v < lo => {
            format!("missed: {:.0}% below {lo}", (1.0 - v / lo) * 100.0)
        }
        Bound::Between(_, hi) => format!("missed: {:.0}% above {hi}", (v / hi - 1.0) * 100.0),
    }
}

fn bound_text(bound: Bound) -> String {
    match bound {
        Bound::AtMost(t) => format!("≤ {t}"),
        Bound::AtLeast(t) => format!("≥ {t}"),
        Bound::Between(lo, hi) => format!("{lo} to {hi}"),
        Bound::Reported => "–".into(),
    }
}

/// The markdown table of `figures` as `report` holds them: figure, key, value, target and
/// verdict. Both reports and `docs/performance.md` show their targets through it.
pub fn targets_table(figures: &[Figure], report: &Value) -> String {
    let mut md =
        String::from("| figure | key | measured | target | verdict |\n|---|---|---|---|---|\n");
    for f in figures {
        let v = value(report, f.key).unwrap_or(f64::NAN);
        md += &format!(
            "| {} | `{}` | {v:.3} | {} | {} |\n",
            f.label,
            f.key,
            bound_text(f.bound),
            verdict(v, f.bound)
        );
    }
    md
}

/// The committed reports the documentation's figures come from, under the workspace root.
pub mod committed {
    /// The in-process scaling report.
    pub const IN_PROCESS: &str = "benches/report/report.json";
    /// The MPI scaling report (2 cores).
    pub const MPI: &str = "benches/report/mpi/report.json";
    /// The shaped-network report (network namespaces, 2 cores).
    pub const NET: &str = "benches/report/net/report.json";
    /// The quick start's run: `gpt --report` at its default settings.
    pub const QUICKSTART: &str = "benches/report/quickstart/report.json";
    /// The CPU profiles (`benches/profile/cpu_profile.py --out`), one JSON file each.
    pub const PROFILES: &str = "benches/report/profile";
}

/// One CPU profile, as `benches/profile/cpu_profile.py --out` writes it.
#[derive(Debug, Clone, Deserialize)]
pub struct CpuProfile {
    /// `ours-ddp`, `pytorch-ddp`, ...
    pub runner: String,
    /// `a` or `b`.
    pub config: String,
    /// World size.
    pub ranks: usize,
    /// The job's median step, barrier to barrier, in milliseconds.
    pub median_step_ms: f64,
    /// Rank 0's CPU time per step (start-up and the warm-up step spread over the steps).
    pub cpu_ms_per_step: f64,
    /// What rank 0's CPU did, by category, as shares of its samples, in the script's order.
    pub shares: serde_json::Map<String, Value>,
    /// When it was measured, for tables that set two runs side by side (`--label`).
    #[serde(default)]
    pub label: Option<String>,
}

impl CpuProfile {
    /// Every profile under `dir`, by file name.
    pub fn read_all(dir: &Path) -> Result<Vec<Self>, String> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        paths
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
            })
            .collect()
    }
}

/// The CPU profiles side by side: one row per category, one column per profile, each cell
/// the CPU milliseconds per step and the share of the profile's samples.
pub fn profile_block(profiles: &[CpuProfile]) -> String {
    let mut md = String::from("| what rank 0's CPU did |");
    for p in profiles {
        md += &format!(
            " {}, {}, N={}{} |",
            p.runner,
            p.config.to_uppercase(),
            p.ranks,
            p.label
                .as_ref()
                .map_or(String::new(), |l| format!(" ({l})"))
        );
    }
    md += "\n|---|";
    md += &"---|".repeat(profiles.len());
    md += "\n";
    let categories: Vec<&String> = profiles
        .first()
        .map_or(Vec::new(), |p| p.shares.keys().collect());
    for c in categories {
        md += &format!("| {c} |");
        for p in profiles {
            let share = p.shares.get(c).and_then(Value::as_f64).unwrap_or(0.0);
            md += &format!(
                " {:.0} ms ({:.0}%) |",
                share * p.cpu_ms_per_step,
                share * 100.0
            );
        }
        md += "\n";
    }
    md += "| **CPU per step, all** |";
    for p in profiles {
        md += &format!(" **{:.0} ms** |", p.cpu_ms_per_step);
    }
    md += "\n| median step, barrier to barrier |";
    for p in profiles {
        md += &format!(" {:.0} ms |", p.median_step_ms);
    }
    md + "\n"
}

/// The part of the GPT trainer's `--report` JSON that the quick start quotes.
#[derive(Debug, Clone, Deserialize)]
pub struct QuickstartRun {
    /// `rtp`, `fsdp` or `ddp`.
    pub strategy: String,
    /// World size.
    pub ranks: usize,
    /// Training steps.
    pub steps: usize,
    /// Parameters of the model.
    pub params: usize,
    /// Validation loss at the end, nats per byte.
    pub final_val_loss: f64,
    /// Each rank's peak, by category.
    pub peak_bytes_per_rank: Vec<PeakBytes>,
    /// Single-device model state over N.
    pub ideal_model_state_bytes_per_rank: u64,
}

/// One rank's peak bytes, as the trainer reports them.
#[derive(Debug, Clone, Deserialize)]
pub struct PeakBytes {
    /// Model state: parameters, gradients and optimizer state this rank holds.
    pub sharded: u64,
    /// Activations, temporaries and gradients before their reduction.
    pub local: u64,
    /// Rotation buffers and gathered units.
    pub in_flight: u64,
    /// All of them at the rank's peak.
    pub total: u64,
}

impl QuickstartRun {
    /// Reads a trainer report.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The largest rank's model state over the ideal (single-device state / N).
    pub fn worst_state_ratio(&self) -> f64 {
        self.peak_bytes_per_rank
            .iter()
            .map(|p| p.sharded as f64 / self.ideal_model_state_bytes_per_rank as f64)
            .fold(0.0, f64::max)
    }
}

/// The README's quick-start figures, from the committed quick-start run.
pub fn quickstart_block(run: &QuickstartRun) -> String {
    let worst = run
        .peak_bytes_per_rank
        .iter()
        .max_by_key(|p| p.sharded)
        .expect("a run has ranks");
    format!(
        "At its defaults ({} on {} ranks, {} steps, {} parameters) the run ends at a validation \
         loss of {:.2} nats/byte, and each rank holds at most {} of model state against the \
         single-device {} / {} = {} ({:.3}x the ideal, as the run prints it).\n",
        run.strategy,
        run.ranks,
        run.steps,
        run.params,
        run.final_val_loss,
        human_bytes(worst.sharded),
        human_bytes(run.ideal_model_state_bytes_per_rank * run.ranks as u64),
        run.ranks,
        human_bytes(run.ideal_model_state_bytes_per_rank),
        run.worst_state_ratio(),
    )
}

/// The README's headline table: the figures a user asks about first, from both reports.
pub fn headline_block(in_process: &Value, mpi: &Value) -> String {
    let rows: [(&str, &Value, &str); 6] = [
        (
            "memory-scaling efficiency (ideal / measured model state), N=8 (in-process)",
            in_process,
            "memory_scaling_efficiency_n8",
        ),
        (
            "peak RSS per process, RTP / DDP (bucketed, its default), config B, N=4 (MPI)",
            mpi,
            "mpi_rtp_over_ddp_rss_b_n4",
        ),
        (
            "largest model that trains, RTP / DDP, N=4 (MPI)",
            mpi,
            "mpi_capacity_rtp_over_ddp_n4",
        ),
        (
            "step time, RTP / DDP, config A, N=4 (MPI)",
            mpi,
            "mpi_rtp_over_ddp_step_a_n4",
        ),
        (
            "step time, RTP / DDP, config B, N=4 (MPI)",
            mpi,
            "mpi_rtp_over_ddp_step_b_n4",
        ),
        (
            "share of wire time hidden behind compute, config B, N=4 (MPI)",
            mpi,
            "mpi_overlap_fraction_b_n4",
        ),
    ];
    let mut md = String::from("| figure | measured | target |\n|---|---|---|\n");
    for (label, report, key) in rows {
        let bound = IN_PROCESS
            .iter()
            .chain(MPI)
            .find(|f| f.key == key)
            .map_or(Bound::Reported, |f| f.bound);
        let v = value(report, key).unwrap_or(f64::NAN);
        let verdict = verdict(v, bound);
        let target = match verdict.as_str() {
            "" => bound_text(bound),
            _ => format!("{} ({verdict})", bound_text(bound)),
        };
        md += &format!("| {label} | {v:.2} | {target} |\n");
    }
    md
}

/// A block of generated text in a document: the lines between `<!-- generated:NAME -->` and
/// `<!-- /generated:NAME -->`.
pub struct Block {
    /// The block's name in its markers.
    pub name: &'static str,
    /// Its text.
    pub text: String,
}

/// `doc` with each named block's content replaced by its text; an error names a block whose
/// markers are missing or out of order.
pub fn fill(doc: &str, blocks: &[Block]) -> Result<String, String> {
    let mut out = doc.to_string();
    for b in blocks {
        let open = format!("<!-- generated:{} -->\n", b.name);
        let close = format!("<!-- /generated:{} -->", b.name);
        let start = out
            .find(&open)
            .ok_or_else(|| format!("no `{}` marker", open.trim_end()))?
            + open.len();
        let end = out[start..]
            .find(&close)
            .ok_or_else(|| format!("no `{close}` marker after its opening one"))?
            + start;
        out.replace_range(start..end, &b.text);
    }
    Ok(out)
}

/// Reads a committed report's JSON from under `root`.
pub fn read_json(root: &Path, rel: &str) -> Result<Value, String> {
    let path: PathBuf = root.join(rel);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn committed_reports_hold_every_figure_of_their_table() {
        check_keys(
            IN_PROCESS,
            &read_json(&root(), committed::IN_PROCESS).unwrap(),
        )
        .unwrap();
        check_keys(MPI, &read_json(&root(), committed::MPI).unwrap()).unwrap();
        check_keys(NET, &read_json(&root(), committed::NET).unwrap()).unwrap();
        let quick = QuickstartRun::read(&root().join(committed::QUICKSTART)).unwrap();
        assert!(quick.worst_state_ratio().is_finite() && quick.worst_state_ratio() > 0.0);
    }

    #[test]
    fn a_missing_or_non_finite_figure_is_named() {
        let report = serde_json::json!({ "rtp_over_ddp_peak_n4": 0.3 });
        let err = check_keys(IN_PROCESS, &report).unwrap_err();
        assert!(err.starts_with("rtp_over_fsdp_peak_n4"), "{err}");
        let report = serde_json::json!({ "mpi_rtp_over_ddp_rss_b_n4": null });
        assert!(check_keys(MPI, &report)
            .unwrap_err()
            .starts_with("mpi_rtp_over_ddp_rss_b_n4"));
    }

    #[test]
    fn verdicts_say_which_side_of_the_target() {
        assert_eq!(verdict(0.30, Bound::AtMost(0.30)), "met");
        assert_eq!(verdict(0.33, Bound::AtMost(0.30)), "missed by 10%");
        assert_eq!(
            verdict(0.4, Bound::AtLeast(0.8)),
            "missed: 50% of the target"
        );
        assert_eq!(verdict(3.9, Bound::AtLeast(3.5)), "met");
    }

    #[test]
    fn fill_replaces_only_the_named_blocks() {
        let doc = "a\n<!-- generated:x -->\nold\n<!-- /generated:x -->\nb\n";
        let new = fill(
            doc,
            &[Block {
                name: "x",
                text: "new\n".into(),
            }],
        )
        .unwrap();
        assert_eq!(
            new,
            "a\n<!-- generated:x -->\nnew\n<!-- /generated:x -->\nb\n"
        );
        let missing = fill(
            doc,
            &[Block {
                name: "y",
                text: String::new(),
            }],
        );
        assert!(missing.unwrap_err().contains("generated:y"));
    }
}
