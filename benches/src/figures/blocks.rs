//! The documentation's generated blocks: the headline, the targets, the CPU profile and the
//! quick start, and the filling of a document's blocks.

use super::*;

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
