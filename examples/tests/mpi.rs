//! The trainer under `mpirun`, one rank per process (cargo feature `mpi`; needs Open MPI).
//!
//! Each test starts this test binary under `mpirun`, running one of the ignored `child_*`
//! tests below in every process, and checks what the job did from outside: the losses it
//! wrote, its exit status, what it printed, and how long it took to end.
#![cfg(feature = "mpi")]

mod common;

use burn_rtp::{RotationMode, Routing};
use burn_rtp_gpt::{train, Strategy};
use common::mpi::{
    child_config, losses, losses_on, mpi_rank, pids, read_report, text, wait_at_most, STEPS,
};
use common::tiny;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

type Inner = burn::backend::NdArray;

/// Starts `np` processes of this binary under mpirun, each running the ignored test `child`.
fn mpirun(np: usize, child: &str, env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--allow-run-as-root", "-np"])
        .arg(np.to_string())
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            child,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn temp_dir(name: &str) -> common::TestDir {
    common::temp_dir(&format!("mpi-{name}"))
}

#[test]
#[ignore = "runs under mpirun, started by the tests of this file"]
fn child_train() {
    common::mpi::child_train();
}

#[test]
#[ignore = "runs under mpirun, started by the tests of this file"]
fn child_train_flex() {
    common::mpi::child_train_on::<burn::backend::Flex>();
}

#[test]
#[ignore = "runs under mpirun, started by the tests of this file"]
fn child_train_until_killed() {
    common::mpi::child_train_until_killed();
}

#[test]
#[ignore = "runs under mpirun, started by the tests of this file"]
fn child_disagreeing_seeds() {
    let mut cfg = child_config();
    cfg.seed = 42 + mpi_rank() as u64;
    if let Err(e) = train::<Inner>(&cfg, |_| Default::default(), None) {
        panic!("{e}");
    }
}

#[test]
#[ignore = "runs under mpirun, started by the tests of this file"]
fn child_wrong_world_size() {
    let mut cfg = child_config();
    cfg.ranks += 1;
    if let Err(e) = train::<Inner>(&cfg, |_| Default::default(), None) {
        panic!("{e}");
    }
}

#[test]
#[ignore = "runs under mpirun, started by the tests of this file"]
fn child_nccl_on_ndarray() {
    let mut cfg = child_config();
    cfg.transport = Some(burn_rtp::TransportKind::Nccl);
    if let Err(e) = train::<Inner>(&cfg, |_| Default::default(), None) {
        panic!("{e}");
    }
}

/// Every strategy at N = 2, 3, 4 processes (and RTP with its activations routed, and choosing
/// per pass) trains like single-device Burn (1e-5 relative), and like the same strategy
/// in-process, bit for bit.
#[test]
fn mpi_training_matches_single_device_and_in_process() {
    let dir = temp_dir("equivalence");
    let single = losses(&tiny(Strategy::Ddp, 1, STEPS));
    let (weights, activations) = (Routing::Weights, Routing::Activations);
    let runs = [
        (Strategy::Rtp, RotationMode::OutOfPlace, weights),
        (Strategy::Rtp, RotationMode::InPlace, weights),
        (Strategy::Rtp, RotationMode::OutOfPlace, activations),
        (Strategy::Rtp, RotationMode::OutOfPlace, Routing::Auto),
        (Strategy::Fsdp, RotationMode::OutOfPlace, weights),
        (Strategy::Ddp, RotationMode::OutOfPlace, weights),
    ];
    for np in [2, 3, 4] {
        for (strategy, rotation, routing) in runs {
            let label = format!("{strategy} {rotation} {routing} at -np {np}");
            let report_path = dir.join(format!("{strategy}-{rotation}-{routing}-{np}.json"));
            let out = mpirun(
                np,
                "child_train",
                &[
                    ("RTP_TEST_STRATEGY", strategy.to_string()),
                    ("RTP_TEST_ROTATION", rotation.to_string()),
                    ("RTP_TEST_ROUTING", routing.to_string()),
                    ("RTP_TEST_REPORT", report_path.display().to_string()),
                ],
            )
            .output()
            .unwrap();
            assert!(out.status.success(), "{label} failed:\n{}", text(&out));
            let report = read_report(&report_path);
            assert_eq!(report.transport, "mpi", "{label}");
            assert_eq!(report.ranks, np, "{label}");
            assert_eq!(report.losses.len(), STEPS, "{label}");
            for (step, (m, s)) in report.losses.iter().zip(&single).enumerate() {
                let rel = (m - s).abs() / s.abs();
                assert!(
                    rel <= 1e-5,
                    "{label}: step {step} loss {m} vs single-device {s} (relative {rel:.2e})"
                );
            }
            let mut cfg = tiny(strategy, np, STEPS);
            cfg.rotation = rotation;
            cfg.routing = routing;
            assert_eq!(
                report.losses,
                losses(&cfg),
                "{label}: MPI and in-process losses differ"
            );
            // One process per rank: each reports its own resident set.
            assert_eq!(report.peak_rss_bytes_per_rank.len(), np, "{label}");
            assert!(
                report.peak_rss_bytes_per_rank.iter().all(|&b| b > 0),
                "{label}: {:?}",
                report.peak_rss_bytes_per_rank
            );
            assert_eq!(report.peak_bytes_per_rank.len(), np, "{label}");
            assert_eq!(report.mpi_progress_per_rank.len(), np, "{label}");
        }
    }
}

/// On Flex, RTP at -np 3 (every parameter sharded) trains like single-device Flex (1e-5
/// relative) and like the same run in-process, bit for bit; Flex's sends lend the tensor's
/// bytes, as NdArray's do.
#[test]
fn flex_under_mpi_matches_single_device_and_in_process() {
    type Flex = burn::backend::Flex;
    let dir = temp_dir("flex");
    let single = losses_on::<Flex>(&tiny(Strategy::Ddp, 1, STEPS));
    let np = 3;
    let report_path = dir.join("rtp-flex-3.json");
    let out = mpirun(
        np,
        "child_train_flex",
        &[
            ("RTP_TEST_STRATEGY", Strategy::Rtp.to_string()),
            ("RTP_TEST_ROTATION", RotationMode::OutOfPlace.to_string()),
            ("RTP_TEST_REPORT", report_path.display().to_string()),
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "rtp on flex at -np {np} failed:\n{}",
        text(&out)
    );
    let report = read_report(&report_path);
    assert_eq!((report.transport.as_str(), report.ranks), ("mpi", np));
    assert_eq!(report.losses.len(), STEPS);
    for (step, (m, s)) in report.losses.iter().zip(&single).enumerate() {
        let rel = (m - s).abs() / s.abs();
        assert!(
            rel <= 1e-5,
            "flex: step {step} loss {m} vs single-device {s} ({rel:.2e})"
        );
    }
    let in_process = losses_on::<Flex>(&tiny(Strategy::Rtp, np, STEPS));
    assert_eq!(
        report.losses, in_process,
        "flex: MPI and in-process losses differ"
    );
}

/// Over a transport that moves a large message only while both processes call MPI (Open
/// MPI's shared memory with single copy turned off), `auto` pacing spins: at once where the
/// host has a core per thread, else from the first large receive that outlived its match.
/// `backoff` keeps sleeping between tests. The pacing changes when bytes move, not what
/// arrives: both runs train the same losses. Where the kernel takes it, every rank's
/// communication thread runs with the short scheduler slice it asks for, and on glibc every
/// process with one malloc arena, unless the configuration leaves the allocator alone, and
/// with freed pages kept for the next step.
#[test]
fn auto_progress_spins_where_the_transport_needs_calls_to_move_bytes() {
    let dir = temp_dir("progress");
    let np = 2;
    let mut runs = Vec::new();
    for progress in ["auto", "backoff"] {
        let report_path = dir.join(format!("{progress}.json"));
        let mut env: Vec<(&str, String)> = vec![
            ("RTP_TEST_STRATEGY", "rtp".into()),
            ("RTP_TEST_ROTATION", "out-of-place".into()),
            // The weights rotating, whatever this batch would make `Auto` choose: the large
            // receives are their shards.
            ("RTP_TEST_ROUTING", "weights".into()),
            ("RTP_TEST_STEPS", "2".into()),
            // 256 wide: each rank's MLP shard is 512 KiB, above `LARGE_RECEIVE`.
            ("RTP_TEST_D_MODEL", "256".into()),
            ("RTP_TEST_MPI_PROGRESS", progress.into()),
            ("RTP_TEST_REPORT", report_path.display().to_string()),
            // Single copy is a setting of the ob1 message layer's shared-memory transport.
            ("OMPI_MCA_pml", "ob1".into()),
            ("OMPI_MCA_btl_vader_single_copy_mechanism", "none".into()),
        ];
        if progress == "backoff" {
            // This run leaves the allocator alone, as a user can ask.
            env.push(("RTP_TEST_KEEP_MALLOC_ARENAS", "1".into()));
        }
        let out = mpirun(np, "child_train", &env).output().unwrap();
        assert!(out.status.success(), "{progress} failed:\n{}", text(&out));
        runs.push(read_report(&report_path));
    }
    let (auto, backoff) = (&runs[0], &runs[1]);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for policy in &auto.mpi_progress_per_rank {
        assert!(policy.starts_with("spin (auto"), "{policy}");
        if cores < 2 * np {
            assert!(policy.contains("needed progress calls"), "{policy}");
        }
    }
    assert_eq!(auto.mpi_progress_per_rank.len(), np);
    for policy in &backoff.mpi_progress_per_rank {
        assert!(policy.starts_with("backoff (asked"), "{policy}");
    }
    assert_eq!(backoff.mpi_progress_per_rank.len(), np);
    assert_eq!(auto.losses, backoff.losses);
    // Linux 6.12 and later give the communication thread the short slice it asks for, under
    // the normal policies that mpirun's processes inherit from this one.
    if kernel_at_least(6, 12) && normal_policy() {
        for policy in runs.iter().flat_map(|r| &r.mpi_progress_per_rank) {
            assert!(policy.contains("; 100 µs scheduler slice"), "{policy}");
        }
    }
    // On glibc every process shares one malloc arena between its threads, unless the
    // environment (which mpirun passes on) sets the number itself, or the configuration
    // turned it off (the backoff run).
    if cfg!(all(target_os = "linux", target_env = "gnu"))
        && std::env::var_os("MALLOC_ARENA_MAX").is_none()
    {
        for policy in &auto.mpi_progress_per_rank {
            assert!(policy.contains("; one malloc arena"), "{policy}");
        }
    }
    for policy in &backoff.mpi_progress_per_rank {
        assert!(!policy.contains("malloc arena"), "{policy}");
    }
    // Both runs keep freed pages for reuse, the default, unless the environment sets glibc's
    // thresholds itself.
    let thresholds_set = [
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "GLIBC_TUNABLES",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some());
    if cfg!(all(target_os = "linux", target_env = "gnu")) && !thresholds_set {
        for policy in runs.iter().flat_map(|r| &r.mpi_progress_per_rank) {
            assert!(policy.ends_with("; freed pages kept"), "{policy}");
        }
    }
}

/// Whether this process runs under a normal scheduling policy (`SCHED_OTHER` or
/// `SCHED_BATCH`: field 41 of `/proc/self/stat`), as opposed to a real-time or idle one.
fn normal_policy() -> bool {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return false;
    };
    // Fields after the command name, which is in parentheses, start at field 3.
    let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
    matches!(after.split_whitespace().nth(41 - 3), Some("0") | Some("3"))
}

/// Whether the running Linux kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    (parts.next(), parts.next()) >= (Some(major), Some(minor))
}

/// Starts a long RTP run on `np` processes with the given peer timeout, sends `signal` to
/// rank 1 once every rank trains, and waits (at most 60 s) for the job to end. Returns its
/// output and how long it took to end after the signal.
fn signal_rank_1_mid_training(
    name: &str,
    np: usize,
    peer_timeout: &str,
    signal: &str,
) -> (Output, Duration) {
    let dir = temp_dir(name);
    let env = [
        ("RTP_TEST_STRATEGY", "rtp".to_string()),
        ("RTP_TEST_ROTATION", "out-of-place".into()),
        ("RTP_TEST_STEPS", "1000000".into()),
        ("RTP_TEST_PEER_TIMEOUT", peer_timeout.into()),
        ("RTP_TEST_DIR", dir.display().to_string()),
    ];
    let child = mpirun(np, "child_train_until_killed", &env)
        .spawn()
        .unwrap();
    let pid: u32 = pids(&dir, np)[1].trim().parse().unwrap();
    let signalled = Instant::now();
    common::kill(signal, pid);
    let out = wait_at_most(child, Duration::from_secs(60));
    let took = signalled.elapsed();
    // A stopped rank that mpirun did not reap must not outlive the test.
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    (out, took)
}

/// A rank killed with SIGKILL mid-training: the job ends within 30 s, with a non-zero status.
#[test]
fn a_killed_rank_ends_the_job_within_30_s() {
    let (out, took) = signal_rank_1_mid_training("kill", 3, "120", "-KILL");
    eprintln!(
        "after SIGKILL of rank 1 the job ended in {took:.1?} with {}",
        out.status
    );
    assert!(
        !out.status.success(),
        "the job succeeded after losing a rank:\n{}",
        text(&out)
    );
    assert!(
        took < Duration::from_secs(30),
        "the job took {took:?} to end after rank 1 was killed"
    );
}

/// A rank that stops answering (SIGSTOP): its peers fail after the peer timeout with an error
/// that names it, and the job ends.
#[test]
fn a_silent_rank_is_a_timeout_naming_it() {
    let (out, took) = signal_rank_1_mid_training("stall", 2, "3", "-STOP");
    let log = text(&out);
    eprintln!(
        "after SIGSTOP of rank 1 the job ended in {took:.1?} with {}; rank 0 said: {}",
        out.status,
        log.lines()
            .find(|l| l.contains("waiting for rank 1"))
            .unwrap_or("(nothing)")
    );
    assert!(!out.status.success(), "the job succeeded:\n{log}");
    assert!(
        log.contains("rank 0: op") && log.contains("waiting for rank 1"),
        "no timeout naming rank 1:\n{log}"
    );
    assert!(
        took < Duration::from_secs(30),
        "the job took {took:?} to end after rank 1 stopped"
    );
}

/// Runs `child` as an RTP job on `np` processes that must fail; returns its output.
fn failing_rtp_job(np: usize, child: &str) -> String {
    let out = mpirun(
        np,
        child,
        &[
            ("RTP_TEST_STRATEGY", "rtp".into()),
            ("RTP_TEST_ROTATION", "out-of-place".into()),
        ],
    )
    .output()
    .unwrap();
    let log = text(&out);
    assert!(!out.status.success(), "the job succeeded:\n{log}");
    log
}

/// Ranks started with different seeds fail, every one of them, before the first step.
#[test]
fn ranks_with_different_settings_all_fail_before_training() {
    let np = 3;
    let log = failing_rtp_job(np, "child_disagreeing_seeds");
    for rank in 0..np {
        assert!(
            log.contains(&format!("rank {rank}: ranks disagree on the seed")),
            "rank {rank} did not report the disagreement:\n{log}"
        );
    }
}

/// A configured world size that differs from mpirun's `-np` is a typed error, not a hang.
#[test]
fn a_world_size_other_than_np_is_an_error() {
    let log = failing_rtp_job(2, "child_wrong_world_size");
    assert!(
        log.contains("asks for 3 ranks, but mpirun started 2 processes"),
        "{log}"
    );
}

/// Asking for NCCL where it cannot run (a build without it, or a CPU backend) fails on every
/// rank with a typed error that says why, before any step.
#[test]
fn nccl_where_it_cannot_run_is_an_error_on_every_rank() {
    let np = 2;
    let log = failing_rtp_job(np, "child_nccl_on_ndarray");
    let why = if cfg!(feature = "nccl") {
        "NCCL moves CUDA tensors"
    } else {
        "built without NCCL: rebuild with `--features nccl`"
    };
    assert!(
        log.matches("transport `nccl` is unavailable").count() >= np && log.contains(why),
        "{log}"
    );
}

/// A graceful stop of an mpirun job, in the two ways a user or a scheduler sends it: SIGTERM
/// to every rank (what Slurm's `scancel` does) and SIGUSR1 to mpirun (which forwards it).
/// Every rank finishes within 2 steps, the checkpoint is written, the job exits 0, and
/// resuming continues bit-exactly.
#[test]
fn a_signal_stops_an_mpi_job_cleanly_and_its_checkpoint_resumes_exactly() {
    let gpt = common::gpt_binary();
    for (how, np) in [("sigterm-ranks", 3), ("sigusr1-mpirun", 2)] {
        let dir = temp_dir(how);
        let root = dir.join("ckpt");
        let flags = common::tiny_flags(np);
        let mut cmd = Command::new("mpirun");
        cmd.args([
            "--oversubscribe",
            "--allow-run-as-root",
            "-np",
            &np.to_string(),
        ])
        .arg(&gpt)
        .args(&flags)
        .args(["--steps", "100000", "--log-every", "1"])
        .arg("--checkpoint-dir")
        .arg(&root)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        let stop = common::stop_mid_run(cmd, common::Freeze::Children, |mpirun| {
            let targets = if how == "sigterm-ranks" {
                let ranks = common::children(mpirun);
                assert_eq!(
                    ranks.len(),
                    np,
                    "rank processes of mpirun {mpirun}: {ranks:?}"
                );
                ranks.into_iter().map(|p| ("-TERM", p)).collect()
            } else {
                vec![("-USR1", mpirun)]
            };
            for (signal, pid) in targets {
                common::kill(signal, pid);
            }
        });
        eprintln!(
            "{how}: signalled after step {}, stopped after step {}",
            stop.seen, stop.stopped
        );
        let manifest = root
            .join(format!("step-{:08}", stop.stopped))
            .join("manifest.json");
        assert!(manifest.exists(), "{how}: {:?}", stop.rest);
        common::assert_resumes_exactly(&gpt, &flags, &root, stop.stopped, &dir);
    }
}
