//! Burn's own data parallelism as a peer row of the scaling report.
//!
//! burn-train's DDP needs Burn's `distributed` feature, which would change `Autodiff<B>` for
//! every crate of this workspace, so it is built as its own workspace (`benches/burn-ddp`,
//! binary `burn-ddp-peer`). The report runs that binary, which tries burn-train's `ddp` and
//! `multi` strategies at N = 2 on two wgpu devices next to a single-device run, and adds what
//! it found: step time and peak memory where a strategy ran, the exact errors where it did
//! not.

use crate::report::add_section;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

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
    md
}

/// Runs the peer and adds its section to the report in `out` (`report.md`, and [`KEY`] in
/// `report.json`), replacing an earlier section.
pub fn add_to_report(bin: &Path, out: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let peer = run_peer(bin, &out.join("burn-ddp"))?;
    add_section(out, HEADING, &markdown(&peer), KEY, &peer)?;
    let _ = std::fs::remove_dir_all(out.join("burn-ddp"));
    Ok(peer["summary"].as_str().unwrap_or_default().to_string())
}
