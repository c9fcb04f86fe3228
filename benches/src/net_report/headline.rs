//! The shaped-network report's `report.json`: its headline figures, each cell's links and
//! strategies, and the machine.

use super::measure::{algorithm_bytes, Measured};
use super::{Link, NetReportConfig, STRATEGIES};
use crate::{median, Variant};
use serde_json::{json, Map, Value};

/// Each cell's rows (one per link, with each strategy's figures) and the largest departure
/// of any strategy's wire bytes from the algorithm's count.
fn cells(measured: &Measured) -> (Vec<Value>, f64) {
    let mut worst_bytes: f64 = 0.0;
    let mut cells_json = Vec::new();
    for m in &measured.cells {
        let (c, n) = (m.cell.config.name, m.cell.ranks);
        let predicted = m.predicted_gbit();
        let crossover = m.measured_crossover_gbit(&|l| measured.rate(l));
        let mut rows = Vec::new();
        for &link in m.links.iter().chain([Link::Unshaped].iter()) {
            let mut row = json!({ "link": link.label(), "shaped_gbit_per_s": link.gbit(), "probed_gbit_per_s": measured.rate(link) });
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
    }
    (cells_json, worst_bytes)
}

/// The headline figures ([`crate::figures::NET`] and [`crate::figures::NET_B`]), from the
/// cells at N = 2.
pub(super) fn headline(measured: &Measured) -> Map<String, Value> {
    let mut report = Map::new();
    for m in &measured.cells {
        let (c, n) = (m.cell.config.name, m.cell.ranks);
        if n != 2 {
            continue;
        }
        let predicted = m.predicted_gbit();
        let crossover = m.measured_crossover_gbit(&|l| measured.rate(l));
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
    report.insert(
        "net_wire_bytes_over_count_max".into(),
        json!(cells(measured).1),
    );
    report
}

/// Each link's probed rate, each cell's rows, and a note on the machine.
pub(super) fn details(cfg: &NetReportConfig, measured: &Measured) -> Map<String, Value> {
    let mut report = Map::new();
    report.insert("links".into(), json!(measured.all_links
        .iter()
        .map(|&l| json!({"link": l.label(), "shaped_gbit_per_s": l.gbit(), "probed_gbit_per_s": measured.rate(l)}))
        .collect::<Vec<_>>()));
    report.insert("cells".into(), json!(cells(measured).0));
    let cores = std::thread::available_parallelism().map_or(0, |p| p.get());
    report.insert("machine_note".into(), json!(format!(
        "hosts are network namespaces of one machine with {cores} cores (host h pinned to cores h, h+H, ..), joined by veth pairs through a bridge; each host's link is shaped by tc tbf in both directions; netem is not in this kernel, so links have a rate but no added latency; a job runs {} warm-up and {} timed steps, {} job(s) per strategy and link, strategies alternating",
        cfg.warmup, cfg.steps, cfg.repeats
    )));
    report
}
