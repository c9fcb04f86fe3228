//! Measures RTP beside DDP and FSDP and writes `report.json`, `report.md` and SVG plots.
//!
//! `cargo run --release -p burn-rtp-benches --bin scaling-report -- --out DIR`

use burn_rtp_benches::report::{check_keys, default_out, run, ReportConfig};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

/// Measure RTP beside DDP and FSDP and write a scaling report.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Output folder.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Per-rank memory cap for the capacity search, in bytes.
    #[arg(long)]
    cap_bytes: Option<u64>,
    /// Timing samples per strategy.
    #[arg(long)]
    repeats: Option<usize>,
    /// A seconds-long run on a tiny model (for tests).
    #[arg(long)]
    tiny: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = cli.out.unwrap_or_else(default_out);
    let mut cfg = if cli.tiny {
        ReportConfig::tiny(out)
    } else {
        ReportConfig::full(out)
    };
    if let Some(cap) = cli.cap_bytes {
        cfg.cap_bytes = cap;
    }
    if let Some(r) = cli.repeats {
        cfg.repeats = r.max(1);
    }
    let started = std::time::Instant::now();
    let log = |msg: &str| eprintln!("[{:>6.1} s] {msg}", started.elapsed().as_secs_f64());
    match run(&cfg, &log) {
        Ok(report) => {
            if let Err(e) = check_keys(&report) {
                eprintln!("error: incomplete report: {e}");
                return ExitCode::FAILURE;
            }
            println!(
                "wrote {}/report.json, report.md and 4 SVG plots in {:.0} s",
                cfg.out.display(),
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
