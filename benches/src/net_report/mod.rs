//! `scaling-report --transport mpi --net`: configs A and B on a cluster of network namespaces
//! (`benches/net/cluster.sh`), one rank per host, every host's link shaped to a ladder of
//! rates. Each cell alternates DDP, FSDP and RTP jobs over Open MPI's TCP transport and keeps
//! their step times, the share of RTP's wire time hidden under its rotation compute, and the
//! bytes each rank's transport sent per step, against the algorithms' counts: 2(N−1)/N of the
//! parameter bytes for DDP's all-reduce, 3(N−1)/N for FSDP and RTP. A probe measures the rate
//! each link really carries, since the veth path costs CPU here.

mod headline;
mod markdown;
mod measure;
mod plot;
mod probe;
pub mod routing;

pub use measure::Measured;
#[cfg(feature = "mpi")]
pub use probe::probe_worker;
pub use probe::Probe;

use crate::mpi_report::Config;
use crate::runner::{Failure, Report};
use crate::Variant;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// A host's link: shaped to a rate by `tc tbf` in both directions, or left as veth gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Link {
    /// Shaped to this many Mbit/s.
    Mbit(u64),
    /// Not shaped: as fast as the veth path and the CPU allow.
    Unshaped,
}

impl Link {
    /// The rate as `cluster.sh --rate` takes it.
    pub(super) fn tc(self) -> String {
        match self {
            Link::Mbit(m) => format!("{m}mbit"),
            Link::Unshaped => "none".into(),
        }
    }

    /// The rate in words, as tables show it.
    pub fn label(self) -> String {
        match self {
            Link::Mbit(m) => format!("{} Gbit/s", m as f64 / 1000.0),
            Link::Unshaped => "unshaped".into(),
        }
    }

    /// The shaped rate in Gbit/s (`None` unshaped).
    pub(super) fn gbit(self) -> Option<f64> {
        match self {
            Link::Mbit(m) => Some(m as f64 / 1000.0),
            Link::Unshaped => None,
        }
    }
}

/// One configuration at one world size, over a ladder of links.
#[derive(Debug, Clone)]
pub struct NetCell {
    /// The model and batch.
    pub config: Config,
    /// Hosts, one rank each.
    pub ranks: usize,
    /// The links measured, slowest first; the unshaped link is always measured too.
    pub links: Vec<Link>,
}

/// What the shaped-network section measures.
#[derive(Debug, Clone)]
pub struct NetReportConfig {
    /// Output folder.
    pub out: PathBuf,
    /// `benches/net/cluster.sh`.
    pub script: PathBuf,
    /// The cells.
    pub cells: Vec<NetCell>,
    /// Jobs per strategy, link and cell (strategies alternate between jobs).
    pub repeats: usize,
    /// Untimed steps per job.
    pub warmup: usize,
    /// Timed steps per job.
    pub steps: usize,
    /// Seconds of traffic each link probe sends at the link's rate (at least 32 MiB).
    pub probe_seconds: f64,
    /// A job still running after this many seconds is killed and fails the report.
    pub job_timeout_s: u64,
    /// A quick run: its small models compute too little to hide any link's transfers, so
    /// only the measured cells and the wire-byte count are checked, not every figure.
    pub quick: bool,
}

/// The strategies, in their first order.
pub(super) const STRATEGIES: [Variant; 3] =
    [Variant::DDP, Variant::FSDP, Variant::RTP_OUT_OF_PLACE];

/// How far above its unshaped step time RTP may run and count as no longer rate-bound.
pub(super) const FLAT: f64 = 1.10;

impl NetReportConfig {
    /// Configs A and B at N = 2 and 4; A down to 0.1 Gbit/s, with 3 Gbit/s between 2 and 5
    /// where its crossover lies, B from 1 (its steps move
    /// hundreds of MiB, and its crossover lies near 10 Gbit/s: slower links would take
    /// minutes per job and show only the rate).
    pub fn full(out: PathBuf, script: PathBuf) -> Self {
        let full = MpiReportConfigs::full();
        let a: Vec<Link> = [100, 200, 500, 1000, 2000, 3000, 5000, 10000]
            .map(Link::Mbit)
            .to_vec();
        let b: Vec<Link> = [1000, 2000, 5000, 10000].map(Link::Mbit).to_vec();
        let mut cells = Vec::new();
        for ranks in [2, 4] {
            cells.push(NetCell {
                config: full.a.clone(),
                ranks,
                links: a.clone(),
            });
            cells.push(NetCell {
                config: full.b.clone(),
                ranks,
                links: b.clone(),
            });
        }
        Self {
            out,
            script,
            cells,
            repeats: 2,
            warmup: 1,
            steps: 3,
            probe_seconds: 1.5,
            job_timeout_s: 600,
            quick: false,
        }
    }

    /// Small models at N = 2, two links and the unshaped one, one job each (CI).
    pub fn quick(out: PathBuf, script: PathBuf) -> Self {
        let quick = MpiReportConfigs::quick();
        let links = vec![Link::Mbit(200), Link::Mbit(1000)];
        Self {
            out,
            script,
            cells: vec![
                NetCell {
                    config: quick.a,
                    ranks: 2,
                    links: links.clone(),
                },
                NetCell {
                    config: quick.b,
                    ranks: 2,
                    links,
                },
            ],
            repeats: 1,
            warmup: 1,
            steps: 2,
            probe_seconds: 0.2,
            job_timeout_s: 300,
            quick: true,
        }
    }
}

/// Configs A and B as the MPI report has them.
struct MpiReportConfigs {
    a: Config,
    b: Config,
}

impl MpiReportConfigs {
    fn of(cfg: crate::mpi_report::MpiReportConfig) -> Self {
        let mut configs = cfg.configs.into_iter();
        let a = configs.next().expect("config A");
        let b = configs.next().expect("config B");
        Self { a, b }
    }
    fn full() -> Self {
        Self::of(crate::mpi_report::MpiReportConfig::full(PathBuf::new()))
    }
    fn quick() -> Self {
        Self::of(crate::mpi_report::MpiReportConfig::quick(PathBuf::new()))
    }
}

/// The shaped-network report as [`crate::runner::run`] drives it: its settings, and the
/// binary that the cluster's mpirun starts as the workers (`scaling-report worker ...`).
#[derive(Debug, Clone)]
pub struct NetReport {
    /// What to measure.
    pub cfg: NetReportConfig,
    /// The `scaling-report` binary.
    pub exe: PathBuf,
}

impl Report for NetReport {
    type Measured = measure::Measured;

    fn out(&self) -> &Path {
        &self.cfg.out
    }

    fn measure(&self, log: &dyn Fn(&str)) -> Result<measure::Measured, Failure> {
        measure::measure(&self.cfg, &self.exe, log)
    }

    fn headline(&self, measured: &measure::Measured) -> Map<String, Value> {
        headline::headline(measured)
    }

    fn details(&self, measured: &measure::Measured) -> Result<Map<String, Value>, Failure> {
        Ok(headline::details(&self.cfg, measured))
    }

    fn markdown(&self, measured: &measure::Measured, report: &Value) -> String {
        markdown::markdown(measured, report)
    }

    fn plots(&self, measured: &measure::Measured) -> Result<Vec<&'static str>, Failure> {
        plot::plot(&self.cfg, measured)?;
        Ok(vec!["net_step_time.svg"])
    }

    fn check_keys(&self, report: &Value) -> Result<(), String> {
        if !self.cfg.quick {
            return crate::figures::check_keys(crate::figures::NET, report);
        }
        // What a quick run can give: its small models compute too little to hide any link's
        // transfers, so only the measured cells and the wire-byte count are required.
        let bytes: Vec<_> = crate::figures::NET
            .iter()
            .filter(|f| f.key == "net_wire_bytes_over_count_max")
            .copied()
            .collect();
        crate::figures::check_keys(&bytes, report)?;
        match report["cells"].as_array() {
            Some(cells) if !cells.is_empty() => Ok(()),
            _ => Err("no cells".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_order_slowest_first_and_unshaped_last() {
        let mut l = vec![Link::Unshaped, Link::Mbit(1000), Link::Mbit(200)];
        l.sort();
        assert_eq!(l, vec![Link::Mbit(200), Link::Mbit(1000), Link::Unshaped]);
        assert_eq!(Link::Mbit(500).tc(), "500mbit");
        assert_eq!(Link::Mbit(500).label(), "0.5 Gbit/s");
    }
}
