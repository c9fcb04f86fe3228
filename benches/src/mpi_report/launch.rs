//! Starting jobs: ours under `mpirun` (optionally under `prlimit --as`), the PyTorch peer's
//! under `mpirun` beside them, and reading what a job wrote.

use super::job::{Job, JobResult};
use crate::worker::Worker;
use crate::Variant;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What a cell's job runs: one of our strategies, or the PyTorch peer's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Runner {
    /// Our strategy, in this process's binary.
    Ours(Variant),
    /// PyTorch's DDP (`ddp`), FSDP2 (`fsdp`) or unwrapped model (`single`), in the peer
    /// script.
    PyTorch(&'static str),
}

impl Runner {
    /// Its name in cells and keys.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Runner::Ours(v) => v.name(),
            Runner::PyTorch("ddp") => "pytorch-ddp",
            Runner::PyTorch("single") => "pytorch-single",
            Runner::PyTorch(_) => "pytorch-fsdp",
        }
    }
}

/// The PyTorch peer script of this source tree.
pub fn pytorch_peer_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/pytorch/gpt_peer.py")
}

/// Runs `job` as PyTorch's `strategy` (`ddp` or `fsdp`) under `mpirun -np ranks`, with
/// `python` running the peer script; gloo finds its peers through a free local port.
pub(crate) fn run_peer(
    python: &Path,
    strategy: &str,
    ranks: usize,
    job: &Job,
) -> Result<JobResult, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free local port for gloo: {e}"))?
        .port()
        .to_string();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--allow-run-as-root", "-np"])
        .arg(ranks.to_string());
    for (name, value) in [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port.as_str())] {
        cmd.arg("-x").arg(name).env(name, value);
    }
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .arg(python)
        .arg(pytorch_peer_script())
        .args(["--strategy", strategy, "--job"])
        .arg(serde_json::to_string(job).expect("serialisable"))
        // The same threads per rank as ours: all of them on one host, so our default
        // (`RtpConfig::threads_per_rank_here`) is the cores divided by the ranks.
        .arg("--threads")
        .arg(
            job.threads
                .unwrap_or_else(|| {
                    burn_rtp::RtpConfig::new(ranks)
                        .with_transport(burn_rtp::TransportKind::InProcess)
                        .threads_per_rank_here()
                })
                .to_string(),
        );
    let what = format!("PyTorch {strategy} at -np {ranks}");
    job_output(cmd, job, &what, false)?.ok_or_else(|| format!("{what} wrote no result"))
}

/// Runs `job` under `mpirun -np ranks` (optionally under `prlimit --as`); `Ok(None)` when the
/// job failed, which the capacity search reads as "does not fit".
pub(crate) fn run_job(
    exe: &Path,
    ranks: usize,
    job: &Job,
    as_limit: Option<u64>,
    env: &[(&str, &str)],
) -> Result<Option<JobResult>, String> {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--allow-run-as-root", "-np"])
        .arg(ranks.to_string());
    for (name, value) in env {
        // `-x` exports the variable to every rank, wherever mpirun starts it.
        cmd.arg("-x").arg(name).env(name, value);
    }
    if let Some(limit) = as_limit {
        cmd.arg("prlimit").arg(format!("--as={limit}"));
    }
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let what = format!("{} at -np {ranks}", job.variant.name());
    job_output(
        worker_command(cmd, exe, job),
        job,
        &what,
        as_limit.is_some(),
    )
}

/// `cmd` (a launcher) with `exe` as the MPI worker running `job`.
pub(crate) fn worker_command(cmd: Command, exe: &Path, job: &Job) -> Command {
    Worker::Job {
        job: serde_json::to_string(job).expect("serialisable"),
    }
    .appended(cmd, exe)
}

/// Runs the launcher `cmd` of `job` and reads the job's result. A failed job is an error
/// naming `what`, or `Ok(None)` where `failure_is_none` (the capacity search reads it as "does
/// not fit").
pub(crate) fn job_output(
    mut cmd: Command,
    job: &Job,
    what: &str,
    failure_is_none: bool,
) -> Result<Option<JobResult>, String> {
    let _ = std::fs::remove_file(&job.out);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {what} (is Open MPI installed?): {e}"))?;
    if !out.status.success() {
        if !failure_is_none {
            return Err(format!(
                "{what} failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
        }
        return Ok(None);
    }
    let text = std::fs::read(&job.out)
        .map_err(|e| format!("the job wrote no result ({}): {e}", job.out.display()))?;
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| e.to_string())
}
