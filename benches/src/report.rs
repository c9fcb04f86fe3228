//! The scaling report: memory, memory-scaling efficiency, step time against DDP, capacity
//! under a memory cap, and transfer/compute overlap, measured side by side in one run.

use crate::{median, Case, Driver, Variant};
use burn_rtp::{human_bytes, ActivationCheckpointing, RtpError};
use burn_rtp_gpt::GptConfig;
use serde::Serialize;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// What to measure.
#[derive(Debug, Clone)]
pub struct ReportConfig {
    /// Output folder.
    pub out: PathBuf,
    /// World sizes.
    pub ranks: Vec<usize>,
    /// The state-dominated model every figure uses.
    pub model: GptConfig,
    /// Global batch.
    pub batch: usize,
    /// Steps per timing sample.
    pub steps: usize,
    /// Timing samples per strategy (taken in alternation).
    pub repeats: usize,
    /// Per-rank memory cap for the capacity search.
    pub cap_bytes: u64,
    /// Models to try in the capacity search, smallest first.
    pub capacity_candidates: Vec<GptConfig>,
    /// Further models whose step time is compared across strategies.
    pub comparisons: Vec<Comparison>,
    /// Shard thresholds (elements) tried on each comparison model at N=4: parameters
    /// smaller than the threshold are replicated instead of rotated.
    pub thresholds: Vec<usize>,
    /// Where the memory planner's predictions are checked against the ledger.
    pub planner_grid: Vec<crate::planner_check::PlanPoint>,
    /// The activation section: RTP with and without activation checkpointing.
    pub activations: crate::checkpointing::Settings,
}

/// A model whose RTP, FSDP and DDP step times (and exchanges per step) are compared.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Short name, used in report keys (`rtp_over_ddp_step_time_{name}_n{N}`).
    pub name: &'static str,
    /// The model.
    pub model: GptConfig,
    /// Sequences per step over all ranks at `N` ranks.
    pub batch: fn(usize) -> usize,
    /// World sizes.
    pub ranks: Vec<usize>,
}

impl Comparison {
    /// Config A of the issues: 8 sequences per rank, N = 2, 4 and 8.
    pub fn config_a(ranks: Vec<usize>) -> Self {
        Self {
            name: "a",
            model: crate::models::config_a(),
            batch: |n| 8 * n,
            ranks,
        }
    }

    /// The small bench model with the criterion bench's global batch of 16.
    pub fn small(ranks: Vec<usize>) -> Self {
        Self {
            name: "small",
            model: crate::models::small(),
            batch: |_| 16,
            ranks,
        }
    }
}

impl ReportConfig {
    /// The full report's defaults.
    pub fn full(out: PathBuf) -> Self {
        Self {
            out,
            ranks: vec![1, 2, 4, 8],
            model: crate::models::state_dominated(),
            batch: 8,
            steps: 4,
            repeats: 7,
            cap_bytes: 48 * 1024 * 1024,
            capacity_candidates: capacity_candidates(16, 32, 2048),
            comparisons: vec![
                Comparison::small(vec![4, 8]),
                Comparison::config_a(vec![2, 4, 8]),
            ],
            thresholds: vec![0, 4096, 16384, 65536, 262144],
            planner_grid: crate::planner_check::full_grid(),
            activations: crate::checkpointing::Settings::full(),
        }
    }

    /// A seconds-long configuration for tests.
    pub fn tiny(out: PathBuf) -> Self {
        Self {
            out,
            ranks: vec![1, 2, 4, 8],
            model: GptConfig::new(8, 32, 1, 4),
            batch: 8,
            steps: 1,
            repeats: 1,
            cap_bytes: 4 * 1024 * 1024,
            capacity_candidates: capacity_candidates(8, 16, 256),
            comparisons: vec![
                Comparison {
                    name: "small",
                    model: GptConfig::new(8, 16, 1, 2),
                    batch: |_| 8,
                    ranks: vec![4, 8],
                },
                Comparison {
                    name: "a",
                    model: GptConfig::new(8, 24, 2, 2),
                    batch: |n| 2 * n,
                    ranks: vec![2, 4, 8],
                },
            ],
            thresholds: vec![0, 1024],
            planner_grid: crate::planner_check::tiny_grid(),
            activations: crate::checkpointing::Settings::tiny(),
        }
    }
}

/// Widths from `from` up to `to`, each `factor` times the one before, rounded up to a
/// multiple of 8 (what the GPT's 4 heads and the kernels' vectors divide).
fn widths(from: usize, to: usize, factor: f64) -> impl Iterator<Item = usize> {
    assert!(factor > 1.0, "widths must grow (factor {factor})");
    std::iter::successors(Some(from as f64), move |d| Some(d * factor))
        .take_while(move |d| (*d as usize) <= to)
        .map(|d| (d as usize).div_ceil(8) * 8)
}

/// Models of `layers` blocks whose width grows by `factor` each time (rounded up to a
/// multiple of 8), so that parameter counts grow by about `factor²` from one to the next:
/// bisection over them finds each strategy's largest model to that resolution, whatever its
/// size.
pub fn capacity_ladder(
    seq: usize,
    layers: usize,
    from: usize,
    to: usize,
    factor: f64,
) -> Vec<GptConfig> {
    let mut out: Vec<GptConfig> = Vec::new();
    for width in widths(from, to, factor) {
        // Rounding can make two small widths equal: one rung each.
        if out.last().is_none_or(|m| m.d_model < width) {
            out.push(GptConfig::new(seq, width, layers, 4));
        }
    }
    out
}

/// Models of growing width and depth: width grows by a fifth each time, and a block is
/// added every six widths.
pub fn capacity_candidates(seq: usize, from: usize, to: usize) -> Vec<GptConfig> {
    widths(from, to, 1.2)
        .enumerate()
        .map(|(k, width)| GptConfig::new(seq, width, 1 + k / 6, 4))
        .collect()
}

#[derive(Debug, Clone, Serialize)]
struct MemoryRow {
    strategy: &'static str,
    ranks: usize,
    sharded: u64,
    local: u64,
    in_flight: u64,
    total: u64,
    ideal_model_state: u64,
}

#[derive(Debug, Clone, Serialize)]
struct TimeRow {
    strategy: &'static str,
    ranks: usize,
    step_ms_median: f64,
    over_ddp: f64,
}

#[derive(Debug, Clone, Serialize)]
struct ComparisonRow {
    model: &'static str,
    strategy: &'static str,
    ranks: usize,
    step_ms_median: f64,
    step_ms_min: f64,
    step_ms_max: f64,
    over_ddp: f64,
    exchanges_per_step: f64,
}

#[derive(Debug, Clone, Serialize)]
struct ThresholdRow {
    model: &'static str,
    ranks: usize,
    shard_threshold: usize,
    step_ms_median: f64,
    over_ddp: f64,
}

#[derive(Debug, Clone, Serialize)]
struct CapacityRow {
    strategy: &'static str,
    ranks: usize,
    d_model: usize,
    layers: usize,
    params: usize,
}

/// Whether `model` trains two steps under the cap with `variant` on `ranks` ranks.
fn fits(
    variant: Variant,
    ranks: usize,
    model: &GptConfig,
    batch: usize,
    cap: u64,
) -> Result<Option<usize>, RtpError> {
    let case = Case {
        variant,
        ranks,
        model: model.clone(),
        batch,
        memory_cap: Some(cap),
        shard_threshold: None,
        activation_checkpointing: burn_rtp::ActivationCheckpointing::None,
    };
    let mut driver = match Driver::start(case) {
        Ok(d) => d,
        Err(RtpError::OutOfMemory { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    match driver.steps(2) {
        Ok(_) => Ok(Some(driver.params())),
        Err(RtpError::OutOfMemory { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The largest candidate that fits, by bisection over the (growing) candidates.
fn capacity(
    variant: Variant,
    ranks: usize,
    cfg: &ReportConfig,
) -> Result<Option<(GptConfig, usize)>, RtpError> {
    let c = &cfg.capacity_candidates;
    let (mut lo, mut hi) = (0usize, c.len());
    let mut best = None;
    while lo < hi {
        let mid = (lo + hi) / 2;
        match fits(variant, ranks, &c[mid], cfg.batch, cfg.cap_bytes)? {
            Some(params) => {
                best = Some((c[mid].clone(), params));
                lo = mid + 1;
            }
            None => hi = mid,
        }
    }
    Ok(best)
}

/// Step times of DDP, FSDP and RTP side by side on each comparison model, strategies
/// alternating inside every round, and the exchanges each makes per step.
fn compare(cfg: &ReportConfig, log: &dyn Fn(&str)) -> Result<Vec<ComparisonRow>, RtpError> {
    let mut rows = Vec::new();
    for c in &cfg.comparisons {
        for &ranks in &c.ranks {
            log(&format!(
                "model {} at N = {ranks}: starting 3 worlds",
                c.name
            ));
            let mut drivers = Vec::new();
            for v in [Variant::DDP, Variant::FSDP, Variant::RTP_OUT_OF_PLACE] {
                let mut d = Driver::start(Case {
                    variant: v,
                    ranks,
                    model: c.model.clone(),
                    batch: (c.batch)(ranks),
                    memory_cap: None,
                    shard_threshold: None,
                    activation_checkpointing: burn_rtp::ActivationCheckpointing::None,
                })?;
                let exchanges = d.exchanges_per_step(1)?;
                drivers.push((v, d, exchanges));
            }
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); drivers.len()];
            for round in 0..cfg.repeats {
                for (i, (_, d, _)) in drivers.iter_mut().enumerate() {
                    samples[i].push(d.steps(cfg.steps)? / cfg.steps as f64 * 1e3);
                }
                log(&format!(
                    "model {} at N = {ranks}: timing round {}/{}",
                    c.name,
                    round + 1,
                    cfg.repeats
                ));
            }
            let ddp_ms = median(&samples[0]);
            for (i, (v, _, exchanges)) in drivers.iter().enumerate() {
                let ms = median(&samples[i]);
                rows.push(ComparisonRow {
                    model: c.name,
                    strategy: v.name(),
                    ranks,
                    step_ms_median: ms,
                    step_ms_min: samples[i].iter().copied().fold(f64::INFINITY, f64::min),
                    step_ms_max: samples[i].iter().copied().fold(0.0, f64::max),
                    over_ddp: ratio(ms, ddp_ms),
                    exchanges_per_step: *exchanges,
                });
            }
        }
    }
    Ok(rows)
}

/// RTP's step time against DDP's at N=4 for each shard threshold, all alternating in one run.
fn threshold_sweep(cfg: &ReportConfig, log: &dyn Fn(&str)) -> Result<Vec<ThresholdRow>, RtpError> {
    let ranks = 4;
    let mut rows = Vec::new();
    for c in &cfg.comparisons {
        log(&format!(
            "model {}: shard thresholds {:?} at N = {ranks}",
            c.name, cfg.thresholds
        ));
        let case = |variant, threshold| Case {
            variant,
            ranks,
            model: c.model.clone(),
            batch: (c.batch)(ranks),
            memory_cap: None,
            shard_threshold: threshold,
            activation_checkpointing: burn_rtp::ActivationCheckpointing::None,
        };
        let mut drivers = vec![(0, Driver::start(case(Variant::DDP, None))?)];
        for &t in &cfg.thresholds {
            drivers.push((t, Driver::start(case(Variant::RTP_OUT_OF_PLACE, Some(t)))?));
        }
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); drivers.len()];
        for _ in 0..cfg.repeats {
            for (i, (_, d)) in drivers.iter_mut().enumerate() {
                d.steps(1)?;
                samples[i].push(d.steps(cfg.steps)? / cfg.steps as f64 * 1e3);
            }
        }
        let ddp_ms = median(&samples[0]);
        for (i, (t, _)) in drivers.iter().enumerate().skip(1) {
            let ms = median(&samples[i]);
            rows.push(ThresholdRow {
                model: c.name,
                ranks,
                shard_threshold: *t,
                step_ms_median: ms,
                over_ddp: ratio(ms, ddp_ms),
            });
        }
    }
    Ok(rows)
}

/// Exchanges one rank makes during the backward of one Linear (with bias, input tracked)
/// on `n` ranks, counted as they happen.
pub fn syncs_per_linear_backward(n: usize) -> Result<f64, RtpError> {
    use burn::nn::LinearConfig;
    use burn::tensor::{Distribution, Tensor};
    type B = burn::backend::Autodiff<burn_rtp::Rtp<burn::backend::NdArray>>;
    // Every parameter sharded: the layer is small, and the figure is about rotation.
    let config = burn_rtp::RtpConfig::new(n).with_shard_threshold(0);
    let counts = burn_rtp::launch(config, |device| {
        let linear = LinearConfig::new(64, 96).init::<B>(&device);
        let x = Tensor::<B, 2>::random([16, 64], Distribution::Default, &device).require_grad();
        let loss = linear.forward(x).sum();
        let before = device.exchanges();
        let _grads = loss.backward();
        device.exchanges() - before
    })?;
    Ok(counts[0] as f64)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// Runs every measurement and writes `report.json`, `report.md` and the SVG plots.
pub fn run(cfg: &ReportConfig, log: &dyn Fn(&str)) -> Result<Value, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&cfg.out)?;
    let mut memory = Vec::new();
    let mut times = Vec::new();
    let mut overlap_n4 = f64::NAN;
    let mut params = 0;
    for &ranks in &cfg.ranks {
        log(&format!(
            "N = {ranks}: starting {} worlds",
            Variant::ALL.len()
        ));
        let mut drivers = Vec::new();
        for v in Variant::ALL {
            let mut d = Driver::start(Case {
                variant: v,
                ranks,
                model: cfg.model.clone(),
                batch: cfg.batch,
                memory_cap: None,
                shard_threshold: None,
                activation_checkpointing: burn_rtp::ActivationCheckpointing::None,
            })?;
            d.steps(1)?;
            d.reset_peaks()?;
            params = d.params();
            drivers.push((v, d));
        }
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); drivers.len()];
        for round in 0..cfg.repeats {
            // Alternate strategies inside each round so machine noise hits them alike.
            for (i, (_, d)) in drivers.iter_mut().enumerate() {
                samples[i].push(d.steps(cfg.steps)? / cfg.steps as f64);
            }
            log(&format!(
                "N = {ranks}: timing round {}/{}",
                round + 1,
                cfg.repeats
            ));
        }
        let ddp_ms = drivers
            .iter()
            .position(|(v, _)| *v == Variant::DDP)
            .map(|i| median(&samples[i]) * 1e3)
            .unwrap_or(f64::NAN);
        let ideal = (params * 16 / ranks) as u64;
        for (i, (v, d)) in drivers.iter_mut().enumerate() {
            let peak = d.worst_peak()?;
            memory.push(MemoryRow {
                strategy: v.name(),
                ranks,
                sharded: peak.sharded,
                local: peak.local,
                in_flight: peak.in_flight,
                total: peak.total,
                ideal_model_state: ideal,
            });
            let ms = median(&samples[i]) * 1e3;
            times.push(TimeRow {
                strategy: v.name(),
                ranks,
                step_ms_median: ms,
                over_ddp: ratio(ms, ddp_ms),
            });
            if ranks == 4 && *v == Variant::RTP_OUT_OF_PLACE {
                let fractions: Vec<f64> = d
                    .timeline(1)?
                    .iter()
                    .filter_map(|t| burn_rtp::timeline::hidden_transfer_fraction(t))
                    .collect();
                overlap_n4 = fractions.iter().sum::<f64>() / fractions.len().max(1) as f64;
            }
        }
    }
    let comparisons = compare(cfg, log)?;
    let thresholds = threshold_sweep(cfg, log)?;
    log("memory planner: predictions against the ledger");
    let planner_rows =
        crate::planner_check::run(&cfg.planner_grid, ActivationCheckpointing::None, log)?;
    crate::planner_check::plot(&cfg.out.join("planner.svg"), &planner_rows)?;
    log("activations: RTP with and without balanced activation checkpointing");
    let activations = crate::checkpointing::run(&cfg.activations, log)?;
    log("exchanges of one Linear backward at N=4");
    let syncs_linear_n4 = syncs_per_linear_backward(4)?;
    log("capacity search under the memory cap");
    let mut capacity_rows = Vec::new();
    for v in [Variant::DDP, Variant::FSDP, Variant::RTP_OUT_OF_PLACE] {
        if let Some((m, p)) = capacity(v, 4, cfg)? {
            log(&format!(
                "capacity {}: d_model {} x {} layers = {p} parameters",
                v.name(),
                m.d_model,
                m.layers
            ));
            capacity_rows.push(CapacityRow {
                strategy: v.name(),
                ranks: 4,
                d_model: m.d_model,
                layers: m.layers,
                params: p,
            });
        }
    }
    let find_mem = |s: &str, n: usize| memory.iter().find(|r| r.strategy == s && r.ranks == n);
    let peak_ratio = |a: &str, b: &str| match (find_mem(a, 4), find_mem(b, 4)) {
        (Some(x), Some(y)) => ratio(x.total as f64, y.total as f64),
        _ => f64::NAN,
    };
    let efficiency = |n: usize| {
        find_mem("rtp-oop", n)
            .map(|r| ratio(r.ideal_model_state as f64, r.sharded as f64))
            .unwrap_or(f64::NAN)
    };
    let time_n4 = times
        .iter()
        .find(|t| t.strategy == "rtp-oop" && t.ranks == 4)
        .map_or(f64::NAN, |t| t.over_ddp);
    let cap_of = |s: &str| {
        capacity_rows
            .iter()
            .find(|r| r.strategy == s)
            .map(|r| r.params as f64)
    };
    let capacity_ratio = match (cap_of("rtp-oop"), cap_of("ddp")) {
        (Some(a), Some(b)) => ratio(a, b),
        _ => f64::NAN,
    };
    let headline = json!({
        "rtp_over_ddp_peak_n4": peak_ratio("rtp-oop", "ddp"),
        "rtp_over_fsdp_peak_n4": peak_ratio("rtp-oop", "fsdp"),
        "memory_scaling_efficiency_n8": efficiency(8),
        "rtp_over_ddp_step_time_n4": time_n4,
        "capacity_rtp_over_ddp_n4": capacity_ratio,
        "overlap_fraction_n4": overlap_n4,
        "syncs_per_linear_backward_n4": syncs_linear_n4,
        "planner_max_rel_error_ledger": crate::planner_check::max_rel_error(&planner_rows),
    });
    let mut headline = headline;
    for (key, value) in activations.figures().as_object().expect("an object") {
        headline[key] = value.clone();
    }
    for c in &comparisons {
        if c.strategy == "rtp-oop" {
            headline[format!("rtp_over_ddp_step_time_{}_n{}", c.model, c.ranks)] =
                json!(c.over_ddp);
        }
    }
    let machine = json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "inner_backend": "ndarray (CPU)",
        "transport": "in-process",
        "ranks": cfg.ranks,
        "model": { "d_model": cfg.model.d_model, "layers": cfg.model.layers, "heads": cfg.model.heads, "seq": cfg.model.seq, "params": params },
        "global_batch": cfg.batch,
        "cap_bytes": cfg.cap_bytes,
    });
    let mut report = headline.clone();
    let obj = report.as_object_mut().expect("an object");
    obj.insert("machine".into(), machine.clone());
    obj.insert("memory".into(), serde_json::to_value(&memory)?);
    obj.insert(
        "memory_scaling_efficiency".into(),
        json!(cfg
            .ranks
            .iter()
            .map(|&n| json!({"ranks": n, "efficiency": efficiency(n)}))
            .collect::<Vec<_>>()),
    );
    obj.insert("step_time".into(), serde_json::to_value(&times)?);
    obj.insert("capacity".into(), serde_json::to_value(&capacity_rows)?);
    obj.insert("comparisons".into(), serde_json::to_value(&comparisons)?);
    obj.insert(
        "shard_thresholds".into(),
        serde_json::to_value(&thresholds)?,
    );
    obj.insert("planner".into(), serde_json::to_value(&planner_rows)?);
    obj.insert(
        "activation_checkpointing".into(),
        serde_json::to_value(&activations)?,
    );
    std::fs::write(
        cfg.out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(
        cfg.out.join("report.md"),
        markdown(
            cfg,
            &headline,
            &machine,
            &Tables {
                memory: &memory,
                times: &times,
                capacity: &capacity_rows,
                comparisons: &comparisons,
                thresholds: &thresholds,
            },
        ) + &crate::planner_check::markdown(&planner_rows)
            + &activations.markdown(&cfg.activations),
    )?;
    plots::memory(&cfg.out.join("memory.svg"), &memory, &cfg.ranks)?;
    plots::efficiency(&cfg.out.join("efficiency.svg"), &cfg.ranks, &efficiency)?;
    plots::step_time(&cfg.out.join("step_time.svg"), &times, &cfg.ranks)?;
    plots::capacity(&cfg.out.join("capacity.svg"), &capacity_rows)?;
    Ok(report)
}

/// The measured tables, for the markdown report.
struct Tables<'a> {
    memory: &'a [MemoryRow],
    times: &'a [TimeRow],
    capacity: &'a [CapacityRow],
    comparisons: &'a [ComparisonRow],
    thresholds: &'a [ThresholdRow],
}

fn markdown(cfg: &ReportConfig, headline: &Value, machine: &Value, tables: &Tables) -> String {
    let Tables {
        memory,
        times,
        capacity,
        comparisons,
        thresholds,
    } = *tables;
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
    md
}

mod plots {
    use super::{CapacityRow, MemoryRow, TimeRow};
    use plotters::prelude::*;
    use std::path::Path;

    type Res = Result<(), Box<dyn std::error::Error>>;

    const COLORS: [RGBColor; 6] = [
        RGBColor(90, 90, 90),
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
    ];

    pub fn lines(
        path: &Path,
        title: &str,
        y_label: &str,
        ranks: &[usize],
        series: &[(String, Vec<(usize, f64)>)],
    ) -> Res {
        let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let x_max = *ranks.iter().max().unwrap_or(&1) as f64 + 0.5;
        let y_max = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
            .filter(|y| y.is_finite())
            .fold(0.0, f64::max)
            * 1.15
            + 1e-9;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0.5..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("ranks (N)")
            .y_desc(y_label)
            .draw()?;
        for (i, (name, points)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.1.is_finite())
                .map(|(x, y)| (*x as f64, *y))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }

    fn strategies(rows: impl Iterator<Item = &'static str>) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for s in rows {
            if !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }

    pub fn memory(path: &Path, rows: &[MemoryRow], ranks: &[usize]) -> Res {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let mut series: Vec<(String, Vec<(usize, f64)>)> =
            strategies(rows.iter().map(|r| r.strategy))
                .into_iter()
                .map(|s| {
                    let pts = rows
                        .iter()
                        .filter(|r| r.strategy == s)
                        .map(|r| (r.ranks, mib(r.total)))
                        .collect();
                    (format!("{s} peak"), pts)
                })
                .collect();
        let ideal = ranks
            .iter()
            .filter_map(|&n| {
                rows.iter()
                    .find(|r| r.ranks == n)
                    .map(|r| (n, mib(r.ideal_model_state)))
            })
            .collect();
        series.push(("ideal model state (single / N)".into(), ideal));
        lines(path, "Peak memory per rank", "MiB", ranks, &series)
    }

    pub fn efficiency(path: &Path, ranks: &[usize], eff: &dyn Fn(usize) -> f64) -> Res {
        let pts = ranks.iter().map(|&n| (n, eff(n))).collect();
        lines(
            path,
            "RTP memory-scaling efficiency (ideal / measured model state)",
            "efficiency",
            ranks,
            &[("rtp".into(), pts)],
        )
    }

    pub fn step_time(path: &Path, rows: &[TimeRow], ranks: &[usize]) -> Res {
        let series: Vec<(String, Vec<(usize, f64)>)> = strategies(rows.iter().map(|r| r.strategy))
            .into_iter()
            .map(|s| {
                let pts = rows
                    .iter()
                    .filter(|r| r.strategy == s)
                    .map(|r| (r.ranks, r.over_ddp))
                    .collect();
                (s.to_string(), pts)
            })
            .collect();
        lines(path, "Step time / DDP step time", "ratio", ranks, &series)
    }

    pub fn capacity(path: &Path, rows: &[CapacityRow]) -> Res {
        let bars_of: Vec<(&str, f64)> = rows
            .iter()
            .map(|r| (r.strategy, r.params as f64 / 1e6))
            .collect();
        bars(
            path,
            "Largest trainable model under the per-rank cap (N=4)",
            &bars_of,
        )
    }

    /// One bar per named value, in million parameters.
    pub fn bars(path: &Path, title: &str, rows: &[(&str, f64)]) -> Res {
        let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let y_max = rows.iter().map(|r| r.1).fold(0.0, f64::max) * 1.2 + 1e-9;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5..rows.len().max(1) as f64 - 0.5, 0.0..y_max)?;
        let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(rows.len().max(1))
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    names.get(i as usize).copied().unwrap_or("").to_string()
                } else {
                    String::new()
                }
            })
            .y_desc("million parameters")
            .draw()?;
        chart.draw_series(rows.iter().enumerate().map(|(i, r)| {
            Rectangle::new(
                [(i as f64 - 0.35, 0.0), (i as f64 + 0.35, r.1)],
                COLORS[(i + 1) % COLORS.len()].filled(),
            )
        }))?;
        root.present()?;
        Ok(())
    }
}

pub(crate) use plots::{bars as plot_bars, lines as plot_lines};

/// Checks that a report JSON has every headline figure ([`crate::figures::IN_PROCESS`]) as
/// a finite number.
pub fn check_keys(report: &Value) -> Result<(), String> {
    crate::figures::check_keys(crate::figures::IN_PROCESS, report)
}

/// Where `scaling-report` writes by default.
pub fn default_out() -> PathBuf {
    Path::new("runs").join("scaling")
}

/// `report` (a pretty-printed JSON object) with `key: value` as its last entry, replacing an
/// earlier one written the same way (and keeping any other key appended after it). The rest
/// of the text is kept as it is, so the report's numbers are not reprinted.
pub fn with_last_key(report: &str, key: &str, value: &Value) -> Result<String, String> {
    let marker = format!(",\n  \"{key}\": ");
    let kept = match report.find(&marker) {
        Some(at) => {
            let rest = &report[at + marker.len()..];
            // The next top-level key (two spaces of indent), or the object's end.
            let tail = rest.find(",\n  \"").map_or("\n}\n", |i| &rest[i..]);
            format!("{}{tail}", &report[..at])
        }
        None => report.to_string(),
    };
    let body = kept
        .trim_end()
        .strip_suffix('}')
        .ok_or("report.json is not a JSON object")?
        .trim_end();
    let value = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    let out = format!("{body}{marker}{}\n}}\n", value.replace('\n', "\n  "));
    serde_json::from_str::<Value>(&out).map_err(|e| format!("report.json would not parse: {e}"))?;
    Ok(out)
}

/// Adds a section to the report in `out`: `markdown` (starting with `heading`) at the end of
/// `report.md` and `key: value` in `report.json`, replacing what an earlier run wrote.
pub fn add_section(
    out: &Path,
    heading: &str,
    markdown: &str,
    key: &str,
    value: &Value,
) -> Result<(), Box<dyn std::error::Error>> {
    let md_path = out.join("report.md");
    let mut md = std::fs::read_to_string(&md_path)?;
    if let Some(start) = md.find(&format!("\n{heading}")) {
        let rest = &md[start + 1..];
        let end = rest[heading.len()..]
            .find("\n## ")
            .map_or(md.len(), |i| start + 1 + heading.len() + i);
        md.replace_range(start..end, "");
    }
    md += markdown;
    std::fs::write(&md_path, md)?;
    let json_path = out.join("report.json");
    let text = std::fs::read_to_string(&json_path)?;
    std::fs::write(&json_path, with_last_key(&text, key, value)?)?;
    Ok(())
}

/// Puts `figures` (an object of headline keys) into the report in `out` as top-level keys
/// of `report.json`, and renders its figures table in `report.md` again from `table`, in
/// place: for a section measured on its own after the report's run.
pub fn add_figures(
    out: &Path,
    figures: &Value,
    table: &[crate::figures::Figure],
) -> Result<(), Box<dyn std::error::Error>> {
    let json_path = out.join("report.json");
    let mut text = std::fs::read_to_string(&json_path)?;
    for (key, value) in figures.as_object().ok_or("figures are an object")? {
        text = with_last_key(&text, key, value)?;
    }
    std::fs::write(&json_path, &text)?;
    let report: Value = serde_json::from_str(&text)?;
    let md_path = out.join("report.md");
    let md = std::fs::read_to_string(&md_path)?;
    let start = md
        .find("| figure | key |")
        .ok_or("report.md has no figures table")?;
    let end = md[start..].find("\n\n").map_or(md.len(), |i| start + i + 1);
    let mut new = md.clone();
    new.replace_range(start..end, &crate::figures::targets_table(table, &report));
    std::fs::write(&md_path, new)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appended_keys_replace_themselves_and_keep_the_rest_verbatim() {
        let report = "{\n  \"a\": 0.30000000000000004,\n  \"b\": [\n    1\n  ]\n}\n";
        let once = with_last_key(report, "k", &json!({"x": 1})).unwrap();
        assert!(once.starts_with("{\n  \"a\": 0.30000000000000004,\n  \"b\": [\n    1\n  ],"));
        let other = with_last_key(&once, "w", &json!({"y": [1, 2]})).unwrap();
        let twice = with_last_key(&other, "k", &json!({"x": 2})).unwrap();
        let v: Value = serde_json::from_str(&twice).unwrap();
        assert_eq!(v["k"]["x"], 2);
        assert_eq!(v["w"]["y"][1], 2);
        assert_eq!(v["a"], json!(0.30000000000000004));
        assert_eq!(twice.matches("\"k\"").count(), 1);
        assert!(twice.starts_with("{\n  \"a\": 0.30000000000000004,"));
        assert!(with_last_key("[1]", "k", &Value::Null).is_err());
    }

    #[test]
    fn a_capacity_ladder_grows_in_small_steps_of_width_only() {
        let ladder = capacity_ladder(8, 2, 256, 4096, 1.05);
        assert_eq!(ladder.first().unwrap().d_model, 256);
        assert!(ladder.last().unwrap().d_model <= 4096);
        for pair in ladder.windows(2) {
            let (a, b) = (pair[0].d_model, pair[1].d_model);
            assert!(a < b && b % 8 == 0, "{a} -> {b}");
            // Rounding up to a multiple of 8 may add up to 8 to the 5% step.
            assert!(b as f64 <= a as f64 * 1.05 + 8.0, "{a} -> {b}");
        }
        assert!(ladder.iter().all(|m| m.layers == 2));
    }
}
