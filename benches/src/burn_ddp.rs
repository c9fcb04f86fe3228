//! Burn's own data parallelism as a peer row of the scaling report.
//!
//! burn-train's DDP needs Burn's `distributed` feature, which would change `Autodiff<B>` for
//! every crate of this workspace, so it is built as its own workspace (`benches/burn-ddp`,
//! binary `burn-ddp-peer`). The report runs that binary, which tries burn-train's `ddp` and
//! `multi` strategies at N = 2 on two wgpu devices next to a single-device run, and adds what
//! it found: step time and peak memory where a strategy ran, the exact errors where it did
//! not. Beside it, burn-rtp's own ddp and rtp train the same model ([`crate::peer_mlp`]) on
//! the same rows at the same global batch, on wgpu, each in a child process of the report
//! (feature `wgpu`), so that each one's peak resident set is its own.

use crate::runner::add_section;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// Our strategies on the peer's model, in the order they run.
pub const OURS: [&str; 2] = ["ddp", "rtp"];

/// What one of our runs on the peer's model measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OursRun {
    /// `ddp` or `rtp` (every layer sharded: shard threshold 0).
    pub strategy: String,
    /// Wall time from the world's start to the end of training, over the steps (the peer's
    /// definition of its `step_ms`).
    pub step_ms: f64,
    /// Wall time of the steps after the first (kernel compilation and start-up excluded).
    pub steady_step_ms: f64,
    /// Mean squared error of the trained model on the peer's evaluation rows.
    pub final_loss: f64,
    /// Peak resident set of the child process (`VmHWM`), bytes.
    pub peak_rss_bytes: Option<u64>,
    /// The ledger's peak on each rank, bytes.
    pub ledger_peak_bytes: Vec<u64>,
}

/// Heading of the report section this module writes (and replaces when run again).
pub const HEADING: &str = "## Burn's own data parallelism (burn-train 0.21 on wgpu, N = 2)";

/// The key of the peer's result in `report.json`.
pub const KEY: &str = "burn_ddp_wgpu_n2";

/// Runs the peer binary and returns its JSON result.
pub fn run_peer(bin: &Path, scratch: &Path) -> Result<Value, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(scratch)?;
    let out = scratch.join("burn-ddp.json");
    let status = Command::new(bin).arg("--out").arg(&out).status()?;
    if !status.success() {
        return Err(format!("{} exited with {status}", bin.display()).into());
    }
    Ok(serde_json::from_slice(&std::fs::read(&out)?)?)
}

/// The report section for the peer's result.
pub fn markdown(peer: &Value) -> String {
    let mut md = format!(
        "\n{HEADING}\n\nburn-train's own multi-device strategies, built in their own workspace \
         (`benches/burn-ddp`, Burn's `distributed` feature), on two wgpu devices of this machine's \
         one adapter ({}): an MLP of width {}, {} steps, global batch {}. Each attempt runs in a \
         child process with a time limit; errors are quoted from its output and burn-train's \
         experiment log.\n\n\
         | attempt | status | ms / step | final loss | peak RSS | device tasks that failed | panics |\n\
         |---|---|---|---|---|---|---|\n",
        peer["devices"]
            .as_array()
            .map(|d| d.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" + "))
            .unwrap_or_default(),
        peer["hidden"],
        peer["steps"],
        peer["batch"],
    );
    for a in peer["attempts"].as_array().into_iter().flatten() {
        let num = |key: &str, f: &dyn Fn(f64) -> String| {
            a[key].as_f64().map_or_else(|| "—".to_string(), f)
        };
        let errors: Vec<String> = a["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|e| format!("`{}`", e.replace('|', "\\|")))
            .collect();
        md += &format!(
            "| {} | {}{} | {} | {} | {} | {} | {} |\n",
            a["attempt"].as_str().unwrap_or("?"),
            a["status"].as_str().unwrap_or("?"),
            if a["ok"].as_bool() == Some(true) {
                ""
            } else {
                " (**not a valid run**)"
            },
            num("step_ms", &|v| format!("{v:.1}")),
            num("final_loss", &|v| format!("{v:.5}")),
            num("peak_rss_bytes", &|v| format!("{:.0} MiB", v / 1048576.0)),
            a["failed_device_tasks"].as_u64().unwrap_or(0),
            if errors.is_empty() {
                "none".to_string()
            } else {
                errors.join("<br>")
            },
        );
    }
    md += "\nA multi-device attempt that exits 0 after device tasks failed did not train \
           data-parallel: cubecl's device runner catches a task's panic, logs `Task failed` and \
           carries on, so the replicas' gradients were never combined. Its step time and loss \
           are shown only to make that visible; they are not figures of Burn's DDP. \
           cubecl-wgpu 0.10 leaves `comm_init`, `send`, `recv`, `all_reduce` and \
           `sync_collective` at cubecl-runtime's defaults (`unimplemented!()` / `todo!()`, \
           `server/base.rs` lines 454–542); only the CUDA runtime implements them (NCCL).\n";
    md += &ours_markdown(peer);
    md
}

/// The rows of our strategies on the peer's model, or why they are missing.
fn ours_markdown(peer: &Value) -> String {
    let Some(ours) = peer["burn_rtp"].as_array() else {
        return "\nburn-rtp's own strategies on this model need the report built with \
                `--features wgpu`.\n"
            .to_string();
    };
    let single = peer["attempts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["attempt"] == "single");
    let mut md = format!(
        "\n**burn-rtp on the same model, rows and global batch** ({} steps of {} rows, Adam at \
         1e-3), N = 2 in-process ranks on wgpu's default device, every layer sharded under rtp \
         (shard threshold 0), each strategy in a child process of the report. `ms / step` is \
         the peer's definition (start to end of training, over the steps: start-up and kernel \
         compilation included); `steady` leaves out the first step. Burn's single-device run \
         above is the reference that ran.\n\n\
         | strategy | ms / step | steady ms / step | final loss | peak RSS | ledger peak per rank |\n\
         |---|---|---|---|---|---|\n",
        peer["steps"], peer["batch"],
    );
    for o in ours {
        let Ok(run) = serde_json::from_value::<OursRun>(o.clone()) else {
            continue;
        };
        md += &format!(
            "| burn-rtp {} | {:.1} | {:.1} | {:.5} | {} | {} |\n",
            run.strategy,
            run.step_ms,
            run.steady_step_ms,
            run.final_loss,
            run.peak_rss_bytes
                .map_or("—".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0)),
            run.ledger_peak_bytes
                .iter()
                .map(|b| burn_rtp::human_bytes(*b))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    if let Some(ms) = single.and_then(|a| a["step_ms"].as_f64()) {
        md += &format!(
            "\nBurn's single-device run took {ms:.1} ms per step by the same definition. Both \
             ranks of ours share this machine's 2 cores and one lavapipe device, so N = 2 here \
             does not add compute: these rows show that our strategies train the model \
             data-parallel on wgpu (their final loss is the single run's, up to the random \
             initial weights) and what they hold, not a speed-up.\n"
        );
    }
    md
}

/// Runs one of our strategies on the peer's model in a child process (`report`, this
/// program, as `worker peer`) and reads what it measured.
fn run_ours_child(
    report: &Path,
    strategy: &str,
    peer: &Value,
    scratch: &Path,
) -> Result<OursRun, Box<dyn std::error::Error>> {
    let out = scratch.join(format!("ours-{strategy}.json"));
    let arg = |k: &str| peer[k].as_u64().unwrap_or_default() as usize;
    let status = crate::worker::Worker::Peer {
        strategy: strategy.to_string(),
        steps: arg("steps"),
        batch: arg("batch"),
        hidden: arg("hidden"),
        out: out.clone(),
    }
    .command(report)
    .status()?;
    if !status.success() {
        return Err(format!("burn-rtp {strategy} on the peer's model exited with {status}").into());
    }
    Ok(serde_json::from_slice(&std::fs::read(&out)?)?)
}

/// The settings of one of our runs on the peer's model.
#[derive(Debug, Clone, Copy)]
pub struct OursSettings {
    /// Training steps.
    pub steps: usize,
    /// Global batch (rows per step over both ranks).
    pub batch: usize,
    /// Hidden width.
    pub hidden: usize,
}

/// Trains the peer's model under our `strategy` (`ddp` or `rtp`) at N = 2 on wgpu, in this
/// process, and writes what it measured to `out` (the child started by [`add_to_report`]).
#[cfg(feature = "wgpu")]
pub fn ours_child(
    strategy: &str,
    settings: OursSettings,
    out: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use crate::peer_mlp::{eval_rows, rows, Mlp};
    use crate::Variant;
    use burn::backend::{Autodiff, Wgpu};
    use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    use burn::tensor::backend::Backend;
    use burn::tensor::ElementConversion;
    use burn_rtp::{launch, Rtp, RtpOptimizer};
    use std::time::Instant;
    type D = Autodiff<Rtp<Wgpu>>;

    let variant = match strategy {
        "ddp" => Variant::DDP,
        "rtp" => Variant::RTP_OUT_OF_PLACE,
        other => return Err(format!("unknown strategy {other:?} (ddp or rtp)").into()),
    };
    let OursSettings {
        steps,
        batch,
        hidden,
    } = settings;
    if steps < 2 || batch < 2 || batch % 2 != 0 {
        return Err(
            format!("need 2 or more steps and an even batch, got {steps} and {batch}").into(),
        );
    }
    let per = batch / 2;
    let started = Instant::now();
    let per_rank = launch(variant.config(2).with_shard_threshold(0), |device| {
        D::seed(&device, 7);
        let rank = device.rank();
        let mut model = Mlp::<D>::new(hidden, &device);
        let mut optim = RtpOptimizer::new(AdamConfig::new().init::<D, Mlp<D>>());
        let mut after_first = None;
        for step in 0..steps {
            let first = step * batch + rank * per;
            let (x, y) = rows::<D>(&(first..first + per).collect::<Vec<_>>(), &device);
            let loss = model.loss(model.forward(x), y);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-3, model, grads);
            if step == 0 {
                device.barrier();
                after_first = Some(Instant::now());
            }
        }
        device.barrier();
        let steady = after_first.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let total = started.elapsed().as_secs_f64();
        let eval: Vec<usize> = eval_rows(batch).skip(rank * per).take(per).collect();
        let (x, y) = rows::<D>(&eval, &device);
        let loss: f32 = model.loss(model.forward(x), y).into_scalar().elem();
        (
            device.all_reduce_mean(loss),
            total,
            steady,
            device.memory_peak().total,
        )
    })?;
    let (loss, total, steady, _) = per_rank[0];
    let run = OursRun {
        strategy: strategy.to_string(),
        step_ms: total * 1e3 / steps as f64,
        steady_step_ms: steady * 1e3 / (steps - 1) as f64,
        final_loss: f64::from(loss),
        peak_rss_bytes: burn_rtp::peak_rss_bytes(),
        ledger_peak_bytes: per_rank.iter().map(|r| r.3).collect(),
    };
    std::fs::write(out, serde_json::to_vec(&run)?)?;
    Ok(())
}

/// Runs the peer and adds its section to the report in `out` (`report.md`, and [`KEY`] in
/// `report.json`), replacing an earlier section. With feature `wgpu`, our ddp and rtp run the
/// peer's model beside it (`report` is this program, started once per strategy).
pub fn add_to_report(
    bin: &Path,
    out: &Path,
    report: &Path,
) -> Result<String, Box<dyn std::error::Error>> {
    let mut peer = run_peer(bin, &out.join("burn-ddp"))?;
    if cfg!(feature = "wgpu") {
        let mut ours = Vec::new();
        for strategy in OURS {
            ours.push(serde_json::to_value(run_ours_child(
                report,
                strategy,
                &peer,
                &out.join("burn-ddp"),
            )?)?);
        }
        peer["burn_rtp"] = Value::Array(ours);
    }
    add_section(out, HEADING, &markdown(&peer), KEY, &peer)?;
    let _ = std::fs::remove_dir_all(out.join("burn-ddp"));
    Ok(peer["summary"].as_str().unwrap_or_default().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn peer() -> Value {
        json!({
            "devices": ["Cpu", "DefaultDevice"], "hidden": 256, "steps": 20, "batch": 64,
            "attempts": [{"attempt": "single", "status": "finished", "ok": true, "step_ms": 51.0,
                          "final_loss": 0.0025, "peak_rss_bytes": 1048576.0, "errors": [],
                          "failed_device_tasks": 0}],
        })
    }

    #[test]
    fn our_rows_stand_beside_the_peer_with_their_memory() {
        let mut p = peer();
        p["burn_rtp"] = json!([
            OursRun {
                strategy: "ddp".into(),
                step_ms: 90.0,
                steady_step_ms: 80.0,
                final_loss: 0.002,
                peak_rss_bytes: Some(2 << 20),
                ledger_peak_bytes: vec![3 << 20, 3 << 20]
            },
            OursRun {
                strategy: "rtp".into(),
                step_ms: 95.0,
                steady_step_ms: 85.0,
                final_loss: 0.002,
                peak_rss_bytes: None,
                ledger_peak_bytes: vec![1 << 20, 1 << 20]
            },
        ]);
        let md = markdown(&p);
        assert!(md.contains("| single | finished | 51.0 |"), "{md}");
        assert!(
            md.contains("| burn-rtp ddp | 90.0 | 80.0 | 0.00200 | 2 MiB | 3.00 MiB, 3.00 MiB |"),
            "{md}"
        );
        assert!(
            md.contains("| burn-rtp rtp | 95.0 | 85.0 | 0.00200 | — | 1.00 MiB, 1.00 MiB |"),
            "{md}"
        );
        assert!(
            md.contains("51.0 ms per step by the same definition"),
            "{md}"
        );
    }

    #[test]
    fn a_report_without_wgpu_says_why_our_rows_are_missing() {
        let md = markdown(&peer());
        assert!(
            md.contains("need the report built with `--features wgpu`"),
            "{md}"
        );
        assert!(!md.contains("| burn-rtp "), "{md}");
    }
}
