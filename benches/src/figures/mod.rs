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

mod blocks;
mod tables;

pub use blocks::*;
pub use tables::*;

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
