//! Training that survives bad numbers and interruptions: global-norm clipping equals an
//! independent single-device reference under every strategy; a non-finite loss stops every
//! rank and leaves the last checkpoint as it was; SIGTERM ends a run cleanly and resumably;
//! bad flags are refused in one line.

mod common;

use burn::backend::NdArray;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::{ElementConversion, Tensor};
use burn_rtp::{RotationMode, RtpError};
use burn_rtp_gpt::data::{Corpus, Windows};
use burn_rtp_gpt::trainer::StepEvent;
use burn_rtp_gpt::{train, Gpt, Progress, Strategy, TrainConfig, TrainError};
use common::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

const MAX_NORM: f32 = 0.5;

/// `sqrt(Σ g²)` over every parameter of a plain single-device model.
struct SumOfSquares<'a> {
    grads: &'a GradientsParams,
    sum: f64,
}

impl ModuleVisitor<Plain> for SumOfSquares<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Plain, D>>) {
        if let Some(g) = self.grads.get::<NdArray, D>(param.id) {
            self.sum += (g.clone() * g).sum().into_scalar().elem::<f64>();
        }
    }
}

struct Scale<'a> {
    grads: &'a mut GradientsParams,
    scale: f64,
}

impl ModuleVisitor<Plain> for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Plain, D>>) {
        if let Some(g) = self.grads.remove::<NdArray, D>(param.id) {
            self.grads.register::<NdArray, D>(param.id, g * self.scale);
        }
    }
}

/// Single-device Burn with PyTorch's `clip_grad_norm_`, written here from its definition:
/// the per-step losses and the norms before clipping.
fn clipped_reference(cfg: &TrainConfig, init: &Path, max: f32) -> (Vec<f64>, Vec<f64>) {
    let device = Default::default();
    let corpus = Corpus::load(None, cfg.model.seq).unwrap();
    let mut model =
        burn_rtp_gpt::checkpoint::load_consolidated::<Plain>(init, &cfg.model, &device).unwrap();
    let mut optim = AdamConfig::new().init::<Plain, Gpt<Plain>>();
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for step in 0..cfg.steps {
        let (x, y) = Windows::train(&corpus, cfg.seed, step, 0..cfg.batch, cfg.model.seq)
            .tensors::<Plain>(&device);
        let loss = model.loss(x, y);
        losses.push(loss.clone().into_scalar().elem::<f64>());
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        let mut squares = SumOfSquares {
            grads: &grads,
            sum: 0.0,
        };
        model.visit(&mut squares);
        let norm = squares.sum.sqrt();
        norms.push(norm);
        let scale = (f64::from(max) / (norm + 1e-6)).min(1.0);
        if scale < 1.0 {
            model.visit(&mut Scale {
                grads: &mut grads,
                scale,
            });
        }
        model = optim.step(cfg.lr, model, grads);
    }
    let _ = model.valid();
    (losses, norms)
}

/// Records the norm every step reports.
#[derive(Default)]
struct Norms(Mutex<Vec<f32>>);

impl Progress for Norms {
    fn on_step(&self, e: &StepEvent) {
        self.0
            .lock()
            .unwrap()
            .push(e.grad_norm.expect("clipping is on"));
    }
}

/// `--clip-grad-norm 0.5` under rtp (both rotations), fsdp and ddp at N = 2, 3, 4 trains like
/// single-device Burn with the same clipping, to 1e-5, and clipping is active at most steps.
#[test]
fn clipping_matches_single_device_under_every_strategy() {
    let steps = 8;
    let dir = temp_dir("clip");
    let mut base = tiny(Strategy::Ddp, 1, steps);
    base.clip_grad_norm = Some(MAX_NORM);
    let init = initial_weights(&base, &dir);
    let (reference, ref_norms) = clipped_reference(&base, &init, MAX_NORM);
    let clipped = ref_norms
        .iter()
        .filter(|&&n| n > f64::from(MAX_NORM))
        .count();
    assert!(
        clipped * 4 >= steps * 3,
        "the test must clip at most steps: norms {ref_norms:?}"
    );
    let cases = [
        (Strategy::Rtp, RotationMode::OutOfPlace),
        (Strategy::Rtp, RotationMode::InPlace),
        (Strategy::Fsdp, RotationMode::OutOfPlace),
        (Strategy::Ddp, RotationMode::OutOfPlace),
    ];
    for ranks in [2, 3, 4] {
        for (strategy, rotation) in cases {
            let mut cfg = base.clone();
            cfg.strategy = strategy;
            cfg.ranks = ranks;
            cfg.rotation = rotation;
            cfg.init = Some(init.clone());
            let norms = Norms::default();
            let out = train::<NdArray>(&cfg, |_| Default::default(), Some(&norms)).unwrap();
            let what = format!("{strategy} ({rotation}) on {ranks} ranks");
            assert_eq!(out.report.losses.len(), steps, "{what}");
            for (step, (got, want)) in out.report.losses.iter().zip(&reference).enumerate() {
                assert!(
                    rel_close(*got, *want, 1e-5),
                    "{what}, step {step}: loss {got} vs single-device {want}"
                );
            }
            let norms = norms.0.into_inner().unwrap();
            for (step, (got, want)) in norms.iter().zip(&ref_norms).enumerate() {
                assert!(
                    rel_close(f64::from(*got), *want, 1e-4),
                    "{what}, step {step}: global gradient norm {got} vs single-device {want}"
                );
            }
        }
    }
    // Without clipping the losses part from step 1 on: the test would see a missing clip.
    let mut unclipped = base.clone();
    unclipped.clip_grad_norm = None;
    unclipped.init = Some(init);
    let free = reference_losses(&unclipped, unclipped.init.as_ref().unwrap());
    assert!(
        !rel_close(free[2], reference[2], 1e-5),
        "{free:?} vs {reference:?}"
    );
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// A NaN loss on rank 1 at step 4: the run stops with the typed error naming step 4 and
/// rank 1, and the checkpoint of step 3 (and everything else in the folder) is unchanged.
#[test]
fn a_non_finite_loss_stops_training_and_leaves_the_last_checkpoint_intact() {
    let dir = temp_dir("nonfinite");
    let root = dir.join("ckpt");
    let mut first = tiny(Strategy::Rtp, 3, 3);
    first.checkpoint_dir = Some(root.clone());
    let good = train::<NdArray>(&first, |_| Default::default(), None)
        .unwrap()
        .checkpoint
        .unwrap();
    let before = snapshot(&root);

    let mut second = tiny(Strategy::Rtp, 3, 5);
    second.resume = Some(root.clone());
    second.checkpoint_dir = Some(root.clone());
    second.checkpoint_every = 1;
    second.inject_non_finite_loss = Some((4, 1));
    let err = train::<NdArray>(&second, |_| Default::default(), None).unwrap_err();
    let TrainError::NonFinite {
        error,
        last_good,
        checkpoint,
    } = &err
    else {
        panic!("expected a non-finite error, got {err}");
    };
    let RtpError::NonFinite {
        step,
        bad_rank,
        what,
        ..
    } = &**error
    else {
        panic!("expected a non-finite error, got {error}");
    };
    assert_eq!((*step, *bad_rank, what.as_str()), (4, 1, "loss"), "{err}");
    assert_eq!(*last_good, 3, "{err}");
    assert_eq!(checkpoint.as_deref(), Some(good.as_path()), "{err}");
    assert!(
        err.to_string().contains(&good.display().to_string()),
        "{err}"
    );
    assert_eq!(snapshot(&root), before, "the checkpoint folder changed");

    // Within one run: checkpoints of steps 1 and 2 are written, none after the bad step 3.
    let root = dir.join("fresh");
    let mut cfg = tiny(Strategy::Fsdp, 2, 6);
    cfg.checkpoint_dir = Some(root.clone());
    cfg.checkpoint_every = 1;
    cfg.inject_non_finite_loss = Some((3, 0));
    let err = train::<NdArray>(&cfg, |_| Default::default(), None).unwrap_err();
    let TrainError::NonFinite {
        error,
        last_good: 2,
        checkpoint: Some(path),
    } = &err
    else {
        panic!("expected a non-finite error after step 2, got {err}");
    };
    assert!(
        matches!(
            **error,
            RtpError::NonFinite {
                step: 3,
                bad_rank: 0,
                ..
            }
        ) && path.ends_with("step-00000002"),
        "{err}"
    );
    let mut steps: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    steps.sort();
    assert_eq!(steps, ["latest", "step-00000001", "step-00000002"]);
}

/// SIGTERM mid-run: the trainer finishes within 2 steps of the signal, writes a checkpoint,
/// exits 0, and resuming from it continues bit-exactly. A second signal aborts at once.
#[test]
fn sigterm_stops_within_two_steps_with_a_checkpoint_that_resumes_exactly() {
    let gpt = gpt_binary();
    let dir = temp_dir("sigterm");
    let root = dir.join("ckpt");
    let mut flags = tiny_flags(3);
    flags.extend(["--clip-grad-norm", "0.5", "--warmup-steps", "2"].map(String::from));
    let mut cmd = Command::new(&gpt);
    cmd.args(&flags)
        .args(["--steps", "100000", "--log-every", "1"])
        .arg("--checkpoint-dir")
        .arg(&root);
    let signalled = Instant::now();
    let stop = stop_mid_run(cmd, Freeze::Process, |pid| kill("-TERM", pid));
    eprintln!(
        "signalled after step {} was printed, stopped after step {}, exited {:.2} s later",
        stop.seen,
        stop.stopped,
        signalled.elapsed().as_secs_f64()
    );
    assert!(
        root.join(format!("step-{:08}", stop.stopped))
            .join("manifest.json")
            .exists(),
        "{:?}",
        stop.rest
    );
    assert_resumes_exactly(&gpt, &flags, &root, stop.stopped, &dir);

    // A second signal does not wait for the step: the process ends at once, status 128 + 15.
    // `sigterm_twice` leaves the run no time to finish its step between the two; should the
    // machine still starve the shell that long, the run stops cleanly, shows nothing either
    // way, and the try is repeated.
    for attempt in 1..=5 {
        let mut run = Command::new(&gpt)
            .args(tiny_flags(2))
            .args(["--steps", "100000", "--log-every", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
        assert!(lines.any(|l| l.unwrap().starts_with("step ")));
        sigterm_twice(run.id());
        let status = run.wait().unwrap();
        if status.code() == Some(143) {
            return;
        }
        assert!(status.success(), "try {attempt}: {status}");
        eprintln!("try {attempt}: the run stopped cleanly before the second signal; again");
    }
    panic!("in 5 tries, no second SIGTERM arrived while a step still ran");
}

/// Sends SIGTERM to `pid` twice. The second goes once the first has been taken for delivery
/// (SIGTERM's bit in the shared pending mask, `ShdPnd` in /proc/PID/status, is clear again),
/// so that the two cannot merge into one pending signal, and then at once: the shell's loop
/// is builtins only and forks nothing, so the run has no time to finish its step in between.
fn sigterm_twice(pid: u32) {
    let script = r#"kill -TERM "$1" || exit 1
while :; do
    pending=0
    while read -r key value; do
        [[ $key == ShdPnd: ]] && pending=$value && break
    done < "/proc/$1/status"
    (( 16#$pending & (1 << 14) )) || break
done
kill -TERM "$1" 2>/dev/null
exit 0"#;
    let status = Command::new("bash")
        .args(["-c", script, "sigterm_twice", &pid.to_string()])
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the first SIGTERM to {pid} failed: {status}"
    );
}

/// Bad numeric flags are refused before anything is built, in one line, with a non-zero
/// status, and before the banner.
#[test]
fn bad_flags_are_refused_in_one_line() {
    let gpt = gpt_binary();
    for (flags, says) in [
        (
            &["--lr=-1"][..],
            "--lr must be a positive finite number, not -1",
        ),
        (
            &["--lr=nan"],
            "--lr must be a positive finite number, not NaN",
        ),
        (
            &["--lr=inf"],
            "--lr must be a positive finite number, not inf",
        ),
        (
            &["--clip-grad-norm=0"],
            "--clip-grad-norm must be a positive finite number, not 0",
        ),
        (
            &["--clip-grad-norm=-2"],
            "--clip-grad-norm must be a positive finite number",
        ),
        (
            &["--warmup-steps", "11", "--steps", "10"],
            "--warmup-steps 11 is more than the 10 --steps",
        ),
        (&["--ranks", "0"], "--ranks must be at least 1"),
        (
            &["--peer-timeout", "0"],
            "--peer-timeout must be a positive number of seconds",
        ),
    ] {
        let out = Command::new(&gpt).args(flags).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "{flags:?} printed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(stderr.lines().count(), 1, "{flags:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(says),
            "{flags:?}: {stderr}"
        );
    }
    // A NaN loss (here injected on rank 1 at step 2) ends the binary with a non-zero status.
    let out = Command::new(&gpt)
        .args(tiny_flags(2))
        .args(["--steps", "5", "--inject-non-finite-loss", "2:1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("non-finite loss at step 2: rank 1 has NaN"),
        "{stderr}"
    );
}
