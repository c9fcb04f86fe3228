//! A tiny configuration and an independent single-device reference trainer.
#![allow(dead_code)]

use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use burn_rtp_examples::data::{Corpus, Windows};
use burn_rtp_examples::{GptConfig, Strategy, TrainConfig};

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
        burn_rtp_examples::checkpoint::load_consolidated::<Plain>(init, &cfg.model, &device)
            .unwrap();
    let mut optim = AdamConfig::new().init::<Plain, burn_rtp_examples::Gpt<Plain>>();
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
pub fn reference_val_loss(cfg: &TrainConfig, model: &burn_rtp_examples::Gpt<NdArray>) -> f64 {
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
    burn_rtp_examples::checkpoint::save_full(model, &path).unwrap();
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
    cmd.args(["build", "-q", "-p", "burn-rtp-examples", "--example", "gpt"]);
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

/// Starts `cmd` (a `gpt` run with `--log-every 1`), calls `signal(pid)` once it printed step 3,
/// and waits (at most 120 s) for it to end.
pub fn stop_mid_run(mut cmd: std::process::Command, signal: impl FnOnce(u32)) -> Stopped {
    use std::io::BufRead;
    let mut run = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = run.id();
    let mut lines = std::io::BufReader::new(run.stdout.take().unwrap()).lines();
    let mut seen = 0;
    for line in lines.by_ref() {
        if let Some(s) = step_of(&line.unwrap()) {
            seen = s;
            if s >= 3 {
                break;
            }
        }
    }
    assert!(seen >= 3, "the trainer printed no progress");
    signal(pid);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
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
        serde_json::from_str::<burn_rtp_examples::Report>(&text)
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
