//! Trains a byte-level GPT under `single`, `ddp`, `fsdp` or `rtp`, on in-process ranks or on
//! one MPI process per rank, and shows what each rank holds against what one device would hold.
//!
//! `cargo run --release --example gpt -- --help`
//!
//! Under MPI (cargo feature `mpi`): `mpirun -np 4 target/release/examples/gpt`

use burn_rtp::{
    human_bytes, ActivationCheckpointing, MpiProgress, RotationMode, Routing, TransportKind,
};
use burn_rtp_gpt::checkpoint::consolidate_checkpoint;
use burn_rtp_gpt::trainer::StepEvent;
use burn_rtp_gpt::{
    train, GptConfig, LrSchedule, Progress, Report, Strategy, TrainConfig, TrainOutcome,
};
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Train a byte-level GPT with Rotated Tensor Parallelism (or a baseline) on CPU ranks.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Gather a checkpoint into one ordinary Burn record that single-device Burn loads.
    Consolidate {
        /// Checkpoint folder (a step-* folder or the --checkpoint-dir root).
        #[arg(long)]
        checkpoint: PathBuf,
        /// Output file, as Burn's `NamedMpkFileRecorder` names it: the extension becomes
        /// `.mpk` (`--out model` writes `model.mpk`).
        #[arg(long)]
        out: PathBuf,
    },
    /// Run a command (an `mpirun` of this trainer) and, when it fails, start it again from
    /// the newest complete checkpoint under its --checkpoint-dir, up to --max-restarts times,
    /// to the same last step: `gpt supervise --max-restarts 3 -- mpirun -np 4 gpt ...`.
    Supervise {
        /// How many times to restart the command.
        #[arg(long)]
        max_restarts: usize,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Predict each rank's peak memory under every strategy at N = 1, 2, 4, 8 and 16, from
    /// a probe step on one rank, and recommend the smallest world that fits a budget.
    Plan {
        /// Memory per rank, such as 64MiB or 2GB.
        #[arg(long)]
        memory_budget: String,
        /// Sequences per rank.
        #[arg(long, default_value_t = 8)]
        batch_per_rank: usize,
        /// The largest world to consider.
        #[arg(long, default_value_t = 16)]
        max_ranks: usize,
        #[command(flatten)]
        model: ModelArgs,
    },
}

/// The model's shape, shared by training and planning.
#[derive(Args, Debug)]
struct ModelArgs {
    /// Context length in bytes.
    #[arg(long, default_value_t = 64)]
    seq: usize,
    /// Model width.
    #[arg(long, default_value_t = 96)]
    d_model: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Use the token embedding as the LM head too (GPT-2's weight tying).
    #[arg(long)]
    tie_embeddings: bool,
    /// Replicate parameters with fewer elements than this instead of sharding them
    /// [default: 0, every parameter sharded].
    #[arg(long)]
    shard_threshold: Option<usize>,
}

impl ModelArgs {
    fn config(&self) -> GptConfig {
        GptConfig::new(self.seq, self.d_model, self.layers, self.heads)
            .with_tie_embeddings(self.tie_embeddings)
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum BackendName {
    Ndarray,
    Flex,
    Wgpu,
    Cuda,
}

#[derive(Args, Debug)]
struct TrainArgs {
    /// single | ddp | fsdp | rtp (`single`: one rank, every parameter whole, which is ddp on
    /// one rank)
    #[arg(long, default_value = "rtp", value_parser = ["single", "ddp", "fsdp", "rtp"])]
    strategy: String,
    /// Ranks [default: 4 in-process; under mpirun, the number of processes, which it must match].
    #[arg(long)]
    ranks: Option<usize>,
    /// in-process | mpi | nccl (with `--backend cuda`, a GPU per rank) [default: mpi when
    /// started by mpirun, else in-process].
    #[arg(long)]
    transport: Option<TransportKind>,
    /// Seconds a rank waits for a silent peer before it fails.
    #[arg(long)]
    peer_timeout: Option<f64>,
    /// Under MPI: how each process's communication thread paces its tests of transfers in
    /// flight (auto | spin | backoff).
    #[arg(long, default_value = "auto")]
    mpi_progress: MpiProgress,
    /// Under MPI: leave glibc's malloc arenas as they are, instead of asking for one arena
    /// per process (which makes received buffers reusable by the rank that frees them).
    #[arg(long)]
    mpi_keep_malloc_arenas: bool,
    /// out-of-place | in-place
    #[arg(long, default_value = "out-of-place")]
    rotation: RotationMode,
    /// weights | activations | auto: what moves for a sharded Linear under rtp, the weight
    /// shards around the ring, each rank's activations to the shards' owners and back (fewer
    /// bytes where a rank's tokens weigh less than its weights), or per pass whichever moves
    /// fewer bytes (the default). Ranks may differ in batch size.
    #[arg(long, default_value = "auto")]
    routing: Routing,
    /// none | balanced: recompute memory-bound activations (normalisation, GELU, softmax,
    /// reshapes) in the backward pass instead of keeping them, as Burn's
    /// BalancedCheckpointing does. Same numbers, less activation memory.
    #[arg(long, default_value = "none")]
    activation_checkpointing: ActivationCheckpointing,
    /// Inner backend: ndarray or flex (Burn's pure-Rust CPU backends), wgpu or cuda (these
    /// two need the cargo features of the same names).
    #[arg(long, value_enum, default_value = "ndarray")]
    backend: BackendName,
    /// Threads each rank computes with [default: the host's cores divided by the ranks on it,
    /// at least 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    threads_per_rank: Option<u64>,
    /// fused | generic: the rotation steps on our own kernels (the fused `#[cube]` kernels on
    /// wgpu and cuda, GEMMs on strided views on NdArray) or the compositions of Burn ops
    /// they replace (to compare them).
    #[arg(long, default_value = "fused", value_parser = ["fused", "generic"])]
    kernels: String,
    /// Training steps.
    #[arg(long, default_value_t = 500)]
    steps: usize,
    /// Global batch: sequences per step over all ranks.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    #[command(flatten)]
    model: ModelArgs,
    /// Adam learning rate (the peak rate, under a schedule).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Steps of linear warm-up from lr/warmup to lr.
    #[arg(long, default_value_t = 0)]
    warmup_steps: usize,
    /// constant | cosine (after the warm-up; cosine falls to lr/10 by the last step).
    #[arg(long, default_value = "constant")]
    lr_schedule: LrSchedule,
    /// Clip the global gradient norm, over every rank's shards, to this value.
    #[arg(long)]
    clip_grad_norm: Option<f32>,
    /// Without a terminal, print a progress line every this many steps (0: never).
    #[arg(long, default_value_t = 10)]
    log_every: usize,
    /// Test hook: make the loss of step STEP NaN on rank RANK (`STEP:RANK`).
    #[arg(long, hide = true, value_parser = parse_fault)]
    inject_non_finite_loss: Option<(usize, usize)>,
    /// Seed of initialisation and data order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Train on this UTF-8 file instead of the shipped corpus.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Write checkpoints (per-rank shards + manifest) here.
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Also checkpoint every this many steps.
    #[arg(long, default_value_t = 0)]
    checkpoint_every: usize,
    /// Keep the newest this many checkpoints under --checkpoint-dir (0 keeps every one).
    #[arg(long, default_value_t = 3)]
    keep_last: usize,
    /// Restart the world from the newest checkpoint under --checkpoint-dir when it fails, up
    /// to this many times (in-process; under mpirun use `gpt supervise`).
    #[arg(long, default_value_t = 0)]
    max_restarts: usize,
    /// Resume from this checkpoint: a step folder, or a --checkpoint-dir, whose newest
    /// complete checkpoint is taken.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Start from this full-model record (e.g. a consolidated checkpoint).
    #[arg(long)]
    init: Option<PathBuf>,
    /// Write a JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Evaluate every this many steps.
    #[arg(long, default_value_t = 50)]
    eval_every: usize,
    /// Bytes of text to generate after training (0: none). Each byte re-runs the whole
    /// model, with a ring pass or a gather per layer.
    #[arg(long, default_value_t = 200)]
    sample_bytes: usize,
}

fn parse_fault(s: &str) -> Result<(usize, usize), String> {
    let (step, rank) = s
        .split_once(':')
        .ok_or_else(|| format!("expected STEP:RANK, not `{s}`"))?;
    let num = |v: &str| v.parse::<usize>().map_err(|e| format!("`{v}`: {e}"));
    Ok((num(step)?, num(rank)?))
}

/// Rank 0's progress: a bar on a terminal, otherwise a line every `log_every` steps (logs
/// of batch jobs and pipes get no bar).
struct Bar {
    bar: ProgressBar,
    lines: Option<usize>,
    stop: Arc<AtomicBool>,
    told_stop: AtomicBool,
}

impl Progress for Bar {
    fn on_step(&self, e: &StepEvent) {
        let norm = e
            .grad_norm
            .map(|n| format!(" | grad norm {n:.3}"))
            .unwrap_or_default();
        let msg = format!(
            "train {:.3} | val {:.3} nats/byte | lr {:.2e}{norm} | {:.0} tok/s | rank 0 peak: state {}, local {}, in flight {}",
            e.train_loss,
            e.val_loss,
            e.lr,
            e.tokens_per_s,
            human_bytes(e.peak.sharded),
            human_bytes(e.peak.local),
            human_bytes(e.peak.in_flight),
        );
        if self.stop.load(Ordering::SeqCst) && !self.told_stop.swap(true, Ordering::SeqCst) {
            self.bar.println(
                "stop requested: finishing this step, then writing a checkpoint (signal again to abort)",
            );
        }
        match self.lines {
            Some(every) if every > 0 && (e.step.is_multiple_of(every) || e.step == e.total) => {
                println!("step {}/{} | {msg}", e.step, e.total);
            }
            Some(_) => {}
            None => {
                self.bar.set_length(e.total as u64);
                self.bar.set_position(e.step as u64);
                self.bar.set_message(msg);
            }
        }
    }
}

fn run_training(
    cfg: &TrainConfig,
    backend: BackendName,
    progress: &Bar,
) -> Result<TrainOutcome, String> {
    let p: Option<&dyn Progress> = Some(progress);
    match backend {
        BackendName::Ndarray => train::<burn::backend::NdArray>(cfg, |_| Default::default(), p)
            .map_err(|e| e.to_string()),
        #[cfg(feature = "flex")]
        BackendName::Flex => {
            train::<burn::backend::Flex>(cfg, |_| Default::default(), p).map_err(|e| e.to_string())
        }
        #[cfg(feature = "wgpu")]
        BackendName::Wgpu => {
            train::<burn::backend::Wgpu>(cfg, |_| Default::default(), p).map_err(|e| e.to_string())
        }
        #[cfg(feature = "cuda")]
        BackendName::Cuda => {
            use burn::tensor::backend::Backend;
            let count = <burn::backend::Cuda as Backend>::device_count(0).max(1);
            train::<burn::backend::Cuda>(
                cfg,
                |r| burn::backend::cuda::CudaDevice::new(r % count),
                p,
            )
            .map_err(|e| e.to_string())
        }
        #[allow(unreachable_patterns)]
        other => Err(format!(
            "backend {other:?} is not built in: rebuild with `--features {}`",
            format!("{other:?}").to_lowercase()
        )),
    }
}

fn write_report(path: &PathBuf, report: &Report) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_string_pretty(report).expect("serialisable");
    std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn print_summary(out: &TrainOutcome) {
    let rss_label = if out.report.transport != "in-process" {
        "peak RSS"
    } else {
        "process RSS"
    };
    let r = &out.report;
    let single = r.ideal_model_state_bytes_per_rank * r.ranks as u64;
    println!(
        "\n{} on {} rank(s), {} kernels{}: {} parameters; validation loss {:.3} -> {:.3} nats/byte; {:.0} tokens/s, median step {:.1} ms",
        r.strategy,
        r.ranks,
        r.kernels,
        match r.activation_checkpointing.as_str() {
            "" | "none" => String::new(),
            ac => format!(", {ac} activation checkpointing"),
        },
        r.params,
        out.initial_val_loss,
        r.final_val_loss,
        r.tokens_per_s,
        r.step_time_ms_median
    );
    println!(
        "model state on one device (fp32 params + grads + Adam moments): {}",
        human_bytes(single)
    );
    println!(
        "\n{:>4}  {:>12}  {:>12}  {:>7}  {:>12}  {:>12}  {:>12}  {:>12}",
        "rank",
        "model state",
        "ideal (1/N)",
        "ratio",
        "in flight",
        "local",
        "peak total",
        rss_label
    );
    for (rank, p) in r.peak_bytes_per_rank.iter().enumerate() {
        println!(
            "{:>4}  {:>12}  {:>12}  {:>6.3}x  {:>12}  {:>12}  {:>12}  {:>12}",
            rank,
            human_bytes(p.sharded),
            human_bytes(r.ideal_model_state_bytes_per_rank),
            p.sharded as f64 / r.ideal_model_state_bytes_per_rank as f64,
            human_bytes(p.in_flight),
            human_bytes(p.local),
            human_bytes(p.total),
            human_bytes(r.peak_rss_bytes_per_rank.get(rank).copied().unwrap_or(0)),
        );
    }
    println!("(model state: this rank's parameters, gradients and Adam moments; local: its activations, temporaries and gradients before their reduction)");
    if r.transport == "in-process" {
        println!("(in-process: every rank is a thread of one process, so the RSS column is that whole process)");
    }
    if !out.sample.is_empty() {
        println!("\nsample (temperature 0.8):\n{}\n", out.sample);
    }
    if let Some(path) = &out.checkpoint {
        println!("checkpoint: {}", path.display());
    }
}

/// `gpt plan`: probes the model on one rank, prints the predicted peak per rank of every
/// strategy at N = 1, 2, 4, 8 and 16, and recommends the smallest world that fits.
fn plan(budget: &str, batch: usize, max_ranks: usize, model: &ModelArgs) -> ExitCode {
    let fail = |msg: String| {
        eprintln!("error: {msg}");
        ExitCode::FAILURE
    };
    let budget = match burn_rtp::parse_bytes(budget) {
        Ok(b) => b,
        Err(e) => return fail(format!("--memory-budget: {e}")),
    };
    if batch == 0 || max_ranks == 0 {
        return fail("--batch-per-rank and --max-ranks must be at least 1".into());
    }
    let config = model.config();
    if let Err(e) = config.validate() {
        return fail(e);
    }
    let threshold = model
        .shard_threshold
        .unwrap_or(burn_rtp::DEFAULT_SHARD_THRESHOLD);
    let spinner = ProgressBar::new_spinner();
    spinner.set_message(format!(
        "probing two training steps on one rank, at {} and {} sequences",
        (batch / 2).max(1),
        batch.max(2)
    ));
    spinner.enable_steady_tick(std::time::Duration::from_millis(100));
    let plan_config = burn_rtp::PlanConfig::default()
        .with_shard_threshold(threshold)
        .with_batch(batch);
    let planner = burn_rtp_gpt::plan::probe_gpt::<burn::backend::NdArray>(&config, plan_config);
    spinner.finish_and_clear();
    let planner = match planner {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let params: usize = planner.shapes().iter().map(|s| s.num_elements()).sum();
    let recommended = planner.recommend(budget, batch, max_ranks);
    println!(
        "Predicted peak memory per rank: GPT (d_model {}, {} layers, context {}; {params} parameters), {batch} sequences per rank, Adam, shard threshold {threshold}; budget {}",
        config.d_model,
        config.layers,
        config.seq,
        human_bytes(budget)
    );
    println!(
        "\n{:>5}  {:<20}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  fits",
        "", "", "", "local", "local", "", "total", "total"
    );
    println!(
        "{:>5}  {:<20}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  (plain / balanced)",
        "ranks", "strategy", "model state", "plain", "balanced", "in flight", "plain", "balanced"
    );
    let mut worlds: Vec<usize> = [1, 2, 4, 8, 16]
        .into_iter()
        .filter(|&n| n <= max_ranks)
        .collect();
    if let Ok(r) = &recommended {
        if !worlds.contains(&r.world) {
            worlds.push(r.world);
            worlds.sort_unstable();
        }
    }
    use burn_rtp::ActivationCheckpointing as Ac;
    for &world in &worlds {
        for (strategy, rotation) in burn_rtp::plan::PLANNED {
            let [plain, balanced] = [Ac::None, Ac::Balanced]
                .map(|ac| planner.predict_with(ac, strategy, rotation, world, batch));
            let fits = |p: &burn_rtp::Prediction| match &recommended {
                Ok(r) if r == p => "yes <- recommended",
                _ if p.total <= budget => "yes",
                _ => "no",
            };
            println!(
                "{:>5}  {:<20}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {} / {}",
                world,
                plain.label(),
                human_bytes(plain.model_state),
                human_bytes(plain.activations),
                human_bytes(balanced.activations),
                human_bytes(plain.in_flight),
                human_bytes(plain.total),
                human_bytes(balanced.total),
                fits(&plain),
                fits(&balanced),
            );
        }
    }
    println!(
        "\n(local: activations, temporaries and gradients before their reduction, from the probe;\n balanced: with --activation-checkpointing balanced, which recomputes memory-bound\n activations in the backward pass)"
    );
    match recommended {
        Ok(r) => {
            println!(
                "\nrecommended: {} on {} rank(s), predicted peak {} per rank (budget {})",
                r.label(),
                r.world,
                human_bytes(r.total),
                human_bytes(budget)
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e.to_string()),
    }
}

/// The value of flag `name` in `args` (`--name value` or `--name=value`).
fn flag_value(args: &[String], name: &str) -> Option<String> {
    let eq = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if a == name {
            args.get(i + 1).cloned()
        } else {
            a.strip_prefix(&eq).map(str::to_string)
        }
    })
}

/// `args` without flag `name` and its value.
fn without_flag(args: &[String], name: &str) -> Vec<String> {
    let eq = format!("{name}=");
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if a == name {
            skip = true;
        } else if !a.starts_with(&eq) {
            out.push(a.clone());
        }
    }
    out
}

/// `gpt supervise`: runs `command`, and after each failure starts it again from the newest
/// complete checkpoint under its `--checkpoint-dir`, with `--steps` cut to the same last step.
fn supervise(max_restarts: usize, command: &[String]) -> ExitCode {
    use burn_rtp_gpt::checkpoint::Checkpoint;
    let Some(root) = flag_value(command, "--checkpoint-dir").map(PathBuf::from) else {
        eprintln!(
            "error: the supervised command needs --checkpoint-dir: a restart resumes from it"
        );
        return ExitCode::FAILURE;
    };
    let steps: usize = match flag_value(command, "--steps").map(|s| s.parse()) {
        Some(Ok(steps)) => steps,
        None => 200,
        Some(Err(_)) => {
            eprintln!("error: the supervised command's --steps is not a number");
            return ExitCode::FAILURE;
        }
    };
    let first_step = match flag_value(command, "--resume") {
        Some(path) => match Checkpoint::open_manifest(path.as_ref()) {
            Ok(c) => c.manifest().step as usize,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => 0,
    };
    let end = first_step + steps;
    let mut args = command.to_vec();
    for attempt in 0..=max_restarts {
        let status = std::process::Command::new(&args[0])
            .args(&args[1..])
            .env(burn_rtp_gpt::restart::ATTEMPT, attempt.to_string())
            .status();
        let why = match status {
            Ok(s) if s.success() => {
                if attempt > 0 {
                    println!("finished after {attempt} restart(s)");
                }
                return ExitCode::SUCCESS;
            }
            Ok(s) => format!("the job ended with {s}"),
            Err(e) => {
                eprintln!("error: cannot start {}: {e}", args[0]);
                return ExitCode::FAILURE;
            }
        };
        if attempt == max_restarts {
            eprintln!("error: {why}; no restarts left (--max-restarts {max_restarts})");
            return ExitCode::FAILURE;
        }
        let start = flag_value(command, "--resume").map(PathBuf::from);
        let (resume, from) = burn_rtp_gpt::restart::resume_point(&root, start, first_step);
        eprintln!(
            "restart {} of {max_restarts}: {why}; resuming from step {from} ({})",
            attempt + 1,
            resume
                .as_ref()
                .map_or("the run's start".into(), |p| p.display().to_string())
        );
        args = without_flag(&without_flag(command, "--resume"), "--steps");
        args.extend(["--steps".into(), (end - from).to_string()]);
        if let Some(path) = resume {
            args.extend(["--resume".into(), path.display().to_string()]);
        }
    }
    unreachable!("the loop returns on its last attempt")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Plan {
        memory_budget,
        batch_per_rank,
        max_ranks,
        model,
    }) = &cli.command
    {
        return plan(memory_budget, *batch_per_rank, *max_ranks, model);
    }
    if let Some(Command::Supervise {
        max_restarts,
        command,
    }) = &cli.command
    {
        return supervise(*max_restarts, command);
    }
    if let Some(Command::Consolidate { checkpoint, out }) = &cli.command {
        return match consolidate_checkpoint(checkpoint, out) {
            Ok(m) => {
                println!(
                    "consolidated step {} of a {}-rank {} checkpoint into {}",
                    m.step,
                    m.world_size,
                    m.strategy,
                    burn_rtp::checkpoint::record_file(out).display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let a = &cli.train;
    let single = a.strategy == "single";
    let strategy: Strategy = if single {
        Strategy::Ddp
    } else {
        a.strategy.parse().expect("clap allows only the strategies")
    };
    let transport = a.transport.unwrap_or_else(TransportKind::from_environment);
    let launched = burn_rtp::transport::mpi_launch();
    let (ranks, is_rank0) = match (transport, launched) {
        (TransportKind::Mpi | TransportKind::Nccl, Some(job)) if single && job.size != 1 => {
            eprintln!(
                "error: --strategy single trains on one rank; start it without mpirun (or with -np 1), not on {} processes",
                job.size
            );
            return ExitCode::FAILURE;
        }
        (TransportKind::Mpi | TransportKind::Nccl, Some(job)) => {
            if let Some(asked) = a.ranks.filter(|&r| r != job.size) {
                eprintln!(
                    "error: --ranks {asked} does not match the {} processes mpirun started; omit --ranks under mpirun",
                    job.size
                );
                return ExitCode::FAILURE;
            }
            (job.size, job.rank == 0)
        }
        (TransportKind::Mpi | TransportKind::Nccl, None) => {
            eprintln!(
                "error: --transport {transport} needs mpirun: `mpirun -np 4 target/release/examples/gpt`"
            );
            return ExitCode::FAILURE;
        }
        (TransportKind::InProcess, _) if single => (1, true),
        (TransportKind::InProcess, _) => (a.ranks.unwrap_or(4), true),
    };
    let stop = match burn_rtp_gpt::stop_on_signals() {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("error: cannot install the SIGINT/SIGTERM handler: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut cfg = TrainConfig::new(strategy, ranks);
    cfg.transport = Some(transport);
    if let Some(secs) = a.peer_timeout {
        if !(secs.is_finite() && secs > 0.0) {
            eprintln!("error: --peer-timeout must be a positive number of seconds, not {secs}");
            return ExitCode::FAILURE;
        }
        cfg.peer_timeout = Some(std::time::Duration::from_secs_f64(secs));
    }
    cfg.rotation = a.rotation;
    cfg.routing = a.routing;
    cfg.activation_checkpointing = a.activation_checkpointing;
    cfg.mpi_progress = a.mpi_progress;
    cfg.one_malloc_arena = !a.mpi_keep_malloc_arenas;
    cfg.threads_per_rank = a.threads_per_rank.map(|n| n as usize);
    cfg.steps = a.steps;
    cfg.batch = a.batch;
    cfg.model = a.model.config();
    cfg.shard_threshold = a.model.shard_threshold;
    cfg.lr = a.lr;
    cfg.warmup_steps = a.warmup_steps;
    cfg.lr_schedule = a.lr_schedule;
    cfg.clip_grad_norm = a.clip_grad_norm;
    cfg.stop = Some(stop.clone());
    cfg.inject_non_finite_loss = a.inject_non_finite_loss;
    cfg.seed = a.seed;
    cfg.data = a.data.clone();
    cfg.checkpoint_dir = a.checkpoint_dir.clone();
    cfg.checkpoint_every = a.checkpoint_every;
    cfg.keep_last = a.keep_last;
    cfg.max_restarts = a.max_restarts;
    if a.max_restarts > 0 && transport != TransportKind::InProcess {
        eprintln!(
            "error: under mpirun a failed rank ends the whole job, so the job must be started \
             again from outside: `gpt supervise --max-restarts {} -- mpirun -np N gpt ...`",
            a.max_restarts
        );
        return ExitCode::FAILURE;
    }
    cfg.resume = a.resume.clone();
    cfg.init = a.init.clone();
    cfg.eval_every = a.eval_every;
    cfg.sample_bytes = a.sample_bytes;
    if let Err(e) = cfg.validate() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let place = match transport {
        TransportKind::InProcess => "in-process rank(s)",
        TransportKind::Mpi => "MPI processes",
        TransportKind::Nccl => "MPI processes (tensors over NCCL)",
    };
    if is_rank0 {
        println!(
            "Training a byte-level GPT (d_model {}, {} layers, context {}) with {} on {} {place}, {} steps of {} sequences",
            a.model.d_model,
            a.model.layers,
            a.model.seq,
            match (a.strategy.as_str(), a.routing) {
                ("rtp", Routing::Activations) => "rtp (activations routed to the weights)".into(),
                ("rtp", Routing::Auto) => "rtp (weights or activations, per pass)".into(),
                _ => a.strategy.clone(),
            },
            ranks,
            a.steps,
            a.batch
        );
        if a.strategy == "rtp" && ranks > 1 {
            let tokens = (a.batch * a.model.seq) as f64 / ranks as f64;
            println!(
                "{}",
                a.model.config().routing_summary(a.routing, ranks, tokens)
            );
        }
    }
    let terminal = std::io::stderr().is_terminal();
    let bar = Bar {
        bar: if is_rank0 && terminal {
            ProgressBar::new(a.steps as u64)
        } else {
            ProgressBar::hidden()
        },
        lines: (is_rank0 && !terminal).then_some(a.log_every),
        stop,
        told_stop: AtomicBool::new(false),
    };
    bar.bar.set_style(
        ProgressStyle::with_template("{bar:24} {pos}/{len} [{elapsed_precise}] {msg}")
            .expect("valid template"),
    );
    burn_rtp::set_fused_kernels(a.kernels == "fused");
    let outcome = run_training(&cfg, a.backend, &bar);
    bar.bar.finish();
    match outcome {
        Ok(out) if out.rank != 0 => ExitCode::SUCCESS,
        Ok(out) => {
            print_summary(&out);
            if let Some(step) = out.stopped_at {
                match &out.checkpoint {
                    Some(path) => println!(
                        "stopped by a signal after step {step}; resume with --resume {}",
                        path.display()
                    ),
                    None => println!(
                        "stopped by a signal after step {step}; no --checkpoint-dir was set, so nothing was saved"
                    ),
                }
            }
            if let Some(path) = &a.report {
                if let Err(e) = write_report(path, &out.report) {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
                println!("report: {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
