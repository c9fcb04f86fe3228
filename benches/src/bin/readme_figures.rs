//! Writes the generated figure blocks of `README.md` and `docs/performance.md` from the
//! committed reports, or checks that they match (`--check`, as CI runs it).
//!
//! `--check-run REPORT` also checks a fresh quick-start run (`gpt --report REPORT`) against
//! the README's stated model-state ratio: CI fails when a rank holds more than 5% above it.

use burn_rtp_benches::figures::{self, committed, Block, QuickstartRun};
use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Regenerate (or check) the README's and docs' figures from the committed report JSON.
#[derive(Parser, Debug)]
#[command(about)]
struct Cli {
    /// Fail, printing the difference, where a document's generated block differs from what
    /// the committed reports give; write nothing.
    #[arg(long)]
    check: bool,
    /// A quick-start run's `--report` JSON to check against the committed quick-start ratio.
    #[arg(long)]
    check_run: Option<PathBuf>,
    /// The workspace root [default: this crate's parent folder].
    #[arg(long)]
    root: Option<PathBuf>,
}

/// How far above the README's model-state ratio a fresh quick-start run may read.
const RUN_SLACK: f64 = 1.05;

fn documents(root: &Path) -> Result<Vec<(PathBuf, Vec<Block>)>, String> {
    let in_process = figures::read_json(root, committed::IN_PROCESS)?;
    let mpi = figures::read_json(root, committed::MPI)?;
    let net = figures::read_json(root, committed::NET)?;
    let quick = QuickstartRun::read(&root.join(committed::QUICKSTART))?;
    figures::check_keys(figures::IN_PROCESS, &in_process)
        .map_err(|e| format!("{}: {e}", committed::IN_PROCESS))?;
    figures::check_keys(figures::MPI, &mpi).map_err(|e| format!("{}: {e}", committed::MPI))?;
    figures::check_keys(figures::NET, &net).map_err(|e| format!("{}: {e}", committed::NET))?;
    Ok(vec![
        (
            root.join("README.md"),
            vec![
                Block {
                    name: "headline",
                    text: figures::headline_block(&in_process, &mpi),
                },
                Block {
                    name: "quickstart",
                    text: figures::quickstart_block(&quick),
                },
            ],
        ),
        (
            root.join("docs/performance.md"),
            vec![
                Block {
                    name: "inprocess-targets",
                    text: figures::targets_table(figures::IN_PROCESS, &in_process),
                },
                Block {
                    name: "mpi-targets",
                    text: figures::targets_table(figures::MPI, &mpi),
                },
                Block {
                    name: "pytorch-targets",
                    text: figures::targets_table(figures::MPI_PYTORCH, &mpi),
                },
                Block {
                    name: "cpu-profile",
                    text: figures::profile_block(&figures::CpuProfile::read_all(
                        &root.join(committed::PROFILES),
                    )?),
                },
                Block {
                    name: "net-targets",
                    text: figures::targets_table(figures::NET, &net)
                        + "\nConfig B:\n\n"
                        + &figures::targets_table(figures::NET_B, &net),
                },
            ],
        ),
    ])
}

fn run(cli: &Cli) -> Result<(), String> {
    let root = cli
        .root
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    let root = root.canonicalize().unwrap_or(root);
    let mut stale = Vec::new();
    for (path, blocks) in documents(&root)? {
        let doc = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let new = figures::fill(&doc, &blocks).map_err(|e| format!("{}: {e}", path.display()))?;
        if new == doc {
            continue;
        }
        if cli.check {
            stale.push(path.display().to_string());
            for (old, new) in doc.lines().zip(new.lines()).filter(|(a, b)| a != b) {
                eprintln!(
                    "{}:\n  committed: {old}\n  generated: {new}",
                    path.display()
                );
            }
        } else {
            std::fs::write(&path, new)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            println!("updated {}", path.display());
        }
    }
    if !stale.is_empty() {
        return Err(format!(
            "generated figures differ from the committed reports in {}; run `cargo run --release -p burn-rtp-benches --bin readme-figures` and commit",
            stale.join(", ")
        ));
    }
    if let Some(run) = &cli.check_run {
        let stated = QuickstartRun::read(&root.join(committed::QUICKSTART))?.worst_state_ratio();
        let fresh = QuickstartRun::read(run)?;
        let ratio = fresh.worst_state_ratio();
        println!(
            "quick start: {} on {} ranks holds {ratio:.3}x the ideal model state per rank (README: {stated:.3}x, limit {:.3}x)",
            fresh.strategy,
            fresh.ranks,
            stated * RUN_SLACK
        );
        if ratio > stated * RUN_SLACK {
            return Err(format!(
                "the quick start's model state per rank is {ratio:.3}x the ideal, more than 5% above the README's {stated:.3}x"
            ));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(&Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
