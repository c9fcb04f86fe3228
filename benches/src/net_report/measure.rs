//! The shaped-network report's measurements: each link's probe, then every cell's jobs on
//! every link, strategies alternating.

use super::probe::{cluster, probe_link};
use super::{Link, NetCell, NetReportConfig, FLAT, STRATEGIES};
use crate::mpi_report::{job_output, worker_command, Job, JobResult};
use crate::runner::Failure;
use crate::{median, InnerBackend, Variant};
use burn_rtp::{ActivationCheckpointing, MpiProgress};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// What the jobs of one strategy measured on one link of one cell.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Sample {
    pub(super) step_ms: Vec<f64>,
    /// Per job, the ranks' mean share of wire time hidden under rotation compute.
    pub(super) hidden: Vec<f64>,
    /// Per job, the ranks' mean bytes sent per step.
    pub(super) sent_bytes: Vec<f64>,
    /// Per job, the ranks' mean rotation compute per step, in seconds.
    pub(super) compute_s: Vec<f64>,
    pub(super) params: usize,
}

/// The mean of a sample (0 when empty).
fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

impl Sample {
    /// Adds one job's result.
    pub(super) fn add(&mut self, r: &JobResult) {
        self.step_ms.push(median(&r.step_s) * 1e3);
        let hidden: Vec<f64> = r.overlap.iter().flatten().copied().collect();
        if !hidden.is_empty() {
            self.hidden.push(mean(&hidden));
        }
        self.sent_bytes.push(mean(&r.sent_bytes_per_step));
        self.compute_s.push(mean(&r.rotation_compute_s_per_step));
        self.params = r.params;
    }
    /// The median step, ms.
    pub(super) fn step(&self) -> f64 {
        median(&self.step_ms)
    }
}

/// Bytes each rank sends per step by the algorithm: `factor`·(N−1)/N of the parameter bytes
/// (f32), with factor 2 for DDP's ring all-reduce and 3 for FSDP and RTP (the weights travel
/// in the forward pass, and again with the gradients in the backward pass).
pub(super) fn algorithm_bytes(variant: Variant, params: usize, ranks: usize) -> f64 {
    let factor = if variant == Variant::DDP { 2.0 } else { 3.0 };
    factor * (ranks - 1) as f64 / ranks as f64 * params as f64 * 4.0
}

/// One cell's results: per link, per strategy.
pub(super) struct CellResults {
    /// The cell.
    pub(super) cell: NetCell,
    /// Its shaped links, slowest first.
    pub(super) links: Vec<Link>,
    /// What each (link, strategy) measured.
    samples: BTreeMap<(Link, &'static str), Sample>,
}

impl CellResults {
    /// What `v`'s jobs measured on `link`.
    pub(super) fn sample(&self, link: Link, v: Variant) -> Option<&Sample> {
        self.samples.get(&(link, v.name()))
    }
    /// `v`'s median step on `link`, ms.
    pub(super) fn step(&self, link: Link, v: Variant) -> f64 {
        self.sample(link, v).map_or(f64::NAN, Sample::step)
    }

    /// The design's rate (Gbit/s) above which one shard's transfer fits inside one ring
    /// step's compute: a pass over N ranks makes N − 1 transfers beside N compute steps, so
    /// the rate is (W / (N − 1)) / (C / N), with W RTP's bytes sent per rank per step and C its
    /// rotation compute per step, both as the unshaped link measured them.
    pub(super) fn predicted_gbit(&self) -> f64 {
        let n = self.cell.ranks as f64;
        self.sample(Link::Unshaped, Variant::RTP_OUT_OF_PLACE)
            .map_or(f64::NAN, |s| {
                let shard = median(&s.sent_bytes) / (n - 1.0);
                let step = median(&s.compute_s) / n;
                shard * 8.0 / step / 1e9
            })
    }

    /// The slowest shaped link at or above the predicted rate.
    pub(super) fn first_hidden_link(&self) -> Option<Link> {
        let predicted = self.predicted_gbit();
        self.links
            .iter()
            .copied()
            .find(|l| l.gbit().is_some_and(|g| g >= predicted))
    }

    /// The rate (Gbit/s) at which RTP's step time comes within [`FLAT`] of its unshaped time,
    /// interpolated (log-log) between the ladder's links; the slowest link where already
    /// there, `NaN` where no shaped link gets there.
    pub(super) fn measured_crossover_gbit(&self, measured_rate: &dyn Fn(Link) -> f64) -> f64 {
        let target = FLAT * self.step(Link::Unshaped, Variant::RTP_OUT_OF_PLACE);
        let shaped: Vec<(f64, f64)> = self
            .links
            .iter()
            .map(|&l| (measured_rate(l), self.step(l, Variant::RTP_OUT_OF_PLACE)))
            .collect();
        let Some(i) = shaped.iter().position(|&(_, t)| t <= target) else {
            return f64::NAN;
        };
        if i == 0 {
            return shaped[0].0;
        }
        let ((r0, t0), (r1, t1)) = (shaped[i - 1], shaped[i]);
        let f = (target.ln() - t0.ln()) / (t1.ln() - t0.ln());
        (r0.ln() + f * (r1.ln() - r0.ln())).exp()
    }
}

/// Everything the shaped-network report measured (read by its other steps only).
pub struct Measured {
    /// Every link of any cell, and the unshaped one, slowest first.
    pub(super) all_links: Vec<Link>,
    /// Each link's probed rate, Gbit/s.
    pub(super) rates: BTreeMap<Link, f64>,
    /// Each cell's results.
    pub(super) cells: Vec<CellResults>,
}

impl Measured {
    /// The probed rate of `link`, Gbit/s.
    pub(super) fn rate(&self, link: Link) -> f64 {
        self.rates.get(&link).copied().unwrap_or(f64::NAN)
    }
}

/// The job of `variant` on `config` with the report's warm-up and timed steps, its result
/// written to `out`.
pub(super) fn net_job(
    cfg: &NetReportConfig,
    config: &crate::mpi_report::Config,
    variant: Variant,
    out: std::path::PathBuf,
) -> Job {
    Job {
        variant,
        model: config.model.clone(),
        batch_per_rank: config.batch_per_rank,
        warmup: cfg.warmup,
        steps: cfg.steps,
        out,
        mpi_progress: MpiProgress::Auto,
        timeline: None,
        activation_checkpointing: ActivationCheckpointing::None,
        backend: InnerBackend::Ndarray,
        threads: None,
        fused_activations: true,
    }
}

/// Probes every link, then runs every cell's jobs on each of its links and the unshaped one;
/// `exe` is the `scaling-report` binary, which the cluster's mpirun starts as the workers.
pub(super) fn measure(
    cfg: &NetReportConfig,
    exe: &Path,
    log: &dyn Fn(&str),
) -> Result<Measured, Failure> {
    let scratch = cfg.out.join("jobs");
    std::fs::create_dir_all(&scratch)?;
    let mut all_links: Vec<Link> = cfg.cells.iter().flat_map(|c| c.links.clone()).collect();
    all_links.push(Link::Unshaped);
    all_links.sort();
    all_links.dedup();
    let mut rates = BTreeMap::new();
    for &link in &all_links {
        let gbit = probe_link(cfg, exe, link, &scratch)?;
        log(&format!(
            "link {:>10}: the probe moved {gbit:.3} Gbit/s",
            link.label()
        ));
        rates.insert(link, gbit);
    }

    let mut measured = Vec::new();
    for cell in &cfg.cells {
        let mut links = cell.links.clone();
        links.push(Link::Unshaped);
        let mut samples: BTreeMap<(Link, &'static str), Sample> = BTreeMap::new();
        for &link in &links {
            for repeat in 0..cfg.repeats {
                let mut order = STRATEGIES;
                order.rotate_left(repeat % STRATEGIES.len());
                for variant in order {
                    let job = net_job(cfg, &cell.config, variant, scratch.join("net-job.json"));
                    let what = format!(
                        "{} on config {} over {} host(s) at {}",
                        variant.name(),
                        cell.config.name.to_uppercase(),
                        cell.ranks,
                        link.label()
                    );
                    let cmd = worker_command(cluster(cfg, cell.ranks, link), exe, &job);
                    let r = job_output(cmd, &job, &what, false)?.expect("failures are errors");
                    let s = samples.entry((link, variant.name())).or_default();
                    s.add(&r);
                    log(&format!(
                        "{what}: step {:>8.1} ms, {} sent per rank per step{}",
                        s.step_ms.last().copied().unwrap_or(f64::NAN),
                        burn_rtp::human_bytes(*s.sent_bytes.last().unwrap_or(&0.0) as u64),
                        s.hidden
                            .last()
                            .filter(|_| variant == Variant::RTP_OUT_OF_PLACE)
                            .map_or(String::new(), |h| format!(", {:.2} hidden", h))
                    ));
                }
            }
        }
        measured.push(CellResults {
            cell: cell.clone(),
            links: cell.links.clone(),
            samples,
        });
    }
    Ok(Measured {
        all_links,
        rates,
        cells: measured,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_algorithm_counts_two_thirds_for_ddp() {
        let ddp = algorithm_bytes(Variant::DDP, 1000, 4);
        let rtp = algorithm_bytes(Variant::RTP_OUT_OF_PLACE, 1000, 4);
        assert_eq!(ddp, 2.0 * 0.75 * 4000.0);
        assert_eq!(rtp / ddp, 1.5);
    }
}
