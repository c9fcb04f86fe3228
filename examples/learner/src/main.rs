//! The GPT trained by burn-train's `Learner` on RTP ranks: one ordinary Learner per rank, with
//! `RtpOptimizer`, Burn's metrics and validation; rank 0 prints the global loss.
//!
//! `cargo run --release -p burn-rtp-learner -- --ranks 4 --epochs 2 --steps-per-epoch 50`

use burn_rtp_gpt::GptConfig;
use burn_rtp_learner::{train_with_learner, InnerBackend, LearnerConfig};
use clap::Parser;
use std::process::ExitCode;

/// Train the byte-level GPT with burn-train's Learner, one per RTP rank.
#[derive(Parser, Debug)]
struct Cli {
    /// In-process ranks.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Epochs (validation after each).
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    /// Training steps per epoch.
    #[arg(long, default_value_t = 50)]
    steps_per_epoch: usize,
    /// Global batch: sequences per step over all ranks (a multiple of the ranks).
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Learning rate (constant).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seed of the weights and the data order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Where burn-train writes its logs, and the checkpoints (`DIR/checkpoint`).
    #[arg(long, default_value = "target/learner")]
    dir: std::path::PathBuf,
    /// Write a sharded checkpoint after every epoch (the newest two are kept).
    #[arg(long)]
    checkpoints: bool,
    /// Resume from the checkpoint of this epoch under DIR (same settings as the run that
    /// wrote it); training continues with the next epoch.
    #[arg(long, value_name = "EPOCH")]
    resume: Option<usize>,
    /// Inner backend of every rank: ndarray or flex.
    #[arg(long, default_value = "ndarray", value_parser = ["ndarray", "flex"])]
    backend: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.ranks == 0 || cli.batch == 0 || !cli.batch.is_multiple_of(cli.ranks) {
        eprintln!(
            "error: --batch {} must be a positive multiple of --ranks {}",
            cli.batch, cli.ranks
        );
        return ExitCode::FAILURE;
    }
    let cfg = LearnerConfig {
        model: GptConfig::new(64, 128, 2, 4),
        ranks: cli.ranks,
        batch: cli.batch,
        epochs: cli.epochs,
        steps_per_epoch: cli.steps_per_epoch,
        val_batches: 2,
        lr: cli.lr,
        seed: cli.seed,
        shard_threshold: Some(0),
        dir: cli.dir,
        checkpoints: cli.checkpoints,
        resume_epoch: cli.resume,
        verbose: true,
        backend: if cli.backend == "flex" {
            InnerBackend::Flex
        } else {
            InnerBackend::Ndarray
        },
    };
    match train_with_learner(&cfg) {
        Ok(outcome) => {
            let first = cfg.resume_epoch.unwrap_or(0) + 1;
            for (epoch, loss) in (first..).zip(&outcome.val_losses) {
                println!("epoch {epoch}: validation loss {loss:.4} (mean over ranks)");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
