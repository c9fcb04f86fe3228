//! `scaling-report --transport mpi --net`: configs A and B on a cluster of network namespaces
//! (`benches/net/cluster.sh`), one rank per host, every host's link shaped to a ladder of
//! rates. Each cell alternates DDP, FSDP and RTP jobs over Open MPI's TCP transport and keeps
//! their step times, the share of RTP's wire time hidden under its rotation compute, and the
//! bytes each rank's transport sent per step, against the algorithms' counts: 2(N−1)/N of the
//! parameter bytes for DDP's all-reduce, 3(N−1)/N for FSDP and RTP. A probe measures the rate
//! each link really carries, since the veth path costs CPU here.

use crate::mpi_report::{job_output, worker_command, Config, Job, JobResult};
use crate::{median, InnerBackend, Variant};
use burn_rtp::{ActivationCheckpointing, MpiProgress};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

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
    fn tc(self) -> String {
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
    fn gbit(self) -> Option<f64> {
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
}

/// The strategies, in their first order.
const STRATEGIES: [Variant; 3] = [Variant::DDP, Variant::FSDP, Variant::RTP_OUT_OF_PLACE];

/// How far above its unshaped step time RTP may run and count as no longer rate-bound.
const FLAT: f64 = 1.10;

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

/// A link probe: rank 0 sends `bytes` to rank 1 through the MPI transport; rank 1 writes the
/// rate it received them at, in Gbit/s, to `out`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Probe {
    /// Bytes to send, after one warm-up message.
    pub bytes: u64,
    /// Where rank 1 writes the measured rate.
    pub out: PathBuf,
}

/// The message size of a link probe.
#[cfg(feature = "mpi")]
const PROBE_MESSAGE: usize = 16 << 20;

/// Runs `probe` as this process's rank (inside `mpirun -np 2`).
#[cfg(feature = "mpi")]
pub fn probe_worker(probe: &Probe) -> Result<(), String> {
    use burn::tensor::TensorData;
    use burn_rtp::transport::{Header, MpiEndpoint, MpiTransport, Payload, Transport};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let transport = MpiTransport::start(Duration::from_secs(120), MpiProgress::Auto, false, false)
        .map_err(|e| e.to_string())?;
    let ep = MpiEndpoint(Arc::new(transport));
    let t: &dyn Transport<()> = &ep;
    if t.world_size() != 2 {
        return Err(format!(
            "a link probe runs on 2 ranks, not {}",
            t.world_size()
        ));
    }
    let elems = PROBE_MESSAGE / 4;
    let count = (probe.bytes as usize).div_ceil(PROBE_MESSAGE).max(1);
    let header = |part: usize, len: usize| Header {
        seq: 0,
        op: "net-probe".into(),
        part,
        shape: vec![len],
    };
    let fail = |e: burn_rtp::RtpError| e.to_string();
    if t.rank() == 0 {
        let data = Arc::new(TensorData::new(vec![1f32; elems], [elems]));
        let send = |part| {
            t.isend(
                1,
                header(part, elems),
                Payload::Host(data.clone()),
                Vec::new(),
            )
        };
        send(0).map_err(fail)?.wait().map_err(fail)?;
        // Rank 1 is ready: every later byte is timed.
        t.irecv(1, header(1, 1))
            .map_err(fail)?
            .wait()
            .map_err(fail)?;
        let sends = (0..count)
            .map(|k| send(2 + k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        t.flush().map_err(fail)?;
        for s in sends {
            s.wait().map_err(fail)?;
        }
    } else {
        t.irecv(0, header(0, elems))
            .map_err(fail)?
            .wait()
            .map_err(fail)?;
        let ack = Arc::new(TensorData::new(vec![0f32], [1]));
        let ready = t
            .isend(0, header(1, 1), Payload::Host(ack), Vec::new())
            .map_err(fail)?;
        let started = Instant::now();
        for k in 0..count {
            t.irecv(0, header(2 + k, elems))
                .map_err(fail)?
                .wait()
                .map_err(fail)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        ready.wait().map_err(fail)?;
        let gbit = (count * PROBE_MESSAGE) as f64 * 8.0 / seconds / 1e9;
        std::fs::write(&probe.out, json!({ "gbit_per_s": gbit }).to_string())
            .map_err(|e| format!("cannot write {}: {e}", probe.out.display()))?;
    }
    t.mark_exited();
    Ok(())
}

/// `cluster.sh run` with `hosts` hosts of one rank each on `link`.
fn cluster(cfg: &NetReportConfig, hosts: usize, link: Link) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(&cfg.script)
        .arg("run")
        .args(["--hosts", &hosts.to_string(), "--slots", "1"])
        .args(["--rate", &link.tc()])
        .args(["--timeout", &cfg.job_timeout_s.to_string()])
        .arg("--");
    cmd
}

/// The rate `link` carries between two hosts, in Gbit/s, by the probe.
fn probe_link(
    cfg: &NetReportConfig,
    exe: &Path,
    link: Link,
    scratch: &Path,
) -> Result<f64, String> {
    // The unshaped link is probed as if it carried 20 Gbit/s.
    let gbit = link.gbit().unwrap_or(20.0);
    let bytes = ((gbit * 1e9 / 8.0 * cfg.probe_seconds) as u64).clamp(32 << 20, 1 << 30);
    let probe = Probe {
        bytes,
        out: scratch.join("probe.json"),
    };
    let _ = std::fs::remove_file(&probe.out);
    let mut cmd = cluster(cfg, 2, link);
    cmd.arg(exe)
        .arg("--net-probe")
        .arg(serde_json::to_string(&probe).expect("serialisable"));
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {}: {e}", cfg.script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the probe of the {} link failed ({}):\n{}",
            link.label(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = std::fs::read_to_string(&probe.out)
        .map_err(|e| format!("the probe wrote nothing ({}): {e}", probe.out.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    v["gbit_per_s"]
        .as_f64()
        .ok_or_else(|| format!("unreadable probe result {text}"))
}

/// What the jobs of one strategy measured on one link of one cell.
#[derive(Debug, Default, Clone, Serialize)]
struct Sample {
    step_ms: Vec<f64>,
    /// Per job, the ranks' mean share of wire time hidden under rotation compute.
    hidden: Vec<f64>,
    /// Per job, the ranks' mean bytes sent per step.
    sent_bytes: Vec<f64>,
    /// Per job, the ranks' mean rotation compute per step, in seconds.
    compute_s: Vec<f64>,
    params: usize,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

impl Sample {
    fn add(&mut self, r: &JobResult) {
        self.step_ms.push(median(&r.step_s) * 1e3);
        let hidden: Vec<f64> = r.overlap.iter().flatten().copied().collect();
        if !hidden.is_empty() {
            self.hidden.push(mean(&hidden));
        }
        self.sent_bytes.push(mean(&r.sent_bytes_per_step));
        self.compute_s.push(mean(&r.rotation_compute_s_per_step));
        self.params = r.params;
    }
    fn step(&self) -> f64 {
        median(&self.step_ms)
    }
}

/// Bytes each rank sends per step by the algorithm: `factor`·(N−1)/N of the parameter bytes
/// (f32), with factor 2 for DDP's ring all-reduce and 3 for FSDP and RTP (the weights travel
/// in the forward pass, and again with the gradients in the backward pass).
fn algorithm_bytes(variant: Variant, params: usize, ranks: usize) -> f64 {
    let factor = if variant == Variant::DDP { 2.0 } else { 3.0 };
    factor * (ranks - 1) as f64 / ranks as f64 * params as f64 * 4.0
}

/// One cell's results: per link, per strategy.
struct Measured<'a> {
    cell: &'a NetCell,
    links: Vec<Link>,
    samples: BTreeMap<(Link, &'static str), Sample>,
}

impl Measured<'_> {
    fn sample(&self, link: Link, v: Variant) -> Option<&Sample> {
        self.samples.get(&(link, v.name()))
    }
    fn step(&self, link: Link, v: Variant) -> f64 {
        self.sample(link, v).map_or(f64::NAN, Sample::step)
    }

    /// The design's rate (Gbit/s) above which one shard's transfer fits inside one ring
    /// step's compute: a pass over N ranks makes N − 1 transfers beside N compute steps, so
    /// the rate is (W / (N − 1)) / (C / N), with W RTP's bytes sent per rank per step and C its
    /// rotation compute per step, both as the unshaped link measured them.
    fn predicted_gbit(&self) -> f64 {
        let n = self.cell.ranks as f64;
        self.sample(Link::Unshaped, Variant::RTP_OUT_OF_PLACE)
            .map_or(f64::NAN, |s| {
                let shard = median(&s.sent_bytes) / (n - 1.0);
                let step = median(&s.compute_s) / n;
                shard * 8.0 / step / 1e9
            })
    }

    /// The slowest shaped link at or above the predicted rate.
    fn first_hidden_link(&self) -> Option<Link> {
        let predicted = self.predicted_gbit();
        self.links
            .iter()
            .copied()
            .find(|l| l.gbit().is_some_and(|g| g >= predicted))
    }

    /// The rate (Gbit/s) at which RTP's step time comes within [`FLAT`] of its unshaped time,
    /// interpolated (log-log) between the ladder's links; the slowest link where already
    /// there, `NaN` where no shaped link gets there.
    fn measured_crossover_gbit(&self, measured_rate: &dyn Fn(Link) -> f64) -> f64 {
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

/// Runs every cell and writes `report.json`, `report.md` and `net_step_time.svg` to the
/// config's `out`; `exe` is the `scaling-report` binary, which the cluster's mpirun starts in
/// worker mode.
pub fn run(
    cfg: &NetReportConfig,
    exe: &Path,
    log: &dyn Fn(&str),
) -> Result<Value, Box<dyn std::error::Error>> {
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
    let rate = |l: Link| rates.get(&l).copied().unwrap_or(f64::NAN);

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
                    let job = Job {
                        variant,
                        model: cell.config.model.clone(),
                        batch_per_rank: cell.config.batch_per_rank,
                        warmup: cfg.warmup,
                        steps: cfg.steps,
                        out: scratch.join("net-job.json"),
                        mpi_progress: MpiProgress::Auto,
                        timeline: None,
                        activation_checkpointing: ActivationCheckpointing::None,
                        backend: InnerBackend::Ndarray,
                        threads: None,
                        fused_activations: true,
                    };
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
        measured.push(Measured {
            cell,
            links: cell.links.clone(),
            samples,
        });
    }

    let mut report = serde_json::Map::new();
    let mut worst_bytes: f64 = 0.0;
    let mut cells_json = Vec::new();
    for m in &measured {
        let (c, n) = (m.cell.config.name, m.cell.ranks);
        let predicted = m.predicted_gbit();
        let crossover = m.measured_crossover_gbit(&rate);
        let mut rows = Vec::new();
        for &link in m.links.iter().chain([Link::Unshaped].iter()) {
            let mut row = json!({ "link": link.label(), "shaped_gbit_per_s": link.gbit(), "probed_gbit_per_s": rate(link) });
            for v in STRATEGIES {
                let Some(s) = m.sample(link, v) else { continue };
                let count = algorithm_bytes(v, s.params, n);
                let over = median(&s.sent_bytes) / count;
                worst_bytes = worst_bytes.max((over - 1.0).abs());
                row[v.name()] = json!({
                    "step_ms": s.step_ms, "median_step_ms": s.step(),
                    "hidden_fraction": if s.hidden.is_empty() { Value::Null } else { json!(median(&s.hidden)) },
                    "sent_bytes_per_step": median(&s.sent_bytes),
                    "algorithm_bytes_per_step": count,
                    "sent_over_count": over,
                    "rotation_compute_s_per_step": median(&s.compute_s),
                    "params": s.params,
                });
            }
            rows.push(row);
        }
        cells_json.push(json!({
            "config": c, "ranks": n, "model": m.cell.config.model, "batch_per_rank": m.cell.config.batch_per_rank,
            "predicted_crossover_gbit_per_s": predicted,
            "measured_crossover_gbit_per_s": crossover,
            "links": rows,
        }));
        if n != 2 {
            continue;
        }
        let hidden_link = m.first_hidden_link();
        let rtp = Variant::RTP_OUT_OF_PLACE;
        let at = |l: Option<Link>, f: &dyn Fn(Link) -> f64| l.map_or(f64::NAN, f);
        report.insert(
            format!("net_rtp_hidden_fraction_{c}_n2"),
            json!(at(hidden_link, &|l| m
                .sample(l, rtp)
                .map_or(f64::NAN, |s| median(&s.hidden)))),
        );
        report.insert(
            format!("net_rtp_step_over_unshaped_{c}_n2"),
            json!(at(hidden_link, &|l| m.step(l, rtp)
                / m.step(Link::Unshaped, rtp))),
        );
        report.insert(
            format!("net_crossover_measured_over_predicted_{c}_n2"),
            json!(crossover / predicted),
        );
        let slowest = m.links[0];
        report.insert(
            format!("net_rtp_over_ddp_step_slowest_{c}_n2"),
            json!(m.step(slowest, rtp) / m.step(slowest, Variant::DDP)),
        );
        report.insert(
            format!("net_rtp_hidden_link_gbit_{c}_n2"),
            json!(hidden_link.and_then(Link::gbit)),
        );
    }
    report.insert("net_wire_bytes_over_count_max".into(), json!(worst_bytes));
    let mut report = Value::Object(report);
    report["links"] = json!(all_links
        .iter()
        .map(|&l| json!({"link": l.label(), "shaped_gbit_per_s": l.gbit(), "probed_gbit_per_s": rate(l)}))
        .collect::<Vec<_>>());
    report["cells"] = json!(cells_json);
    let cores = std::thread::available_parallelism().map_or(0, |p| p.get());
    report["machine_note"] = json!(format!(
        "hosts are network namespaces of one machine with {cores} cores (host h pinned to cores h, h+H, ..), joined by veth pairs through a bridge; each host's link is shaped by tc tbf in both directions; netem is not in this kernel, so links have a rate but no added latency; a job runs {} warm-up and {} timed steps, {} job(s) per strategy and link, strategies alternating",
        cfg.warmup, cfg.steps, cfg.repeats
    ));
    std::fs::write(
        cfg.out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(
        cfg.out.join("report.md"),
        markdown(&measured, &report, &rate),
    )?;
    plot(cfg, &measured, &rate)?;
    Ok(report)
}

fn markdown(measured: &[Measured], report: &Value, rate: &dyn Fn(Link) -> f64) -> String {
    let mut md = String::from("# burn-rtp over a shaped network\n\n");
    md += &format!(
        "Generated by `scaling-report --transport mpi --net` (`benches/net/cluster.sh`). {}.\n\n",
        report["machine_note"].as_str().unwrap_or_default()
    );
    md += &crate::figures::targets_table(crate::figures::NET, report);
    md += "\nConfig B, where its links allowed a measurement:\n\n";
    md += &crate::figures::targets_table(crate::figures::NET_B, report);
    md += "\nWhy the missed targets miss, and what would settle them: [docs/performance.md](../../../docs/performance.md#over-a-shaped-network).\n";
    md += "\nThe predicted crossover is the rate at which one shard's transfer takes as long as one ring step's compute: (W / (N − 1)) / (C / N), with W RTP's bytes sent per rank per step and C its rotation compute per step (the timeline's compute intervals), both measured on the unshaped link; a pass makes N − 1 transfers beside N compute steps. The measured crossover is the rate (from the probe) at which RTP's step time comes within 10% of its unshaped time, interpolated between links. Wire bytes are what each rank's transport sent per timed step, against 2(N−1)/N (DDP) or 3(N−1)/N (FSDP, RTP) of the parameter bytes.\n\n![step time against link rate](net_step_time.svg)\n\n";
    md += "| link | probed Gbit/s |\n|---|---|\n";
    let mut links: Vec<Link> = measured.iter().flat_map(|m| m.links.clone()).collect();
    links.push(Link::Unshaped);
    links.sort();
    links.dedup();
    for l in links {
        md += &format!("| {} | {:.3} |\n", l.label(), rate(l));
    }
    for m in measured {
        md += &format!(
            "\n## Config {}, N = {} ({} hosts × 1 rank): d_model {}, {} layer(s), context {}, {} sequence(s) per rank\n\nPredicted crossover {:.2} Gbit/s, measured {:.2} Gbit/s.\n\n| link | DDP ms | FSDP ms | RTP ms | RTP / DDP | RTP hidden | bytes / count: DDP, FSDP, RTP |\n|---|---|---|---|---|---|---|\n",
            m.cell.config.name.to_uppercase(),
            m.cell.ranks,
            m.cell.ranks,
            m.cell.config.model.d_model,
            m.cell.config.model.layers,
            m.cell.config.model.seq,
            m.cell.config.batch_per_rank,
            m.predicted_gbit(),
            m.measured_crossover_gbit(rate),
        );
        for &l in m.links.iter().chain([Link::Unshaped].iter()) {
            let over = |v: Variant| {
                m.sample(l, v).map_or(f64::NAN, |s| {
                    median(&s.sent_bytes) / algorithm_bytes(v, s.params, m.cell.ranks)
                })
            };
            let rtp = Variant::RTP_OUT_OF_PLACE;
            md += &format!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.3} | {:.2} | {:.3}, {:.3}, {:.3} |\n",
                l.label(),
                m.step(l, Variant::DDP),
                m.step(l, Variant::FSDP),
                m.step(l, rtp),
                m.step(l, rtp) / m.step(l, Variant::DDP),
                m.sample(l, rtp).map_or(f64::NAN, |s| median(&s.hidden)),
                over(Variant::DDP),
                over(Variant::FSDP),
                over(rtp),
            );
        }
    }
    md
}

/// Step time against the probed link rate (log scale), one line per strategy and cell.
fn plot(
    cfg: &NetReportConfig,
    measured: &[Measured],
    rate: &dyn Fn(Link) -> f64,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let colors = [
        RGBColor(90, 90, 90),
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
    ];
    let path = cfg.out.join("net_step_time.svg");
    let root =
        SVGBackend::new(&path, (980, 420 * measured.len().div_ceil(2) as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((measured.len().div_ceil(2), 2));
    for (m, area) in measured.iter().zip(panels.iter()) {
        let mut links = m.links.clone();
        links.push(Link::Unshaped);
        let xs: Vec<f64> = links.iter().map(|&l| rate(l)).collect();
        let x_lo = xs.iter().copied().fold(f64::INFINITY, f64::min) / 1.5;
        let x_hi = xs.iter().copied().fold(0.0, f64::max) * 1.5;
        let y_hi = STRATEGIES
            .iter()
            .flat_map(|&v| links.iter().map(move |&l| m.step(l, v)))
            .filter(|y| y.is_finite())
            .fold(0.0, f64::max)
            * 1.1
            + 1e-9;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "Config {}, N = {}: step time against link rate",
                    m.cell.config.name.to_uppercase(),
                    m.cell.ranks
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d((x_lo..x_hi).log_scale(), 0.0..y_hi)?;
        chart
            .configure_mesh()
            .x_desc("probed link rate, Gbit/s (rightmost: unshaped)")
            .y_desc("ms per step")
            .draw()?;
        for (i, v) in STRATEGIES.iter().enumerate() {
            let color = colors[i];
            let pts: Vec<(f64, f64)> = links
                .iter()
                .map(|&l| (rate(l), m.step(l, *v)))
                .filter(|p| p.0.is_finite() && p.1.is_finite())
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(v.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
        }
        let predicted = m.predicted_gbit();
        if predicted.is_finite() && predicted > x_lo && predicted < x_hi {
            chart.draw_series(DashedLineSeries::new(
                vec![(predicted, 0.0), (predicted, y_hi)],
                6,
                4,
                BLACK.stroke_width(1),
            ))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Checks that a shaped-network report has every figure of [`crate::figures::NET`].
pub fn check_keys(report: &Value) -> Result<(), String> {
    crate::figures::check_keys(crate::figures::NET, report)
}

/// Checks what a quick run can give: its small models compute too little to hide any link's
/// transfers, so only the measured cells and the wire-byte count are required.
pub fn check_quick(report: &Value) -> Result<(), String> {
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

    #[test]
    fn links_order_slowest_first_and_unshaped_last() {
        let mut l = vec![Link::Unshaped, Link::Mbit(1000), Link::Mbit(200)];
        l.sort();
        assert_eq!(l, vec![Link::Mbit(200), Link::Mbit(1000), Link::Unshaped]);
        assert_eq!(Link::Mbit(500).tc(), "500mbit");
        assert_eq!(Link::Mbit(500).label(), "0.5 Gbit/s");
    }
}
