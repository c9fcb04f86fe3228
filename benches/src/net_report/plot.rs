//! The shaped-network report's plot: step time against the probed link rate.

use super::measure::Measured;
use super::{Link, NetReportConfig, STRATEGIES};
use crate::runner::Failure;

/// Step time against the probed link rate (log scale), one line per strategy and cell.
pub(super) fn plot(cfg: &NetReportConfig, all: &Measured) -> Result<(), Failure> {
    let (measured, rate) = (&all.cells, &|l: Link| all.rate(l));
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
