//! `scaling-report worker ...`: the roles in which the reports start their own binary again,
//! under `mpirun`, in a cluster host, or as a child process. One enum is both the command
//! line the binary parses and the one the reports write ([`Worker::args`]), so the two cannot
//! drift apart.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

/// The subcommand's name on the binary's command line.
pub const SUBCOMMAND: &str = "worker";

/// One role of `scaling-report worker`.
#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum Worker {
    /// Run one MPI job as this process's rank (started by mpirun for `--transport mpi`).
    Job {
        /// The job, as JSON (`mpi_report::Job`).
        job: String,
    },
    /// Probe a link as this process's rank (started in the cluster's hosts by `--net`).
    Probe {
        /// The probe, as JSON (`net_report::Probe`).
        probe: String,
    },
    /// Train Burn's peer model under one of our strategies and write what it measured (started
    /// by `--burn-ddp`, one child process per strategy, so that each peak resident set is its
    /// own).
    Peer {
        /// `ddp` or `rtp`.
        strategy: String,
        /// Training steps.
        #[arg(long, default_value_t = 20)]
        steps: usize,
        /// Global batch.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Hidden width.
        #[arg(long, default_value_t = 256)]
        hidden: usize,
        /// Where to write the result (JSON).
        #[arg(long)]
        out: PathBuf,
    },
}

impl Worker {
    /// The arguments after the binary that start this role: `worker <role> ...`.
    pub fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![SUBCOMMAND.into()];
        match self {
            Worker::Job { job } => args.extend(["job".into(), job.into()]),
            Worker::Probe { probe } => args.extend(["probe".into(), probe.into()]),
            Worker::Peer {
                strategy,
                steps,
                batch,
                hidden,
                out,
            } => {
                args.extend(["peer".into(), strategy.into()]);
                for (flag, value) in [("--steps", steps), ("--batch", batch), ("--hidden", hidden)]
                {
                    args.extend([flag.into(), value.to_string().into()]);
                }
                args.extend(["--out".into(), out.into()]);
            }
        }
        args
    }

    /// `cmd` (a launcher such as `mpirun`, or nothing yet) with `exe` started in this role.
    pub fn appended(&self, mut cmd: Command, exe: &std::path::Path) -> Command {
        cmd.arg(exe).args(self.args());
        cmd
    }

    /// `exe` started in this role, on its own.
    pub fn command(&self, exe: &std::path::Path) -> Command {
        let mut cmd = Command::new(exe);
        cmd.args(self.args());
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(clap::Subcommand)]
    enum Top {
        Worker {
            #[command(subcommand)]
            role: Worker,
        },
    }

    #[test]
    fn every_role_parses_back_from_its_own_arguments() {
        for role in [
            Worker::Job {
                job: "{\"a\": [1, 2]}".into(),
            },
            Worker::Probe { probe: "{}".into() },
            Worker::Peer {
                strategy: "rtp".into(),
                steps: 3,
                batch: 8,
                hidden: 16,
                out: PathBuf::from("/tmp/x y.json"),
            },
        ] {
            let argv = std::iter::once(OsString::from("scaling-report")).chain(role.args());
            let Top::Worker { role: parsed } = Cli::try_parse_from(argv).unwrap().command;
            assert_eq!(parsed, role);
        }
    }
}
