//! The trainer across hosts: Open MPI over TCP between network namespaces
//! (`benches/net/cluster.sh`; cargo feature `mpi`, root, iproute2 and Open MPI).
//!
//! Each test starts this test binary on a cluster of 2 hosts × 2 ranks, running one of the
//! ignored `child_*` tests below in every rank, and checks what the job did from outside.
#![cfg(feature = "mpi")]

mod common;

use burn_rtp::RotationMode;
use burn_rtp_gpt::Strategy;
use common::mpi::{losses, pids, read_report, text, wait_at_most, STEPS};
use common::tiny;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Hosts, and ranks per host.
const HOSTS: usize = 2;
const SLOTS: usize = 2;

#[test]
#[ignore = "runs on the cluster, started by the tests of this file"]
fn child_train() {
    common::mpi::child_train();
}

#[test]
#[ignore = "runs on the cluster, started by the tests of this file"]
fn child_train_until_killed() {
    common::mpi::child_train_until_killed();
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/net/cluster.sh")
}

/// Whether this process may make network namespaces; says why not where it may not.
fn can_make_hosts() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let ip = Command::new("ip").arg("-V").output().is_ok();
    if !(root && ip) {
        eprintln!("SKIPPED: the cluster needs root and iproute2 (ip, tc)");
    }
    root && ip
}

/// A cluster named `name` of `HOSTS` × `SLOTS` ranks, each running the ignored test `child`,
/// ended after `timeout_s`.
fn cluster(name: &str, child: &str, timeout_s: u64, env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(script())
        .args(["run", "--name", name])
        .args(["--hosts", &HOSTS.to_string(), "--slots", &SLOTS.to_string()])
        .args(["--rate", "1gbit", "--timeout", &timeout_s.to_string(), "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            child,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// A cluster name no other test process uses (at most 10 characters).
fn name(tag: &str) -> String {
    format!("rt{tag}{}", std::process::id() % 100_000)
}

/// The namespaces of the cluster `name` that still exist.
fn leftovers(name: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|ns| ns.starts_with(&format!("{name}h")))
        .map(String::from)
        .collect()
}

/// Every strategy on 2 hosts × 2 ranks over TCP (links at 1 Gbit/s) trains the same losses as
/// the same strategy with 4 in-process ranks, bit for bit.
#[test]
fn two_hosts_over_tcp_train_like_in_process() {
    if !can_make_hosts() {
        return;
    }
    let dir = common::temp_dir("net-equivalence");
    let np = HOSTS * SLOTS;
    for (strategy, rotation) in [
        (Strategy::Rtp, RotationMode::OutOfPlace),
        (Strategy::Rtp, RotationMode::InPlace),
        (Strategy::Fsdp, RotationMode::OutOfPlace),
        (Strategy::Ddp, RotationMode::OutOfPlace),
    ] {
        let label = format!("{strategy} {rotation} on {HOSTS} hosts x {SLOTS} ranks");
        let report_path = dir.join(format!("{strategy}-{rotation}.json"));
        let cluster_name = name("e");
        let out = cluster(
            &cluster_name,
            "child_train",
            120,
            &[
                ("RTP_TEST_STRATEGY", strategy.to_string()),
                ("RTP_TEST_ROTATION", rotation.to_string()),
                ("RTP_TEST_REPORT", report_path.display().to_string()),
            ],
        )
        .output()
        .unwrap();
        assert!(out.status.success(), "{label} failed:\n{}", text(&out));
        assert!(leftovers(&cluster_name).is_empty(), "{label}: left behind");
        let report = read_report(&report_path);
        assert_eq!(report.transport, "mpi", "{label}");
        assert_eq!(report.ranks, np, "{label}");
        assert_eq!(report.losses.len(), STEPS, "{label}");
        let mut cfg = tiny(strategy, np, STEPS);
        cfg.rotation = rotation;
        assert_eq!(
            report.losses,
            losses(&cfg),
            "{label}: losses over TCP differ from the in-process run"
        );
        eprintln!("{label}: {STEPS} losses bit-identical to 4 in-process ranks");
    }
}

/// Whether process `pid` still runs (a zombie counts as ended).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.split(") ").nth(1).unwrap_or("").starts_with('Z'))
}

/// Host 1's link goes down mid-run: every rank stops within the peer timeout + 10 s with an
/// error naming a rank it can no longer reach, the job exits non-zero, and the cluster is
/// gone afterwards, processes included.
#[test]
fn a_host_whose_link_goes_down_ends_the_job() {
    if !can_make_hosts() {
        return;
    }
    let peer_timeout = 5.0;
    let dir = common::temp_dir("net-link-down");
    let cluster_name = name("f");
    let env = [
        ("RTP_TEST_STRATEGY", "rtp".to_string()),
        ("RTP_TEST_ROTATION", "out-of-place".into()),
        ("RTP_TEST_STEPS", "1000000".into()),
        ("RTP_TEST_PEER_TIMEOUT", peer_timeout.to_string()),
        ("RTP_TEST_DIR", dir.display().to_string()),
    ];
    let child = cluster(&cluster_name, "child_train_until_killed", 120, &env)
        .spawn()
        .unwrap();
    let np = HOSTS * SLOTS;
    let ranks: Vec<u32> = pids(&dir, np)
        .iter()
        .map(|p| p.trim().parse().unwrap())
        .collect();
    let down = Instant::now();
    let link = format!("{cluster_name}v1");
    let status = Command::new("ip")
        .args(["link", "set", &link, "down"])
        .status()
        .unwrap();
    assert!(status.success(), "cannot take {link} down");
    let limit = Duration::from_secs_f64(peer_timeout + 10.0);
    let mut stopped = vec![None; np];
    while stopped.iter().any(Option::is_none) && down.elapsed() < limit + Duration::from_secs(5) {
        for (r, &pid) in ranks.iter().enumerate() {
            if stopped[r].is_none() && !alive(pid) {
                stopped[r] = Some(down.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = wait_at_most(child, Duration::from_secs(150));
    let ended = down.elapsed();
    let log = text(&out);
    eprintln!(
        "link of host 1 down: ranks stopped after {stopped:?}; the job ended after {ended:.1?} with {}; {}",
        out.status,
        log.lines()
            .find(|l| l.contains("waiting for rank"))
            .unwrap_or("(no timeout reported)")
    );
    for (r, t) in stopped.iter().enumerate() {
        let t = t.unwrap_or_else(|| {
            panic!("rank {r} still ran {limit:?} after the link went down:\n{log}")
        });
        assert!(t <= limit, "rank {r} took {t:?} to stop:\n{log}");
    }
    assert!(!out.status.success(), "the job succeeded:\n{log}");
    // mpirun learns within about 16 s that host 1 is cut off (cluster.sh): the job ends by
    // itself, not by the cluster's --timeout.
    assert_ne!(
        out.status.code(),
        Some(124),
        "the job hung until the cluster's timeout:\n{log}"
    );
    // Ranks 0 and 1 live on host 0, ranks 2 and 3 on host 1: each host's ranks time out on a
    // rank of the other host.
    let named = |own: [usize; 2], other: [usize; 2]| {
        log.lines().any(|line| {
            own.iter().any(|r| line.contains(&format!("rank {r}: op")))
                && other
                    .iter()
                    .any(|p| line.contains(&format!("waiting for rank {p}")))
        })
    };
    assert!(
        named([0, 1], [2, 3]) || named([2, 3], [0, 1]),
        "no error names a rank across the cut link:\n{log}"
    );
    assert!(
        leftovers(&cluster_name).is_empty(),
        "namespaces left behind: {:?}",
        leftovers(&cluster_name)
    );
    for &pid in &ranks {
        assert!(!alive(pid), "rank process {pid} still runs");
    }
}
