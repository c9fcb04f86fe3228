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

use burn_rtp::{MpiProgress, TransportKind};
use burn_rtp_benches::mpi_report::{self, Job, MpiReportConfig};
use burn_rtp_benches::net_report::{self, NetReportConfig};
use burn_rtp_benches::report::{check_keys, default_out, run, ReportConfig};
use clap::Parser;
use serde_json::Value;
use std::path::{Path, PathBuf};
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
    /// With `--transport mpi`: measure DDP, FSDP and RTP over a cluster of network namespaces
    /// (one rank per host, Open MPI over TCP, links shaped to a ladder of rates) instead, and
    /// write that report to `--out` (needs root and iproute2).
    #[arg(long)]
    net: bool,
    /// With `--net`: the cluster script [default: benches/net/cluster.sh of this source tree].
    #[arg(long, value_name = "SCRIPT")]
    net_script: Option<PathBuf>,
    /// Internal: probe a link as this process's rank (started by `--net`).
    #[arg(long, hide = true)]
    net_probe: Option<String>,
    /// Internal: run one job as this process's rank (started by mpirun).
    #[arg(long, hide = true)]
    mpi_worker: Option<String>,
    /// Internal: train Burn's peer model under this strategy of ours (`ddp` or `rtp`) and
    /// write what it measured to `--out` (started by `--burn-ddp`).
    #[arg(long, hide = true)]
    peer_ours: Option<String>,
    /// Internal, with `--peer-ours`: training steps.
    #[arg(long, hide = true, default_value_t = 20)]
    peer_steps: usize,
    /// Internal, with `--peer-ours`: global batch.
    #[arg(long, hide = true, default_value_t = 64)]
    peer_batch: usize,
    /// Internal, with `--peer-ours`: hidden width.
    #[arg(long, hide = true, default_value_t = 256)]
    peer_hidden: usize,
}

/// The MPI report's settings, as the command line asks.
fn mpi_config(cli: &Cli) -> MpiReportConfig {
    let out = cli.out.clone().unwrap_or_else(default_out);
    let mut cfg = if cli.quick || cli.tiny {
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

fn main_mpi(cli: &Cli) -> ExitCode {
    if !cfg!(feature = "mpi") {
        eprintln!("error: --transport mpi needs `--features mpi` (and Open MPI: apt-get install libopenmpi-dev openmpi-bin libclang-dev)");
        return ExitCode::FAILURE;
    }
    let cfg = mpi_config(cli);
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("error: cannot find this program to start under mpirun: {e}");
            return ExitCode::FAILURE;
        }
    };
    if cli.planner_only {
        let started = std::time::Instant::now();
        let log = |msg: &str| eprintln!("[{:>6.1} s] {msg}", started.elapsed().as_secs_f64());
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
        let script = cli
            .net_script
            .clone()
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("net/cluster.sh"));
        let out = cfg.out.clone();
        let mut net = if cli.quick || cli.tiny {
            NetReportConfig::quick(out.clone(), script)
        } else {
            NetReportConfig::full(out.clone(), script)
        };
        if let Some(r) = cli.repeats {
            net.repeats = r.max(1);
        }
        let check = if cli.quick || cli.tiny {
            net_report::check_quick
        } else {
            net_report::check_keys
        };
        return measure(&out, 1, check, |log| net_report::run(&net, &exe, log));
    }
    let out = cfg.out.clone();
    if cli.activations_only {
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
    measure(&out, 3, mpi_report::check_keys, |log| {
        mpi_report::run(&cfg, &exe, log)
    })
}

/// What an activation section run returns: its figures, its heading, markdown and details,
/// and the report's table of figures.
type ActivationSection = (
    serde_json::Value,
    &'static str,
    String,
    serde_json::Value,
    &'static [burn_rtp_benches::figures::Figure],
);

/// Measures the activation section alone and adds it, with its figures, to the report in
/// `out`.
fn activations_only(
    out: &Path,
    run: impl FnOnce(&dyn Fn(&str)) -> Result<ActivationSection, Box<dyn std::error::Error>>,
) -> ExitCode {
    let started = std::time::Instant::now();
    let log = |msg: &str| eprintln!("[{:>6.1} s] {msg}", started.elapsed().as_secs_f64());
    let added = run(&log).and_then(|(figures, heading, md, details, table)| {
        burn_rtp_benches::report::add_section(
            out,
            heading,
            &md,
            "activation_checkpointing",
            &details,
        )?;
        burn_rtp_benches::report::add_figures(out, &figures, table)?;
        Ok(figures)
    });
    match added {
        Ok(figures) => {
            println!(
                "added the activation section to {} in {:.0} s: {figures}",
                out.display(),
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: activation section: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a report with a timestamped log, checks its keys and says what it wrote.
fn measure(
    out: &Path,
    plots: usize,
    check: fn(&Value) -> Result<(), String>,
    run: impl FnOnce(&dyn Fn(&str)) -> Result<Value, Box<dyn std::error::Error>>,
) -> ExitCode {
    let started = std::time::Instant::now();
    let log = |msg: &str| eprintln!("[{:>6.1} s] {msg}", started.elapsed().as_secs_f64());
    match run(&log) {
        Ok(report) => {
            if let Err(e) = check(&report) {
                eprintln!("error: incomplete report: {e}");
                return ExitCode::FAILURE;
            }
            println!(
                "wrote {}/report.json, report.md and {plots} SVG plots in {:.0} s",
                out.display(),
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

/// Adds Burn's own DDP (the peer binary's findings), and ours on its model, to the report in
/// `out`.
fn add_burn_ddp(bin: &Path, out: &Path) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!(
                "error: cannot find this program to run our strategies on the peer's model: {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    match burn_rtp_benches::burn_ddp::add_to_report(bin, out, &exe) {
        Ok(summary) => {
            println!("Burn DDP peer: {summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: Burn DDP peer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Adds the wgpu figures to the report in `out`.
fn add_wgpu(cli: &Cli, out: &Path) -> ExitCode {
    #[cfg(feature = "wgpu")]
    {
        let (repeats, steps) = if cli.quick || cli.tiny {
            (3, 1)
        } else {
            (5, 3)
        };
        let log = |m: &str| eprintln!("{m}");
        section_status(
            "wgpu, config A at N = 2",
            burn_rtp_benches::wgpu_figures::add_to_report(out, repeats, steps, &log),
        )
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = (cli, out);
        eprintln!("error: --wgpu needs `--features wgpu` (and a Vulkan driver: apt-get install mesa-vulkan-drivers)");
        ExitCode::FAILURE
    }
}

/// Trains Burn's peer model under one of our strategies (the child of `--burn-ddp`).
fn peer_ours(cli: &Cli, strategy: &str) -> ExitCode {
    #[cfg(feature = "wgpu")]
    {
        let settings = burn_rtp_benches::burn_ddp::OursSettings {
            steps: cli.peer_steps,
            batch: cli.peer_batch,
            hidden: cli.peer_hidden,
        };
        let out = cli
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("peer-ours.json"));
        match burn_rtp_benches::burn_ddp::ours_child(strategy, settings, &out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: burn-rtp {strategy} on the peer's model: {e}");
                ExitCode::FAILURE
            }
        }
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = cli;
        eprintln!("error: burn-rtp {strategy} on the peer's model needs `--features wgpu`");
        ExitCode::FAILURE
    }
}

/// Runs a link probe as this process's rank (the child of `--net`).
fn net_probe(probe: &str) -> ExitCode {
    #[cfg(feature = "mpi")]
    {
        let result = serde_json::from_str(probe)
            .map_err(|e| format!("unreadable probe: {e}"))
            .and_then(|p| net_report::probe_worker(&p));
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = probe;
        eprintln!("error: a link probe needs `--features mpi`");
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(strategy) = &cli.peer_ours {
        return peer_ours(&cli, strategy);
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
    status
}

/// Adds ours against PyTorch on the same cores to the MPI report in `--out`.
fn add_speed(cli: &Cli) -> ExitCode {
    let log = |m: &str| eprintln!("{m}");
    let (Some(python), TransportKind::Mpi) = (&cli.pytorch, cli.transport) else {
        eprintln!("error: --speed needs --transport mpi and --pytorch PYTHON");
        return ExitCode::FAILURE;
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("error: cannot find this program to start under mpirun: {e}");
            return ExitCode::FAILURE;
        }
    };
    let repeats = cli
        .repeats
        .unwrap_or(if cli.quick || cli.tiny { 1 } else { 3 });
    section_status(
        "speed against PyTorch",
        burn_rtp_benches::mpi_speed::add_to_report(
            &mpi_config(cli),
            &exe,
            python,
            repeats.max(1),
            &log,
        ),
    )
}

/// Adds the inner backends' figures to the report in `out`: in-process, or with
/// `--transport mpi` each cell as its own `mpirun` job.
fn add_backends(cli: &Cli, out: &Path) -> ExitCode {
    let log = |m: &str| eprintln!("{m}");
    if cli.transport == TransportKind::Mpi {
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                eprintln!("error: cannot find this program to start under mpirun: {e}");
                return ExitCode::FAILURE;
            }
        };
        let cfg = mpi_config(cli);
        let repeats = cli
            .repeats
            .unwrap_or(if cli.quick || cli.tiny { 1 } else { 3 });
        return section_status(
            "inner backends under MPI, config A at N = 4",
            burn_rtp_benches::mpi_backends::add_to_report(&cfg, &exe, repeats.max(1), &log),
        );
    }
    let (repeats, steps) = if cli.quick || cli.tiny {
        (2, 1)
    } else {
        (5, 3)
    };
    section_status(
        "inner backends, config A",
        burn_rtp_benches::backend_figures::add_to_report(out, repeats, steps, &log),
    )
}

/// Prints what adding a report section gave (its summary, or its error) as the exit status.
fn section_status(what: &str, added: Result<String, Box<dyn std::error::Error>>) -> ExitCode {
    match added {
        Ok(summary) => {
            println!("{what}: {summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {what}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn report(cli: &Cli) -> ExitCode {
    if cli.burn_ddp_only || cli.wgpu_only || cli.backends_only || cli.speed_only {
        return ExitCode::SUCCESS;
    }
    if let Some(probe) = &cli.net_probe {
        return net_probe(probe);
    }
    if let Some(job) = &cli.mpi_worker {
        let job: Job = match serde_json::from_str(job) {
            Ok(job) => job,
            Err(e) => {
                eprintln!("error: unreadable job: {e}");
                return ExitCode::FAILURE;
            }
        };
        return match mpi_report::worker(&job) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if cli.planner_only && cli.transport == TransportKind::InProcess {
        let grid = if cli.tiny {
            burn_rtp_benches::planner_check::tiny_grid()
        } else {
            burn_rtp_benches::planner_check::full_grid()
        };
        let started = std::time::Instant::now();
        let log = |msg: &str| eprintln!("[{:>6.1} s] {msg}", started.elapsed().as_secs_f64());
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
    let out = cli.out.clone().unwrap_or_else(default_out);
    let mut cfg = if cli.tiny {
        ReportConfig::tiny(out)
    } else {
        ReportConfig::full(out)
    };
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
    if let Some(cap) = cli.cap_bytes {
        cfg.cap_bytes = cap;
    }
    if let Some(r) = cli.repeats {
        cfg.repeats = r.max(1);
    }
    measure(&cfg.out, 5, check_keys, |log| run(&cfg, log))
}
