//! End-to-end figures on wgpu: config A at N = 2, RTP against DDP, with the fused `#[cube]`
//! rotation kernels and with the generic compositions they replace, all in one run with the
//! variants alternating. CI's machines run wgpu on Mesa's lavapipe (a CPU rasteriser, with
//! both ranks on 2 cores): these figures say whether the fused path pays off there, not what
//! a GPU would do.

use crate::runner::add_section;
use crate::{median, models, Case, Driver, Variant};
use burn::backend::Wgpu;
use burn_rtp::set_fused_kernels;
use serde_json::{json, Value};
use std::path::Path;

/// Heading of the report section this module writes.
pub const HEADING: &str = "## On wgpu: config A at N = 2, fused kernels against generic";

/// The key of these figures in `report.json`.
pub const KEY: &str = "wgpu_config_a_n2";

/// Runs `repeats` alternating rounds of `steps` steps each (DDP, RTP fused, RTP generic, in
/// a rotating order) and returns the medians (ms per step) and their ratios.
pub fn measure(
    repeats: usize,
    steps: usize,
    log: &dyn Fn(&str),
) -> Result<Value, Box<dyn std::error::Error>> {
    let case = |variant| Case {
        variant,
        ranks: 2,
        model: models::config_a(),
        batch: 16,
        memory_cap: None,
        shard_threshold: None,
        activation_checkpointing: burn_rtp::ActivationCheckpointing::None,
    };
    log("wgpu: starting DDP and RTP worlds (config A, N = 2)");
    let mut ddp = Driver::start_on::<Wgpu>(case(Variant::DDP))?;
    let mut rtp = Driver::start_on::<Wgpu>(case(Variant::RTP_OUT_OF_PLACE))?;
    // Warm-up: kernel compilation and autotuning stay out of the timings.
    ddp.steps(1)?;
    for fused in [true, false] {
        set_fused_kernels(fused);
        rtp.steps(1)?;
    }
    let (mut t_ddp, mut t_fused, mut t_generic) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..repeats {
        for k in 0..3 {
            let ms = |s: f64| s / steps as f64 * 1e3;
            match (round + k) % 3 {
                0 => t_ddp.push(ms(ddp.steps(steps)?)),
                1 => {
                    set_fused_kernels(true);
                    t_fused.push(ms(rtp.steps(steps)?));
                }
                _ => {
                    set_fused_kernels(false);
                    t_generic.push(ms(rtp.steps(steps)?));
                }
            }
        }
        log(&format!("wgpu: round {}/{repeats}", round + 1));
    }
    set_fused_kernels(true);
    let (d, f, g) = (median(&t_ddp), median(&t_fused), median(&t_generic));
    Ok(json!({
        "model": "config A (d_model 256, 4 layers, context 64, 8 sequences per rank)",
        "ranks": 2,
        "device": "wgpu default device (Mesa lavapipe on CI machines)",
        "steps_per_sample": steps,
        "samples": repeats,
        "ddp_step_ms": d,
        "rtp_fused_step_ms": f,
        "rtp_generic_step_ms": g,
        "rtp_fused_over_ddp": f / d,
        "rtp_generic_over_ddp": g / d,
        "fused_over_generic": f / g,
    }))
}

/// The report section for `v` (what [`measure`] returned).
pub fn markdown(v: &Value) -> String {
    let n = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    format!(
        "\n{HEADING}\n\n{} samples of {} steps, alternating; median ms per step. The device is \
         wgpu's default: Mesa's lavapipe on CI machines, a CPU rasteriser with both ranks on 2 \
         cores, so these say how the paths compare there, not on a GPU.\n\n\
         | variant | step (ms) | / DDP |\n|---|---|---|\n\
         | DDP | {:.1} | 1.00 |\n| RTP, fused kernels | {:.1} | {:.2} |\n\
         | RTP, generic compositions | {:.1} | {:.2} |\n\nFused / generic: **{:.2}**.\n",
        v["samples"],
        v["steps_per_sample"],
        n("ddp_step_ms"),
        n("rtp_fused_step_ms"),
        n("rtp_fused_over_ddp"),
        n("rtp_generic_step_ms"),
        n("rtp_generic_over_ddp"),
        n("fused_over_generic"),
    )
}

/// Measures and adds the section to the report in `out`; returns a one-line summary.
pub fn add_to_report(
    out: &Path,
    repeats: usize,
    steps: usize,
    log: &dyn Fn(&str),
) -> Result<String, Box<dyn std::error::Error>> {
    let v = measure(repeats, steps, log)?;
    add_section(out, HEADING, &markdown(&v), KEY, &v)?;
    Ok(format!(
        "RTP/DDP {:.2} fused, {:.2} generic; fused/generic {:.2}",
        v["rtp_fused_over_ddp"].as_f64().unwrap_or(f64::NAN),
        v["rtp_generic_over_ddp"].as_f64().unwrap_or(f64::NAN),
        v["fused_over_generic"].as_f64().unwrap_or(f64::NAN),
    ))
}
