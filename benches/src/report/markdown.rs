//! The in-process report's `report.md`.

use super::measure::Measured;
use super::ReportConfig;
use burn_rtp::human_bytes;
use serde_json::Value;

/// `report.md`: the machine and model, the figures table, every table of the run, the
/// planner's and the activation section's.
pub(super) fn markdown(cfg: &ReportConfig, m: &Measured, report: &Value) -> String {
    let (headline, machine) = (report, &report["machine"]);
    let Measured {
        memory,
        times,
        capacity,
        comparisons,
        thresholds,
        ..
    } = m;
    let mut md = String::from("# burn-rtp scaling report\n\n");
    md += &format!(
        "Machine: {} cores; inner backend {}; {} transport; N in {:?}. Model: d_model {}, {} layer(s), {} heads, context {} ({} parameters), global batch {}. Everything below was measured in one run, strategies alternating.\n\n",
        machine["cores"], machine["inner_backend"].as_str().unwrap_or(""), machine["transport"].as_str().unwrap_or(""),
        cfg.ranks, cfg.model.d_model, cfg.model.layers, cfg.model.heads, cfg.model.seq, machine["model"]["params"], cfg.batch
    );
    md += "## Figures\n\n";
    md += &crate::figures::targets_table(crate::figures::IN_PROCESS, headline);
    md += "\n";
    md += "## Peak memory per rank (worst rank)\n\n| strategy | N | model state | local (activations, gradients before reduction) | in flight | total | ideal model state (single / N) |\n|---|---|---|---|---|---|---|\n";
    for r in memory {
        md += &format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.strategy,
            r.ranks,
            human_bytes(r.sharded),
            human_bytes(r.local),
            human_bytes(r.in_flight),
            human_bytes(r.total),
            human_bytes(r.ideal_model_state)
        );
    }
    md += "\n## Step time (median of alternating samples)\n\n| strategy | N | step | / DDP |\n|---|---|---|---|\n";
    for t in times {
        md += &format!(
            "| {} | {} | {:.1} ms | {:.3} |\n",
            t.strategy, t.ranks, t.step_ms_median, t.over_ddp
        );
    }
    md += &format!(
        "\n## Step time on further models (median, min and max of alternating samples)\n\nOne Linear backward (every parameter sharded) made {} exchanges with its neighbours at N=4 (one ring pass: N-1 = 3). Exchanges per step are counted by the ranks as they happen; each step also ends with one barrier. These runs use the default shard threshold ({} elements; 0 shards every parameter).\n\n| model | strategy | N | step (median) | min - max | / DDP | exchanges per step |\n|---|---|---|---|---|---|---|\n",
        headline["syncs_per_linear_backward_n4"],
        burn_rtp::DEFAULT_SHARD_THRESHOLD
    );
    for c in comparisons {
        let model = cfg.comparisons.iter().find(|m| m.name == c.model);
        let shape = model.map_or(String::new(), |m| {
            format!(
                " (d_model {}, {} layers, context {}, batch {})",
                m.model.d_model,
                m.model.layers,
                m.model.seq,
                (m.batch)(c.ranks)
            )
        });
        md += &format!(
            "| {}{shape} | {} | {} | {:.1} ms | {:.1} - {:.1} ms | {:.3} | {:.0} |\n",
            c.model,
            c.strategy,
            c.ranks,
            c.step_ms_median,
            c.step_ms_min,
            c.step_ms_max,
            c.over_ddp,
            c.exchanges_per_step
        );
    }
    md += "\n## Replicating small layers (shard threshold), N=4\n\nParameters with fewer elements than the threshold are replicated (data-parallel) instead of rotated. RTP (out-of-place) step time against DDP, all alternating in one run:\n\n| model | threshold (elements) | step (median) | / DDP |\n|---|---|---|---|\n";
    for t in thresholds {
        md += &format!(
            "| {} | {} | {:.1} ms | {:.3} |\n",
            t.model, t.shard_threshold, t.step_ms_median, t.over_ddp
        );
    }
    md += &format!(
        "\n## Largest trainable model under a {} cap per rank (N=4)\n\n| strategy | d_model | layers | parameters |\n|---|---|---|---|\n",
        human_bytes(cfg.cap_bytes)
    );
    for c in capacity {
        md += &format!(
            "| {} | {} | {} | {} |\n",
            c.strategy, c.d_model, c.layers, c.params
        );
    }
    md += "\n## Notes\n\n* Memory is what the decorator's accounting holds per rank: model state (parameter shards, gradients, Adam moments), local (activations, temporaries and gradients before their reduction), and rotation buffers or gathered FSDP units (in flight).\n* Burn's own DDP (burn-train's `DistributedDataParallel`) is not in this table: it needs Burn's `distributed` feature and a `DistributedBackend`, which NdArray does not implement (and turning the feature on breaks plain `Autodiff<NdArray>` in the same build). Our `ddp` is the same algorithm on the same transport and backend, and its Linear runs the same kernel as RTP's steps (on NdArray, the native GEMM over the whole weight), so the ratios measure the rotation, not the kernel.\n* The in-process transport hands tensors between rank threads without copying, so transfer time here is waiting for the neighbour; overlap is the share of that waiting that ran concurrently with this rank's compute.\n\nPlots: `memory.svg`, `efficiency.svg`, `step_time.svg`, `capacity.svg`, `planner.svg`.\n";
    md + &crate::planner_check::markdown(&m.planner_rows)
        + &m.activations.markdown(&cfg.activations)
        + &crate::decode::markdown(&cfg.decode, &m.decode)
}
