//! The in-process report's `report.json`: its headline figures and the tables behind them.

use super::measure::{ratio, Measured};
use super::ReportConfig;
use crate::runner::Failure;
use serde_json::{json, Map, Value};

/// The headline figures ([`crate::figures::IN_PROCESS`]): RTP against DDP and FSDP at N = 4,
/// its efficiency at N = 8, the planner's error, the activation section's figures and RTP's
/// step time against DDP on each further model.
pub(super) fn headline(m: &Measured) -> Map<String, Value> {
    let find_mem = |s: &str, n: usize| m.memory.iter().find(|r| r.strategy == s && r.ranks == n);
    let peak_ratio = |a: &str, b: &str| match (find_mem(a, 4), find_mem(b, 4)) {
        (Some(x), Some(y)) => ratio(x.total as f64, y.total as f64),
        _ => f64::NAN,
    };
    let time_n4 = m
        .times
        .iter()
        .find(|t| t.strategy == "rtp-oop" && t.ranks == 4)
        .map_or(f64::NAN, |t| t.over_ddp);
    let cap_of = |s: &str| {
        m.capacity
            .iter()
            .find(|r| r.strategy == s)
            .map(|r| r.params as f64)
    };
    let capacity_ratio = match (cap_of("rtp-oop"), cap_of("ddp")) {
        (Some(a), Some(b)) => ratio(a, b),
        _ => f64::NAN,
    };
    let mut headline = json!({
        "rtp_over_ddp_peak_n4": peak_ratio("rtp-oop", "ddp"),
        "rtp_over_fsdp_peak_n4": peak_ratio("rtp-oop", "fsdp"),
        "memory_scaling_efficiency_n8": m.efficiency(8),
        "rtp_over_ddp_step_time_n4": time_n4,
        "capacity_rtp_over_ddp_n4": capacity_ratio,
        "overlap_fraction_n4": m.overlap_n4,
        "syncs_per_linear_backward_n4": m.syncs_linear_n4,
        "planner_max_rel_error_ledger": crate::planner_check::max_rel_error(&m.planner_rows),
    });
    for (key, value) in m.activations.figures().as_object().expect("an object") {
        headline[key] = value.clone();
    }
    for (key, value) in crate::decode::figures(&m.decode)
        .as_object()
        .expect("an object")
    {
        headline[key] = value.clone();
    }
    for c in &m.comparisons {
        if c.strategy == "rtp-oop" {
            headline[format!("rtp_over_ddp_step_time_{}_n{}", c.model, c.ranks)] =
                json!(c.over_ddp);
        }
    }
    match headline {
        Value::Object(map) => map,
        _ => unreachable!("built as an object"),
    }
}

/// The machine, the model, and every table the figures come from.
pub(super) fn details(cfg: &ReportConfig, m: &Measured) -> Result<Map<String, Value>, Failure> {
    let machine = json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "inner_backend": "ndarray (CPU)",
        "transport": "in-process",
        "ranks": cfg.ranks,
        "model": { "d_model": cfg.model.d_model, "layers": cfg.model.layers, "heads": cfg.model.heads, "seq": cfg.model.seq, "params": m.params },
        "global_batch": cfg.batch,
        "cap_bytes": cfg.cap_bytes,
    });
    let mut obj = Map::new();
    obj.insert("machine".into(), machine);
    obj.insert("memory".into(), serde_json::to_value(&m.memory)?);
    obj.insert(
        "memory_scaling_efficiency".into(),
        json!(cfg
            .ranks
            .iter()
            .map(|&n| json!({"ranks": n, "efficiency": m.efficiency(n)}))
            .collect::<Vec<_>>()),
    );
    obj.insert("step_time".into(), serde_json::to_value(&m.times)?);
    obj.insert("capacity".into(), serde_json::to_value(&m.capacity)?);
    obj.insert("comparisons".into(), serde_json::to_value(&m.comparisons)?);
    obj.insert(
        "shard_thresholds".into(),
        serde_json::to_value(&m.thresholds)?,
    );
    obj.insert("planner".into(), serde_json::to_value(&m.planner_rows)?);
    obj.insert(
        "activation_checkpointing".into(),
        serde_json::to_value(&m.activations)?,
    );
    obj.insert(crate::decode::KEY.into(), m.decode.clone());
    Ok(obj)
}
