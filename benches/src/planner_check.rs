//! The memory planner against measurement: over a grid of GPT shapes and world sizes, the
//! planner's prediction (probed at N = 1 only) beside the ledger's peak of the same run.

use crate::{Case, Driver, Variant};
use burn_rtp::{human_bytes, ActivationCheckpointing, PlanConfig};
use burn_rtp_gpt::GptConfig;
use serde::Serialize;
use std::path::Path;

/// One grid point: a model, a world size and the sequences per rank.
#[derive(Debug, Clone)]
pub struct PlanPoint {
    /// The model.
    pub model: GptConfig,
    /// Ranks.
    pub ranks: usize,
    /// Sequences per rank.
    pub batch_per_rank: usize,
}

impl PlanPoint {
    fn new(d_model: usize, layers: usize, seq: usize, ranks: usize) -> Self {
        Self {
            model: GptConfig::new(seq, d_model, layers, 4),
            ranks,
            batch_per_rank: 4,
        }
    }
}

/// The full report's grid: widths 64–768, 1–6 blocks, contexts 16–128, N = 2, 3, 4, 8.
pub fn full_grid() -> Vec<PlanPoint> {
    vec![
        PlanPoint::new(64, 1, 16, 2),
        PlanPoint::new(96, 2, 32, 3),
        PlanPoint::new(128, 2, 64, 4),
        PlanPoint::new(192, 3, 32, 8),
        PlanPoint::new(256, 4, 64, 2),
        PlanPoint::new(256, 2, 128, 3),
        PlanPoint::new(384, 3, 16, 4),
        PlanPoint::new(384, 4, 64, 8),
        PlanPoint::new(512, 2, 32, 2),
        PlanPoint::new(512, 6, 16, 4),
        PlanPoint::new(640, 1, 64, 3),
        PlanPoint::new(768, 2, 32, 8),
    ]
}

/// The MPI report's grid: models whose state and activations are large next to a process's
/// own footprint, at N = 2, 3 and 4, where the planner meets each process's resident set.
pub fn rss_grid() -> Vec<PlanPoint> {
    vec![
        PlanPoint::new(256, 4, 64, 2),
        PlanPoint::new(512, 2, 32, 3),
        PlanPoint::new(768, 2, 32, 4),
    ]
}

/// A seconds-long grid for tests.
pub fn tiny_grid() -> Vec<PlanPoint> {
    vec![PlanPoint::new(32, 1, 8, 2), PlanPoint::new(48, 2, 8, 3)]
}

/// One strategy at one grid point: predicted and measured peak of rank 0.
#[derive(Debug, Clone, Serialize)]
pub struct PlanRow {
    /// Model width.
    pub d_model: usize,
    /// Blocks.
    pub layers: usize,
    /// Context.
    pub seq: usize,
    /// Ranks.
    pub ranks: usize,
    /// Strategy (benchmark name).
    pub strategy: &'static str,
    /// Predicted model state (bytes).
    pub predicted_model_state: u64,
    /// The ledger's model state with parameters, gradients and Adam's moments alive.
    pub measured_model_state: u64,
    /// Predicted peak (bytes).
    pub predicted_total: u64,
    /// The ledger's peak of the sum (bytes).
    pub measured_total: u64,
    /// `(predicted - measured) / measured`.
    pub rel_error: f64,
    /// `none` or `balanced`: whether the run (and its prediction) recomputed activations.
    pub activation_checkpointing: String,
}

/// Predicts and measures every planned strategy at every grid point, with activation
/// checkpointing as `checkpointing` says.
pub fn run(
    grid: &[PlanPoint],
    checkpointing: ActivationCheckpointing,
    log: &dyn Fn(&str),
) -> Result<Vec<PlanRow>, Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    for p in grid {
        let b = p.batch_per_rank;
        // The variants measured rotate their weights.
        let config = PlanConfig::default()
            .with_batch(b)
            .with_routing(burn_rtp::Routing::Weights);
        let planner = burn_rtp_gpt::plan::probe_gpt::<burn::backend::NdArray>(&p.model, config)?;
        for (strategy, rotation) in burn_rtp::plan::PLANNED {
            let v = Variant::of(strategy, rotation);
            let predicted = planner.predict_with(checkpointing, strategy, rotation, p.ranks, b);
            let mut d = Driver::start(Case {
                variant: v,
                ranks: p.ranks,
                model: p.model.clone(),
                batch: b * p.ranks,
                memory_cap: None,
                shard_threshold: None,
                activation_checkpointing: checkpointing,
            })?;
            // Three steps: the peak counts from the model's construction, and FSDP prefetches
            // from the third on, once the second has recorded the order of its gathers.
            d.steps(3)?;
            let measured = d.peaks()?[0];
            let state = d.model_state_with_gradients()?;
            let rel_error =
                (predicted.total as f64 - measured.total as f64) / measured.total.max(1) as f64;
            log(&format!(
                "planner: d_model {} x {} layers, context {}, N = {}, {} ({checkpointing} checkpointing): predicted {}, ledger {} ({:+.1}%)",
                p.model.d_model,
                p.model.layers,
                p.model.seq,
                p.ranks,
                v.name(),
                human_bytes(predicted.total),
                human_bytes(measured.total),
                rel_error * 100.0
            ));
            rows.push(PlanRow {
                d_model: p.model.d_model,
                layers: p.model.layers,
                seq: p.model.seq,
                ranks: p.ranks,
                strategy: v.name(),
                predicted_model_state: predicted.model_state,
                measured_model_state: state,
                predicted_total: predicted.total,
                measured_total: measured.total,
                rel_error,
                activation_checkpointing: checkpointing.to_string(),
            });
        }
    }
    Ok(rows)
}

/// The largest `|relative error|` of the predicted peak.
pub fn max_rel_error(rows: &[PlanRow]) -> f64 {
    rows.iter().map(|r| r.rel_error.abs()).fold(0.0, f64::max)
}

/// The report's section on the planner.
pub fn markdown(rows: &[PlanRow]) -> String {
    let exact = rows
        .iter()
        .filter(|r| r.predicted_model_state == r.measured_model_state)
        .count();
    let mut md = format!(
        "\n## Memory planner: predicted against measured peak (rank 0)\n\nThe planner probes each model on one rank (N = 1, at 4 sequences and at 2) and predicts every strategy at the grid's N without running there; each prediction stands beside the ledger's peak of a three-step run at that N (FSDP prefetches from the third step), 4 sequences per rank. Model state (parameters, gradients, Adam's moments) is predicted exactly at {exact} of {} points. Largest |error| of the peak: {:.1}%.\n\n| d_model | layers | context | N | strategy | predicted model state | measured | predicted peak | measured peak | error |\n|---|---|---|---|---|---|---|---|---|---|\n",
        rows.len(),
        max_rel_error(rows) * 100.0
    );
    for r in rows {
        md += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:+.1}% |\n",
            r.d_model,
            r.layers,
            r.seq,
            r.ranks,
            r.strategy,
            human_bytes(r.predicted_model_state),
            human_bytes(r.measured_model_state),
            human_bytes(r.predicted_total),
            human_bytes(r.measured_total),
            r.rel_error * 100.0
        );
    }
    md
}

/// Predicted against measured peak, one point per row, with the line of equality.
pub fn plot(path: &Path, rows: &[PlanRow]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let max = rows
        .iter()
        .map(|r| mib(r.predicted_total).max(mib(r.measured_total)))
        .fold(0.0, f64::max)
        * 1.1
        + 1e-9;
    let root = SVGBackend::new(path, (640, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Memory planner: predicted vs ledger peak per rank",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max, 0.0..max)?;
    chart
        .configure_mesh()
        .x_desc("measured peak (MiB)")
        .y_desc("predicted peak (MiB)")
        .draw()?;
    chart.draw_series(LineSeries::new(
        vec![(0.0, 0.0), (max, max)],
        BLACK.mix(0.4),
    ))?;
    let colors = [
        ("ddp", RGBColor(31, 119, 180)),
        ("fsdp", RGBColor(255, 127, 14)),
        ("rtp-oop", RGBColor(44, 160, 44)),
        ("rtp-ip", RGBColor(214, 39, 40)),
    ];
    for (name, color) in colors {
        chart
            .draw_series(rows.iter().filter(|r| r.strategy == name).map(|r| {
                Circle::new(
                    (mib(r.measured_total), mib(r.predicted_total)),
                    4,
                    color.filled(),
                )
            }))?
            .label(name)
            .legend(move |(x, y)| Circle::new((x + 8, y), 4, color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
