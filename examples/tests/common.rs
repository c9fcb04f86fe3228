//! A tiny configuration and an independent single-device reference trainer.
#![allow(dead_code)]

use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use burn_rtp_gpt::data::{Corpus, Windows};
use burn_rtp_gpt::{GptConfig, Strategy, TrainConfig};

pub type Plain = Autodiff<NdArray>;

pub fn tiny(strategy: Strategy, ranks: usize, steps: usize) -> TrainConfig {
    let mut cfg = TrainConfig::new(strategy, ranks);
    cfg.steps = steps;
    cfg.batch = 12;
    cfg.model = GptConfig::new(8, 20, 1, 2);
    // The tiny model's layers are all below the default threshold: shard them anyway, so
    // that the tests exercise rotation.
    cfg.shard_threshold = Some(0);
    cfg.lr = 3e-3;
    cfg.eval_every = 0;
    cfg.eval_batches = 1;
    cfg
}

/// A fresh directory for one test, removed when the test ends. A failing test keeps it (and
/// prints where), since its checkpoints and reports are what one reads to see why.
pub struct TestDir(std::path::PathBuf);

impl std::ops::Deref for TestDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for inspection: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub fn temp_dir(name: &str) -> TestDir {
    let dir = std::env::temp_dir().join(format!("burn-rtp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TestDir(dir)
}

/// Trains the same model on plain `Autodiff<NdArray>` with the trainer's data order.
pub fn reference_losses(cfg: &TrainConfig, init: &std::path::Path) -> Vec<f64> {
    let device = Default::default();
    let corpus = Corpus::load(None, cfg.model.seq).unwrap();
    let mut model =
        burn_rtp_gpt::checkpoint::load_consolidated::<Plain>(init, &cfg.model, &device).unwrap();
    let mut optim = AdamConfig::new().init::<Plain, burn_rtp_gpt::Gpt<Plain>>();
    let mut losses = Vec::new();
    for step in 0..cfg.steps {
        let (x, y) = Windows::train(&corpus, cfg.seed, step, 0..cfg.batch, cfg.model.seq)
            .tensors::<Plain>(&device);
        let loss = model.loss(x, y);
        losses.push(loss.clone().into_scalar().elem::<f64>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(cfg.lr, model, grads);
    }
    let _ = model.valid();
    losses
}

/// Validation loss of a single-device model, as the trainer computes it.
pub fn reference_val_loss(cfg: &TrainConfig, model: &burn_rtp_gpt::Gpt<NdArray>) -> f64 {
    let device = Default::default();
    let corpus = Corpus::load(None, cfg.model.seq).unwrap();
    let total = cfg.batch * cfg.eval_batches;
    let mut sum = 0.0;
    for b in 0..cfg.eval_batches {
        let rows = b * cfg.batch..(b + 1) * cfg.batch;
        let (x, y) = Windows::val(&corpus, rows, total, cfg.model.seq).tensors::<NdArray>(&device);
        sum += model.loss(x, y).into_scalar().elem::<f64>();
    }
    sum / cfg.eval_batches as f64
}

/// A fresh single-device model saved as a full record, to start every strategy from.
pub fn initial_weights(cfg: &TrainConfig, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("init.mpk");
    let device = Default::default();
    let model = cfg.model.init::<NdArray>(&device);
    burn_rtp_gpt::checkpoint::save_full(model, &path).unwrap();
    path
}

pub fn rel_close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * a.abs().max(b.abs()).max(1e-6)
}

/// The `gpt` example binary of this build, built first if needed (a no-op after
/// `cargo test --workspace`, which builds the examples before it runs the tests).
pub fn gpt_binary() -> std::path::PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "-q", "-p", "burn-rtp-gpt", "--example", "gpt"]);
    if cfg!(feature = "mpi") {
        cmd.args(["--features", "mpi"]);
    }
    let status = cmd.status().expect("cargo runs");
    assert!(status.success(), "building the gpt example failed");
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> -> target/<profile>/examples/gpt
    let path = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join("gpt");
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// The tiny configuration of [`tiny`] as `gpt` flags.
pub fn tiny_flags(ranks: usize) -> Vec<String> {
    [
        "--ranks",
        &ranks.to_string(),
        "--batch",
        "12",
        "--seq",
        "8",
        "--d-model",
        "20",
        "--layers",
        "1",
        "--heads",
        "2",
        "--shard-threshold",
        "0",
        "--eval-every",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// What a run stopped by a signal printed and how it ended.
pub struct Stopped {
    /// The last step the run had printed when the signal was sent.
    pub seen: usize,
    /// The step the run says it stopped after.
    pub stopped: usize,
    /// Its exit status.
    pub status: std::process::ExitStatus,
    /// What it printed after the signal.
    pub rest: Vec<String>,
}

fn step_of(line: &str) -> Option<usize> {
    line.strip_prefix("step ")
        .and_then(|l| l.split('/').next())
        .and_then(|s| s.parse().ok())
}

/// Which processes `stop_mid_run` freezes (SIGSTOP) while it reads the last step printed and
/// signals, thawing them (SIGCONT) once the signal is pending. Frozen, the trainer cannot run
/// on between the test's read and the signal's arrival, however starved the test is: under
/// heavy load it ran several steps there, and a prompt stop looked late.
pub enum Freeze {
    /// The process started: a trainer whose ranks are its threads.
    Process,
    /// Its children: the ranks under `mpirun`. mpirun runs on, to forward what they printed;
    /// the read ends once it has forwarded nothing for 0.5 s.
    Children,
}

/// The processes whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let out = std::process::Command::new("pgrep")
        .args(["-P", &pid.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

/// Sends `signal` (as `kill` spells it, "-STOP") to `pid` and checks that it was sent.
pub fn kill(signal: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}: {status}");
}

/// Waits (at most 60 s) until `done` holds, polling every millisecond.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited 60 s for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Stops `pid` with SIGSTOP and returns once every one of its threads has stopped: `kill`
/// returns before a thread running on another core has.
fn freeze(pid: u32) {
    kill("-STOP", pid);
    let tasks = format!("/proc/{pid}/task");
    wait_until(&format!("process {pid} to stop"), || {
        std::fs::read_dir(&tasks).unwrap().flatten().all(|task| {
            // The state is the field after the command name's closing parenthesis.
            std::fs::read_to_string(task.path().join("stat")).map_or(true, |stat| {
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with(['T', 't', 'Z', 'X']))
            })
        })
    });
}

/// Waits until frozen `pid` has a signal pending (its shared pending mask, `ShdPnd` in
/// /proc/PID/status, is not empty): one sent through mpirun reaches the ranks later.
fn wait_for_pending_signal(pid: u32) {
    wait_until(&format!("a signal pending on process {pid}"), || {
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
            status.lines().any(|l| {
                l.strip_prefix("ShdPnd:")
                    .is_some_and(|mask| u64::from_str_radix(mask.trim(), 16) != Ok(0))
            })
        })
    });
}

/// Kills (SIGKILL) the processes `stop_mid_run` started or froze when one of its checks
/// fails, so that a failing test leaves no stopped or runaway trainer behind.
struct KillOnPanic(Vec<u32>);

impl Drop for KillOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for pid in &self.0 {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}

/// Starts `cmd` (a `gpt` run with `--log-every 1`), calls `signal(pid)` once it printed step 3,
/// and waits (at most 120 s) for it to end.
pub fn stop_mid_run(
    mut cmd: std::process::Command,
    how: Freeze,
    signal: impl FnOnce(u32),
) -> Stopped {
    use std::io::BufRead;
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;
    use std::process::Stdio;
    // The trainer writes to a socket rather than a pipe so that, just before signalling, the
    // test can read without blocking every line already written. The test may have fallen
    // behind the trainer, and lines of later steps may sit unread.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut run = cmd
        .stdout(Stdio::from(OwnedFd::from(theirs)))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The command keeps its copy of the trainer's end; without this drop, no end of file.
    drop(cmd);
    let pid = run.id();
    let mut started = KillOnPanic(vec![pid]);
    let mut out = std::io::BufReader::new(ours);
    let mut line = String::new();
    let mut seen = 0;
    while seen < 3 && out.read_line(&mut line).unwrap() > 0 {
        seen = step_of(line.trim_end_matches('\n')).unwrap_or(seen);
        line.clear();
    }
    assert!(seen >= 3, "the trainer printed no progress");
    let (frozen, quiet) = match how {
        Freeze::Process => (vec![pid], std::time::Duration::ZERO),
        Freeze::Children => (children(pid), std::time::Duration::from_millis(500)),
    };
    assert!(
        !frozen.is_empty(),
        "process {pid} has no children to freeze"
    );
    started.0.extend(&frozen);
    frozen.iter().for_each(|&p| freeze(p));
    out.get_ref().set_nonblocking(true).unwrap();
    let mut last_news = std::time::Instant::now();
    loop {
        let before = line.len();
        match out.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) if line.ends_with('\n') => {
                seen = step_of(line.trim_end_matches('\n')).unwrap_or(seen);
                line.clear();
                last_news = std::time::Instant::now();
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if line.len() > before {
                    last_news = std::time::Instant::now();
                } else if last_news.elapsed() >= quiet {
                    break;
                } else {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            Err(e) => panic!("reading the trainer's output: {e}"),
        }
    }
    signal(pid);
    for &p in &frozen {
        wait_for_pending_signal(p);
        kill("-CONT", p);
    }
    out.get_ref().set_nonblocking(false).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // A line cut short by the drain above is completed here, not lost.
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        while out.read_line(&mut line).is_ok_and(|n| n > 0) {
            rest.push(line.trim_end_matches('\n').to_owned());
            line.clear();
        }
        let _ = tx.send(rest);
    });
    let rest = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .unwrap_or_else(|_| {
            let _ = run.kill();
            panic!("the run did not end within 120 s of the signal")
        });
    let status = run.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "exit {status}: {stderr}\n{rest:?}");
    let last = rest.iter().filter_map(|l| step_of(l)).max().unwrap_or(seen);
    let stopped: usize = rest
        .iter()
        .find_map(|l| l.strip_prefix("stopped by a signal after step "))
        .and_then(|l| l.split(';').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no stop line in {rest:?}\n{stderr}"));
    assert_eq!(
        stopped, last,
        "the last progress line and the stop line disagree: {rest:?}"
    );
    assert!(
        stopped <= seen + 2,
        "signalled after step {seen} was printed, stopped after step {stopped}"
    );
    Stopped {
        seen,
        stopped,
        status,
        rest,
    }
}

/// Resumes the checkpoint under `root` in-process for 4 steps and checks that the losses equal
/// those of one straight run through the same steps, bit for bit.
pub fn assert_resumes_exactly(
    gpt: &std::path::Path,
    flags: &[String],
    root: &std::path::Path,
    stopped: usize,
    dir: &std::path::Path,
) {
    let more = 4;
    let run = |steps: usize, resume: bool, report: &str| {
        let mut cmd = std::process::Command::new(gpt);
        cmd.args(flags)
            .args(["--steps", &steps.to_string(), "--transport", "in-process"])
            .arg("--report")
            .arg(dir.join(report));
        if resume {
            cmd.arg("--resume").arg(root);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = std::fs::read_to_string(dir.join(report)).unwrap();
        serde_json::from_str::<burn_rtp_gpt::Report>(&text)
            .unwrap()
            .losses
    };
    let resumed = run(more, true, "resumed.json");
    let straight = run(stopped + more, false, "straight.json");
    assert_eq!(
        resumed,
        straight[stopped..],
        "resuming after the signal must continue bit for bit"
    );
}

/// What the MPI suites share: the jobs a child process runs, and how a parent reads them.
#[cfg(feature = "mpi")]
pub mod mpi {
    use super::tiny;
    use burn_rtp_gpt::{train, GptConfig, Report, TrainConfig};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Output};
    use std::time::{Duration, Instant};

    type Inner = burn::backend::NdArray;

    /// Steps of the equivalence runs.
    pub const STEPS: usize = 4;

    /// The configuration a child trains, read from the variables its parent set.
    pub fn child_config() -> TrainConfig {
        let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
        let np: usize = var("OMPI_COMM_WORLD_SIZE").parse().unwrap();
        let mut cfg = tiny(var("RTP_TEST_STRATEGY").parse().unwrap(), np, STEPS);
        cfg.rotation = var("RTP_TEST_ROTATION").parse().unwrap();
        if let Ok(routing) = std::env::var("RTP_TEST_ROUTING") {
            cfg.routing = routing.parse().unwrap();
        }
        if let Ok(steps) = std::env::var("RTP_TEST_STEPS") {
            cfg.steps = steps.parse().unwrap();
        }
        if let Ok(secs) = std::env::var("RTP_TEST_PEER_TIMEOUT") {
            cfg.peer_timeout = Some(Duration::from_secs_f64(secs.parse().unwrap()));
        }
        if let Ok(d_model) = std::env::var("RTP_TEST_D_MODEL") {
            cfg.model = GptConfig::new(8, d_model.parse().unwrap(), 1, 4);
        }
        if let Ok(progress) = std::env::var("RTP_TEST_MPI_PROGRESS") {
            cfg.mpi_progress = progress.parse().unwrap();
        }
        if std::env::var_os("RTP_TEST_KEEP_MALLOC_ARENAS").is_some() {
            cfg.one_malloc_arena = false;
        }
        cfg
    }

    pub fn mpi_rank() -> usize {
        burn_rtp::transport::mpi_launch()
            .expect("started by mpirun")
            .rank
    }

    pub fn text(out: &Output) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    pub fn losses(cfg: &TrainConfig) -> Vec<f64> {
        losses_on::<Inner>(cfg)
    }

    /// The in-process run's losses on the inner backend `I`.
    pub fn losses_on<I: burn_rtp::RotationKernels>(cfg: &TrainConfig) -> Vec<f64>
    where
        I::Device: Default,
    {
        let mut cfg = cfg.clone();
        cfg.transport = Some(burn_rtp::TransportKind::InProcess);
        train::<I>(&cfg, |_| Default::default(), None)
            .unwrap()
            .report
            .losses
    }

    pub fn read_report(path: &Path) -> Report {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// Waits for the job to end, at most `limit`.
    pub fn wait_at_most(child: Child, limit: Duration) -> Output {
        let id = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(limit) {
            Ok(out) => out.unwrap(),
            Err(_) => {
                let _ = Command::new("kill").args(["-9", &id.to_string()]).status();
                panic!("the job was still running {limit:?} after the fault: a hang");
            }
        }
    }

    /// Waits until every rank wrote its pid, then lets it train a little.
    pub fn pids(dir: &Path, np: usize) -> Vec<String> {
        let started = Instant::now();
        loop {
            let pids: Vec<_> = (0..np)
                .filter_map(|r| std::fs::read_to_string(dir.join(format!("pid.{r}"))).ok())
                .collect();
            if pids.len() == np {
                std::thread::sleep(Duration::from_secs(2));
                return pids;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the ranks did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A child's job: trains as the variables ask; rank 0 writes its report to
    /// `RTP_TEST_REPORT`.
    pub fn child_train() {
        child_train_on::<Inner>();
    }

    /// [`child_train`] on the inner backend `I`.
    pub fn child_train_on<I: burn_rtp::RotationKernels>()
    where
        I::Device: Default,
    {
        let cfg = child_config();
        let out = train::<I>(&cfg, |_| Default::default(), None)
            .unwrap_or_else(|e| panic!("rank {}: {e}", mpi_rank()));
        if out.rank == 0 {
            let path = std::env::var("RTP_TEST_REPORT").unwrap();
            std::fs::write(path, serde_json::to_string(&out.report).unwrap()).unwrap();
        }
    }

    /// A child's job that writes its pid to `RTP_TEST_DIR/pid.<rank>` first, for a parent
    /// that brings a fault on while it trains.
    pub fn child_train_until_killed() {
        let dir = PathBuf::from(std::env::var("RTP_TEST_DIR").unwrap());
        std::fs::write(
            dir.join(format!("pid.{}", mpi_rank())),
            std::process::id().to_string(),
        )
        .unwrap();
        let cfg = child_config();
        if let Err(e) = train::<Inner>(&cfg, |_| Default::default(), None) {
            panic!("rank {}: {e}", mpi_rank());
        }
    }
}
