//! One runner for the scaling reports. The in-process report, the MPI report and the
//! shaped-network report each take their measurements, make headline figures and details of
//! them, render markdown and draw plots; [`run`] drives those steps the same way for all three,
//! so `report.json` and `report.md` are written, and the figures checked, in one place.
//!
//! Sections measured after a report's run (Burn's DDP, wgpu, the inner backends, ...) are added
//! to its files with [`add_section`] and [`add_figures`].

mod sections;

pub use sections::{add_figures, add_section, with_last_key};

use serde_json::{Map, Value};
use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What a report's steps fail with.
pub type Failure = Box<dyn Error>;

/// A report: the steps every scaling report has, which [`run`] drives in order.
pub trait Report {
    /// Everything one run measured, which the report's files are made from.
    type Measured;

    /// The folder the report writes to.
    fn out(&self) -> &Path;

    /// Takes every measurement, saying what it does on `log`.
    fn measure(&self, log: &dyn Fn(&str)) -> Result<Self::Measured, Failure>;

    /// The headline figures: top-level keys of `report.json`, each named in
    /// [`crate::figures`].
    fn headline(&self, measured: &Self::Measured) -> Map<String, Value>;

    /// The rest of `report.json`: the tables behind the figures and the machine they ran on.
    fn details(&self, measured: &Self::Measured) -> Result<Map<String, Value>, Failure>;

    /// `report.md`, from the measurements and the finished `report.json`.
    fn markdown(&self, measured: &Self::Measured, report: &Value) -> String;

    /// Draws the SVG plots into [`Report::out`] and returns their file names.
    fn plots(&self, measured: &Self::Measured) -> Result<Vec<&'static str>, Failure>;

    /// Checks that `report` holds every figure this run must give, as a finite number.
    fn check_keys(&self, report: &Value) -> Result<(), String>;
}

/// What [`run`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// The report as `report.json` holds it.
    pub report: Value,
    /// The plots' file names.
    pub plots: Vec<&'static str>,
}

/// Measures `report` and writes its `report.json`, `report.md` and plots; a report missing a
/// figure is an error, after its files are written (so that what it did measure can be read).
pub fn run<R: Report>(report: &R, log: &dyn Fn(&str)) -> Result<Written, Failure> {
    let out = report.out();
    std::fs::create_dir_all(out)?;
    let measured = report.measure(log)?;
    let mut json = report.headline(&measured);
    json.extend(report.details(&measured)?);
    let json = Value::Object(json);
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::write(out.join("report.md"), report.markdown(&measured, &json))?;
    let plots = report.plots(&measured)?;
    report
        .check_keys(&json)
        .map_err(|e| format!("incomplete report: {e}"))?;
    Ok(Written {
        report: json,
        plots,
    })
}

/// A log that prints each line to stderr with the seconds since `started`, so that a long
/// report shows where its time went.
pub fn stamped_log(started: Instant) -> impl Fn(&str) {
    move |msg: &str| eprintln!("[{:>6.1} s] {msg}", started.elapsed().as_secs_f64())
}

/// Where `scaling-report` writes by default.
pub fn default_out() -> PathBuf {
    Path::new("runs").join("scaling")
}
