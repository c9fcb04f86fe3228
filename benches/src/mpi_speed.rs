//! Our compute against PyTorch's on the same cores, under MPI: one process with one thread
//! each side (config A and B), and config A at N = 4 processes alone and beside a competing
//! load, with each process's minor page faults per step. Added to the MPI report by
//! `scaling-report --transport mpi --pytorch PYTHON --speed`.

use crate::mpi_report::{run_job, run_peer, Job, JobResult, MpiReportConfig, Runner};
use crate::runner::add_section;
use crate::{median, InnerBackend, Variant};
use burn_rtp::ActivationCheckpointing;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::process::{Child, Command};

/// Heading of the report section this module writes.
pub const HEADING: &str = "## Speed against PyTorch: one thread, and N = 4 alone and loaded";

/// The key of these figures in `report.json`.
pub const KEY: &str = "mpi_speed_against_pytorch";

/// Processes of the N = 4 cells.
const RANKS: usize = 4;

/// One cell: who runs, on which config, at how many processes, whether beside the load.
#[derive(Debug, Clone, Copy)]
struct Cell {
    runner: Runner,
    config: &'static str,
    ranks: usize,
    loaded: bool,
    /// Whether GELU runs burn-rtp-kernels' one-pass steps (ours only).
    fused_gelu: bool,
}

impl Cell {
    /// Its name in tables and scratch files.
    fn name(&self) -> String {
        format!(
            "{}-{}-n{}{}{}",
            self.runner.name(),
            self.config,
            self.ranks,
            if self.loaded { "-loaded" } else { "" },
            if self.fused_gelu { "" } else { "-burn-gelu" }
        )
    }
}

/// A competing load: one process spinning on a core for as long as it lives (the "second
/// job on the other core" of a shared machine).
struct Load(Child);

impl Load {
    fn start() -> Result<Self, String> {
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .map(Load)
            .map_err(|e| format!("cannot start the competing load: {e}"))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The cells of the section, in their first order (rounds rotate it).
fn cells() -> Vec<Cell> {
    let mut cells = Vec::new();
    for config in ["a", "b"] {
        for runner in [Runner::Ours(Variant::DDP), Runner::PyTorch("single")] {
            cells.push(Cell {
                runner,
                config,
                ranks: 1,
                loaded: false,
                fused_gelu: true,
            });
        }
    }
    // What the one-pass GELU buys: ours with Burn's GELU ops instead.
    cells.push(Cell {
        runner: Runner::Ours(Variant::DDP),
        config: "a",
        ranks: 1,
        loaded: false,
        fused_gelu: false,
    });
    for loaded in [false, true] {
        for runner in [
            Runner::Ours(Variant::RTP_OUT_OF_PLACE),
            Runner::Ours(Variant::DDP),
            Runner::PyTorch("ddp"),
        ] {
            cells.push(Cell {
                runner,
                config: "a",
                ranks: RANKS,
                loaded,
                fused_gelu: true,
            });
        }
    }
    cells
}

/// Runs `repeats` rounds of every cell (the order rotating each round) with the MPI report's
/// settings `cfg` and the PyTorch peer run by `python`; `exe` is the `scaling-report` binary
/// that `mpirun` starts as our workers.
pub fn measure(
    cfg: &MpiReportConfig,
    exe: &Path,
    python: &Path,
    repeats: usize,
    log: &dyn Fn(&str),
) -> Result<Value, Box<dyn std::error::Error>> {
    let scratch = cfg.out.join("jobs");
    std::fs::create_dir_all(&scratch)?;
    let cells = cells();
    let mut steps: Vec<Vec<f64>> = vec![Vec::new(); cells.len()];
    let mut faults: Vec<Vec<f64>> = vec![Vec::new(); cells.len()];
    for round in 0..repeats {
        for k in 0..cells.len() {
            let i = (round + k) % cells.len();
            let cell = cells[i];
            let config = cfg
                .configs
                .iter()
                .find(|c| c.name == cell.config)
                .ok_or_else(|| {
                    format!("the MPI report's settings have no config {}", cell.config)
                })?;
            let job = Job {
                variant: match cell.runner {
                    Runner::Ours(v) => v,
                    Runner::PyTorch(_) => Variant::DDP,
                },
                model: config.model.clone(),
                batch_per_rank: config.batch_per_rank,
                // Two untimed steps: the allocator's heap reaches its size in the first.
                warmup: cfg.warmup.max(2),
                steps: cfg.steps,
                out: scratch.join(format!("speed-{}.json", cell.name())),
                mpi_progress: cfg.mpi_progress,
                timeline: None,
                activation_checkpointing: ActivationCheckpointing::None,
                backend: InnerBackend::Ndarray,
                // One thread each side for the single cells; else the host's rule.
                threads: (cell.ranks == 1).then_some(1),
                fused_activations: cell.fused_gelu,
            };
            let load = if cell.loaded {
                Some(Load::start()?)
            } else {
                None
            };
            let r: JobResult = match cell.runner {
                Runner::PyTorch(strategy) => run_peer(python, strategy, cell.ranks, &job)?,
                Runner::Ours(_) => {
                    run_job(exe, cell.ranks, &job, None, &[])?.ok_or("a job failed")?
                }
            };
            drop(load);
            let step = median(&r.step_s) * 1e3;
            let fault = r.minor_faults_per_step.iter().sum::<f64>()
                / r.minor_faults_per_step.len().max(1) as f64;
            log(&format!(
                "speed {:<26} step {step:>8.1} ms, {fault:>8.0} minor faults per step per process",
                cell.name()
            ));
            steps[i].push(step);
            faults[i].push(fault);
        }
    }
    let find = |runner: Runner, config: &str, ranks: usize, loaded: bool| {
        cells
            .iter()
            .position(|c| {
                c.runner == runner
                    && c.config == config
                    && c.ranks == ranks
                    && c.loaded == loaded
                    && c.fused_gelu
            })
            .expect("a cell of the section")
    };
    let step = |runner, config, ranks, loaded| median(&steps[find(runner, config, ranks, loaded)]);
    let fault =
        |runner, config, ranks, loaded| median(&faults[find(runner, config, ranks, loaded)]);
    let (rtp, ddp) = (
        Runner::Ours(Variant::RTP_OUT_OF_PLACE),
        Runner::Ours(Variant::DDP),
    );
    let (torch_single, torch_ddp) = (Runner::PyTorch("single"), Runner::PyTorch("ddp"));
    let mut out = Map::new();
    for config in ["a", "b"] {
        out.insert(
            format!("single_step_over_pytorch_{config}"),
            json!(step(ddp, config, 1, false) / step(torch_single, config, 1, false)),
        );
    }
    let burn_gelu = cells
        .iter()
        .position(|c| !c.fused_gelu)
        .expect("the unfused cell");
    out.insert(
        "single_burn_gelu_over_fused_step_a".into(),
        json!(median(&steps[burn_gelu]) / step(ddp, "a", 1, false)),
    );
    out.insert(
        "speed_rtp_over_pytorch_ddp_step_a_n4".into(),
        json!(step(rtp, "a", RANKS, false) / step(torch_ddp, "a", RANKS, false)),
    );
    out.insert(
        "speed_ddp_over_pytorch_ddp_step_a_n4".into(),
        json!(step(ddp, "a", RANKS, false) / step(torch_ddp, "a", RANKS, false)),
    );
    let growth = |runner| step(runner, "a", RANKS, true) / step(runner, "a", RANKS, false);
    out.insert("mpi_loaded_growth_rtp_a_n4".into(), json!(growth(rtp)));
    out.insert(
        "mpi_loaded_growth_pytorch_ddp_a_n4".into(),
        json!(growth(torch_ddp)),
    );
    out.insert(
        "mpi_loaded_growth_ours_over_pytorch_a_n4".into(),
        json!(growth(rtp) / growth(torch_ddp)),
    );
    for (name, runner) in [("rtp", rtp), ("ddp", ddp), ("pytorch_ddp", torch_ddp)] {
        out.insert(
            format!("mpi_faults_per_step_{name}_a_n4"),
            json!(fault(runner, "a", RANKS, false)),
        );
    }
    for (name, runner) in [("ours", ddp), ("pytorch", torch_single)] {
        out.insert(
            format!("single_faults_per_step_{name}_a"),
            json!(fault(runner, "a", 1, false)),
        );
    }
    let rows: Vec<Value> = cells
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let spread = |v: &[f64]| {
                json!({
                    "median": median(v),
                    "min": v.iter().copied().fold(f64::INFINITY, f64::min),
                    "max": v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                })
            };
            json!({
                "runner": c.runner.name(), "config": c.config, "ranks": c.ranks,
                "loaded": c.loaded, "fused_gelu": c.fused_gelu, "step_ms": spread(&steps[i]),
                "minor_faults_per_step_per_process": spread(&faults[i]),
            })
        })
        .collect();
    out.insert("samples".into(), json!(repeats));
    out.insert("steps_per_sample".into(), json!(cfg.steps));
    out.insert("backend".into(), json!(InnerBackend::Ndarray.name()));
    out.insert("cells".into(), Value::Array(rows));
    Ok(Value::Object(out))
}

/// The report section for `v` (what [`measure`] returned).
pub fn markdown(v: &Value) -> String {
    let mut text = format!(
        "\n{HEADING}\n\n{} jobs per cell of {} timed steps, every cell alternating; ours on \
         {}. The single cells run one process with one compute thread each side (ours: DDP at \
         N = 1, which communicates nothing; PyTorch: the model unwrapped). The loaded cells \
         run beside one process spinning on a core. Faults are each process's minor page \
         faults per timed step (`/proc/self/stat`), the mean over its processes. On a 2-core \
         machine the N = 4 cells time-share the cores.\n\n\
         | runner | config | processes | load | GELU | step (ms) | minor faults per step |\n\
         |---|---|---|---|---|---|---|\n",
        v["samples"],
        v["steps_per_sample"],
        v["backend"].as_str().unwrap_or("")
    );
    for row in v["cells"].as_array().into_iter().flatten() {
        let f = |k: &str, s: &str| row[k][s].as_f64().unwrap_or(f64::NAN);
        text += &format!(
            "| {} | {} | {} | {} | {} | {:.1} ({:.1}-{:.1}) | {:.0} ({:.0}-{:.0}) |\n",
            row["runner"].as_str().unwrap_or(""),
            row["config"].as_str().unwrap_or("").to_uppercase(),
            row["ranks"],
            if row["loaded"].as_bool() == Some(true) {
                "loaded"
            } else {
                "alone"
            },
            match (row["runner"].as_str(), row["fused_gelu"].as_bool()) {
                (Some(r), _) if r.starts_with("pytorch") => "PyTorch's",
                (_, Some(false)) => "Burn's ops",
                _ => "one pass",
            },
            f("step_ms", "median"),
            f("step_ms", "min"),
            f("step_ms", "max"),
            f("minor_faults_per_step_per_process", "median"),
            f("minor_faults_per_step_per_process", "min"),
            f("minor_faults_per_step_per_process", "max"),
        );
    }
    let r = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    text += &format!(
        "\nOurs / PyTorch, step time: one thread `single_step_over_pytorch_a` **{:.2}**, \
         `single_step_over_pytorch_b` **{:.2}**; at N = 4 on A, RTP / PyTorch DDP \
         `speed_rtp_over_pytorch_ddp_step_a_n4` **{:.2}** and DDP / PyTorch DDP \
         `speed_ddp_over_pytorch_ddp_step_a_n4` **{:.2}**. Growth of the step beside the \
         load, ours (RTP) over PyTorch DDP's: `mpi_loaded_growth_ours_over_pytorch_a_n4` \
         **{:.2}** ({:.2} against {:.2}). Our single step with Burn's GELU ops over the \
         one-pass GELU: `single_burn_gelu_over_fused_step_a` **{:.2}**.\n",
        r("single_step_over_pytorch_a"),
        r("single_step_over_pytorch_b"),
        r("speed_rtp_over_pytorch_ddp_step_a_n4"),
        r("speed_ddp_over_pytorch_ddp_step_a_n4"),
        r("mpi_loaded_growth_ours_over_pytorch_a_n4"),
        r("mpi_loaded_growth_rtp_a_n4"),
        r("mpi_loaded_growth_pytorch_ddp_a_n4"),
        r("single_burn_gelu_over_fused_step_a"),
    );
    text
}

/// Measures and adds the section to the MPI report in `cfg.out`; returns a one-line summary.
pub fn add_to_report(
    cfg: &MpiReportConfig,
    exe: &Path,
    python: &Path,
    repeats: usize,
    log: &dyn Fn(&str),
) -> Result<String, Box<dyn std::error::Error>> {
    let v = measure(cfg, exe, python, repeats, log)?;
    add_section(&cfg.out, HEADING, &markdown(&v), KEY, &v)?;
    let r = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Ok(format!(
        "ours / PyTorch, one thread: A {:.2}, B {:.2}; loaded growth ours / PyTorch {:.2}",
        r("single_step_over_pytorch_a"),
        r("single_step_over_pytorch_b"),
        r("mpi_loaded_growth_ours_over_pytorch_a_n4"),
    ))
}
