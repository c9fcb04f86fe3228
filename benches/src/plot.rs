//! The two kinds of SVG plot the reports draw: lines against the world size, and bars.

use plotters::prelude::*;
use std::path::Path;

/// What drawing a plot gives.
pub type Res = Result<(), Box<dyn std::error::Error>>;

/// The series' colours, in order: grey first, for the baseline.
const COLORS: [RGBColor; 6] = [
    RGBColor(90, 90, 90),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

/// One line per named series of (ranks, value) points, against the world sizes `ranks`.
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
