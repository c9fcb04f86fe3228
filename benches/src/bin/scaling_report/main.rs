//! Measures RTP beside DDP and FSDP and writes `report.json`, `report.md` and SVG plots.
//!
//! `cargo run --release -p burn-rtp-benches --bin scaling-report -- --out DIR`
//!
//! With one MPI process per rank (cargo feature `mpi`, Open MPI installed):
//! `cargo run --release -p burn-rtp-benches --features mpi --bin scaling-report -- --transport mpi --out DIR`
//!
//! Burn's own DDP as a peer row (built apart: `cargo build --manifest-path benches/burn-ddp/Cargo.toml`):
//! add `--burn-ddp target/debug/burn-ddp-peer`; with `--burn-ddp-only`, only that section is
//! (re)written into the report already in `--out`.
//!
//! Over a shaped network (network namespaces as hosts, Open MPI over TCP; root, iproute2):
//! `... --features mpi --bin scaling-report -- --transport mpi --net --out benches/report/net`.
//!
//! Config A on wgpu at N = 2, fused kernels against generic (`--features wgpu`): add `--wgpu`;
//! with `--wgpu-only`, only that section is (re)written.
//!
//! NdArray against Flex, config A in-process (single, and DDP and RTP at N = 4): add
//! `--backends`; with `--backends-only`, only that section is (re)written. With `--transport
//! mpi`, the same at N = 4 processes (DDP and RTP) goes into the MPI report.
//!
//! The reports start this binary again in the roles of `scaling-report worker` (an MPI job's
//! rank, a link probe's rank, our strategies on Burn's peer model); that subcommand is hidden
//! and takes no report flags.

use burn_rtp::{MpiProgress, TransportKind};
use burn_rtp_benches::mpi_report::{self, MpiReport, MpiReportConfig};
use burn_rtp_benches::net_report::{NetReport, NetReportConfig};
use burn_rtp_benches::report::ReportConfig;
use burn_rtp_benches::runner::{self, default_out, stamped_log, Report};
use burn_rtp_benches::worker::Worker;
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

mod sections;
use sections::{
    activations_only, add_backends, add_burn_ddp, add_routing, add_speed, add_wgpu, decode_only,
};

/// Measure RTP beside DDP and FSDP and write a scaling report.
#[derive(Parser, Debug)]
#[command(version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    /// An internal role instead of a report.
    #[command(subcommand)]
    command: Option<Command>,
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
    /// in-process (ranks are threads of this process) | mpi (each strategy as its own
    /// `mpirun -np N` job).
    #[arg(long, default_value = "in-process")]
    transport: TransportKind,
    /// With `--transport mpi`: small models, one job per cell (a few minutes).
    #[arg(long)]
    quick: bool,
    /// With `--transport mpi`: how each process's communication thread paces its tests of
    /// transfers in flight (auto | spin | backoff).
    #[arg(long, default_value = "auto")]
    mpi_progress: MpiProgress,
    /// With `--transport mpi`: every timed job's ranks also write their timelines (compute,
    /// waits, and when received bytes were moving) as JSON, `OUT/jobs/timeline-*.rank<r>.json`.
    #[arg(long)]
    timelines: bool,
    /// With `--transport mpi`: the Python that runs PyTorch (`benches/peers/pytorch/`): its
    /// DDP and FSDP2 then run in every cell beside ours, strategies alternating.
    #[arg(long, value_name = "PYTHON")]
    pytorch: Option<PathBuf>,
    /// Only the memory planner's grid: predictions against the ledger (in-process) or the
    /// resident set (`--transport mpi`), printed, without writing a report.
    #[arg(long)]
    planner_only: bool,
    /// The `burn-ddp-peer` binary (benches/burn-ddp): run it and add Burn's own DDP on wgpu
    /// to the report, as a peer row or with the errors that stop it.
    #[arg(long, value_name = "BIN")]
    burn_ddp: Option<PathBuf>,
    /// With `--burn-ddp`: only add that section to the report already in `--out`.
    #[arg(long, requires = "burn_ddp")]
    burn_ddp_only: bool,
    /// Add config A on wgpu at N = 2 (RTP against DDP, fused kernels against generic) to
    /// the report in `--out` (needs `--features wgpu`); with `--wgpu-only`, only that.
    #[arg(long)]
    wgpu: bool,
    /// With `--wgpu`: only add that section to the report already in `--out`.
    #[arg(long, requires = "wgpu")]
    wgpu_only: bool,
    /// Add the inner backends side by side (config A in-process: single, and DDP and RTP at
    /// N = 4, on NdArray and on Flex) to the report in `--out`; with `--backends-only`, only
    /// that.
    #[arg(long)]
    backends: bool,
    /// With `--backends`: only add that section to the report already in `--out`.
    #[arg(long, requires = "backends")]
    backends_only: bool,
    /// With `--transport mpi`: add RTP with its weights rotating against RTP with its
    /// activations routed and RTP choosing per pass (configs A and B at N = 4, step time and
    /// bytes sent) to the MPI report in `--out`; with `--net`, RTP choosing per pass beside
    /// DDP and rotation at config B on 2 hosts over the 1 Gbit/s link to the shaped-network
    /// report instead. With `--routing-only`, only that.
    #[arg(long)]
    routing: bool,
    /// With `--routing`: only add that section to the report already in `--out`.
    #[arg(long, requires = "routing")]
    routing_only: bool,
    /// With `--transport mpi --pytorch PYTHON`: add ours against PyTorch on the same cores
    /// (one process with one thread each side at A and B, and A at N = 4 alone and beside a
    /// competing load, with page faults per step) to the MPI report in `--out`; with
    /// `--speed-only`, only that.
    #[arg(long, requires = "pytorch")]
    speed: bool,
    /// With `--speed`: only add that section to the report already in `--out`.
    #[arg(long, requires = "speed")]
    speed_only: bool,
    /// Only measure the activation section (RTP with and without balanced activation
    /// checkpointing, and the planner's checkpointed predictions in-process) and add it to
    /// the report already in `--out`, with its figures.
    #[arg(long)]
    activations_only: bool,
    /// Only measure the generation section (batch 1 through a KV cache at config B's shape:
    /// single device, and RTP at N = 4 rotating and `Auto`, in-process) and add it to the
    /// report already in `--out`, with its figure.
    #[arg(long)]
    decode_only: bool,
    /// With `--transport mpi`: measure DDP, FSDP and RTP over a cluster of network namespaces
    /// (one rank per host, Open MPI over TCP, links shaped to a ladder of rates) instead, and
    /// write that report to `--out` (needs root and iproute2).
    #[arg(long)]
    net: bool,
    /// With `--net`: the cluster script [default: benches/net/cluster.sh of this source tree].
    #[arg(long, value_name = "SCRIPT")]
    net_script: Option<PathBuf>,
}

/// What the binary runs instead of a report.
#[derive(Subcommand, Debug)]
enum Command {
    /// Internal: a role in which the reports start this binary again.
    #[command(hide = true)]
    Worker {
        /// The role.
        #[command(subcommand)]
        role: Worker,
    },
}

/// This program, which `mpirun` (or the cluster, or a child process) starts again as a
/// worker; `None` after saying why it cannot be found.
fn this_exe(purpose: &str) -> Option<PathBuf> {
    match std::env::current_exe() {
        Ok(exe) => Some(exe),
        Err(e) => {
            eprintln!("error: cannot find this program {purpose}: {e}");
            None
        }
    }
}

/// Whether the command line asks for small models.
fn quick(cli: &Cli) -> bool {
    cli.quick || cli.tiny
}

/// The MPI report's settings, as the command line asks.
fn mpi_config(cli: &Cli) -> MpiReportConfig {
    let out = cli.out.clone().unwrap_or_else(default_out);
    let mut cfg = if quick(cli) {
        MpiReportConfig::quick(out)
    } else {
        MpiReportConfig::full(out)
    };
    if let Some(cap) = cli.cap_bytes {
        cfg.capacity_limit_bytes = cap;
    }
    if let Some(r) = cli.repeats {
        cfg.repeats = r.max(1);
    }
    cfg.mpi_progress = cli.mpi_progress;
    cfg.timelines = cli.timelines;
    cfg.pytorch = cli.pytorch.clone();
    cfg
}

/// The shaped-network report's settings, as the command line asks.
fn net_config(cli: &Cli, out: PathBuf) -> NetReportConfig {
    let script = cli
        .net_script
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("net/cluster.sh"));
    let mut net = if quick(cli) {
        NetReportConfig::quick(out, script)
    } else {
        NetReportConfig::full(out, script)
    };
    if let Some(r) = cli.repeats {
        net.repeats = r.max(1);
    }
    net
}

/// The in-process report's settings, as the command line asks.
fn in_process_config(cli: &Cli) -> ReportConfig {
    let out = cli.out.clone().unwrap_or_else(default_out);
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
    cfg
}

/// `--transport mpi`: the planner's grid, the activation section, the shaped-network report
/// or the MPI report, as the flags ask.
fn main_mpi(cli: &Cli) -> ExitCode {
    if !cfg!(feature = "mpi") {
        eprintln!("error: --transport mpi needs `--features mpi` (and Open MPI: apt-get install libopenmpi-dev openmpi-bin libclang-dev)");
        return ExitCode::FAILURE;
    }
    let cfg = mpi_config(cli);
    let Some(exe) = this_exe("to start under mpirun") else {
        return ExitCode::FAILURE;
    };
    if cli.planner_only {
        let log = stamped_log(Instant::now());
        let scratch = cfg.out.join("jobs");
        if let Err(e) = std::fs::create_dir_all(&scratch) {
            eprintln!("error: cannot create {}: {e}", scratch.display());
            return ExitCode::FAILURE;
        }
        return match mpi_report::planner_rows(
            &cfg.planner_grid,
            cfg.mpi_progress,
            &exe,
            &scratch,
            &log,
        ) {
            Ok(rows) => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if cli.net {
        let cfg = net_config(cli, cfg.out);
        return write_report(&NetReport { cfg, exe });
    }
    if cli.activations_only {
        let out = cfg.out.clone();
        return activations_only(&out, |log| {
            let section = mpi_report::activation_cells(&cfg, &exe, log)?;
            Ok((
                section.figures(),
                mpi_report::ACTIVATION_HEADING,
                section.markdown(&cfg),
                section.cells(),
                burn_rtp_benches::figures::MPI,
            ))
        });
    }
    write_report(&MpiReport { cfg, exe })
}

/// Runs `report` with a timestamped log (which writes its files and checks its keys) and says
/// what it wrote.
fn write_report<R: Report>(report: &R) -> ExitCode {
    let started = Instant::now();
    match runner::run(report, &stamped_log(started)) {
        Ok(written) => {
            println!(
                "wrote {}/report.json, report.md and {} SVG plots in {:.0} s",
                report.out().display(),
                written.plots.len(),
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

/// Runs `role` in this process: an MPI job's rank, a link probe's rank, or our strategy on
/// Burn's peer model.
fn worker(role: &Worker) -> ExitCode {
    let done = match role {
        Worker::Job { job } => serde_json::from_str(job)
            .map_err(|e| format!("unreadable job: {e}"))
            .and_then(|job| mpi_report::worker(&job)),
        Worker::Probe { probe } => net_probe(probe),
        Worker::Peer {
            strategy,
            steps,
            batch,
            hidden,
            out,
        } => peer_ours(
            strategy,
            burn_rtp_benches::burn_ddp::OursSettings {
                steps: *steps,
                batch: *batch,
                hidden: *hidden,
            },
            out,
        ),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Trains Burn's peer model under one of our strategies (the child of `--burn-ddp`).
fn peer_ours(
    strategy: &str,
    settings: burn_rtp_benches::burn_ddp::OursSettings,
    out: &Path,
) -> Result<(), String> {
    #[cfg(feature = "wgpu")]
    {
        burn_rtp_benches::burn_ddp::ours_child(strategy, settings, out)
            .map_err(|e| format!("burn-rtp {strategy} on the peer's model: {e}"))
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = (settings, out);
        Err(format!(
            "burn-rtp {strategy} on the peer's model needs `--features wgpu`"
        ))
    }
}

/// Runs a link probe as this process's rank (the child of `--net`).
fn net_probe(probe: &str) -> Result<(), String> {
    #[cfg(feature = "mpi")]
    {
        serde_json::from_str(probe)
            .map_err(|e| format!("unreadable probe: {e}"))
            .and_then(|p| burn_rtp_benches::net_report::probe_worker(&p))
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = probe;
        Err("a link probe needs `--features mpi`".into())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Worker { role }) = &cli.command {
        return worker(role);
    }
    let mut status = report(&cli);
    let out = cli.out.clone().unwrap_or_else(default_out);
    if let (Some(bin), true) = (&cli.burn_ddp, status == ExitCode::SUCCESS) {
        status = add_burn_ddp(bin, &out);
    }
    if cli.wgpu && status == ExitCode::SUCCESS {
        status = add_wgpu(&cli, &out);
    }
    if cli.backends && status == ExitCode::SUCCESS {
        status = add_backends(&cli, &out);
    }
    if cli.speed && status == ExitCode::SUCCESS {
        status = add_speed(&cli);
    }
    if cli.routing && status == ExitCode::SUCCESS {
        status = add_routing(&cli);
    }
    status
}

/// The report the flags ask for (none when they ask only to add a section).
fn report(cli: &Cli) -> ExitCode {
    if cli.burn_ddp_only || cli.wgpu_only || cli.backends_only || cli.speed_only || cli.routing_only
    {
        return ExitCode::SUCCESS;
    }
    if cli.planner_only && cli.transport == TransportKind::InProcess {
        let grid = if cli.tiny {
            burn_rtp_benches::planner_check::tiny_grid()
        } else {
            burn_rtp_benches::planner_check::full_grid()
        };
        let log = stamped_log(Instant::now());
        return match burn_rtp_benches::planner_check::run(
            &grid,
            burn_rtp::ActivationCheckpointing::None,
            &log,
        ) {
            Ok(rows) => {
                println!("{}", burn_rtp_benches::planner_check::markdown(&rows));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if cli.transport == TransportKind::Mpi {
        return main_mpi(cli);
    }
    let cfg = in_process_config(cli);
    if cli.decode_only {
        return decode_only(&cfg.out, cli.tiny);
    }
    if cli.activations_only {
        let settings = cfg.activations.clone();
        return activations_only(&cfg.out, |log| {
            let section = burn_rtp_benches::checkpointing::run(&settings, log)?;
            Ok((
                section.figures(),
                burn_rtp_benches::checkpointing::HEADING,
                section.markdown(&settings),
                serde_json::to_value(&section)?,
                burn_rtp_benches::figures::IN_PROCESS,
            ))
        });
    }
    write_report(&cfg)
}
