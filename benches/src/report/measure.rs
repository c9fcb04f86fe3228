//! The in-process report's measurements: every strategy at every world size, further models,
//! shard thresholds, the planner, the activation section and the capacity search.

use super::ReportConfig;
use crate::runner::Failure;
use crate::{median, Case, Driver, Variant};
use burn_rtp::{ActivationCheckpointing, RtpError};
use burn_rtp_gpt::GptConfig;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub(super) struct MemoryRow {
    pub(super) strategy: &'static str,
    pub(super) ranks: usize,
    pub(super) sharded: u64,
    pub(super) local: u64,
    pub(super) in_flight: u64,
    pub(super) total: u64,
    pub(super) ideal_model_state: u64,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct TimeRow {
    pub(super) strategy: &'static str,
    pub(super) ranks: usize,
    pub(super) step_ms_median: f64,
    pub(super) over_ddp: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct ComparisonRow {
    pub(super) model: &'static str,
    pub(super) strategy: &'static str,
    pub(super) ranks: usize,
    pub(super) step_ms_median: f64,
    pub(super) step_ms_min: f64,
    pub(super) step_ms_max: f64,
    pub(super) over_ddp: f64,
    pub(super) exchanges_per_step: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct ThresholdRow {
    pub(super) model: &'static str,
    pub(super) ranks: usize,
    pub(super) shard_threshold: usize,
    pub(super) step_ms_median: f64,
    pub(super) over_ddp: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct CapacityRow {
    pub(super) strategy: &'static str,
    pub(super) ranks: usize,
    pub(super) d_model: usize,
    pub(super) layers: usize,
    pub(super) params: usize,
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
    // Every parameter sharded, the weights rotating: the layer is small, and the figure is
    // about rotation.
    let config = burn_rtp::RtpConfig::new(n)
        .with_shard_threshold(0)
        .with_routing(burn_rtp::Routing::Weights);
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

pub(super) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// Runs every measurement, strategies alternating.
pub(super) fn measure(cfg: &ReportConfig, log: &dyn Fn(&str)) -> Result<Measured, Failure> {
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
    log("activations: RTP with and without balanced activation checkpointing");
    let activations = crate::checkpointing::run(&cfg.activations, log)?;
    log("generation: batch 1 through a KV cache");
    let decode = crate::decode::run(&cfg.decode, log)?;
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
    Ok(Measured {
        params,
        memory,
        times,
        overlap_n4,
        comparisons,
        thresholds,
        planner_rows,
        activations,
        decode,
        syncs_linear_n4,
        capacity: capacity_rows,
    })
}

/// Everything the in-process report measured (read by its other steps only).
pub struct Measured {
    /// Parameters of the report's model.
    pub(super) params: usize,
    /// Each strategy's peak memory at each world size.
    pub(super) memory: Vec<MemoryRow>,
    /// Each strategy's step time at each world size.
    pub(super) times: Vec<TimeRow>,
    /// RTP's share of transfer time hidden under compute at N = 4.
    pub(super) overlap_n4: f64,
    /// Step times on the further models.
    pub(super) comparisons: Vec<ComparisonRow>,
    /// RTP's step time at each shard threshold.
    pub(super) thresholds: Vec<ThresholdRow>,
    /// The planner's predictions against the ledger.
    pub(super) planner_rows: Vec<crate::planner_check::PlanRow>,
    /// The activation section.
    pub(super) activations: crate::checkpointing::Section,
    /// The generation section (`crate::decode`).
    pub(super) decode: serde_json::Value,
    /// Exchanges of one Linear backward at N = 4.
    pub(super) syncs_linear_n4: f64,
    /// The largest model each strategy trains under the cap.
    pub(super) capacity: Vec<CapacityRow>,
}

impl Measured {
    /// RTP's memory-scaling efficiency at `n` ranks: the ideal model state over the measured.
    pub(super) fn efficiency(&self, n: usize) -> f64 {
        self.memory
            .iter()
            .find(|r| r.strategy == "rtp-oop" && r.ranks == n)
            .map(|r| ratio(r.ideal_model_state as f64, r.sharded as f64))
            .unwrap_or(f64::NAN)
    }
}
