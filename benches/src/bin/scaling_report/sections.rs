//! Sections measured on their own and added to a report already written: the activation and
//! generation sections, Burn's own DDP, wgpu, inner backends, ours against PyTorch, and
//! weights rotating against activations routed.

use super::{mpi_config, net_config, quick, this_exe, Cli};
use burn_rtp::TransportKind;
use burn_rtp_benches::runner::{self, stamped_log};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

/// What an activation section run returns: its figures, its heading, markdown and details,
/// and the report's table of figures.
type ActivationSection = (
    serde_json::Value,
    &'static str,
    String,
    serde_json::Value,
    &'static [burn_rtp_benches::figures::Figure],
);

/// Measures the activation section alone and adds it, with its figures, to the report in
/// `out`.
pub(super) fn activations_only(
    out: &Path,
    run: impl FnOnce(&dyn Fn(&str)) -> Result<ActivationSection, runner::Failure>,
) -> ExitCode {
    let started = Instant::now();
    let log = stamped_log(started);
    let added = run(&log).and_then(|(figures, heading, md, details, table)| {
        runner::add_section(out, heading, &md, "activation_checkpointing", &details)?;
        runner::add_figures(out, &figures, table)?;
        Ok(figures)
    });
    match added {
        Ok(figures) => {
            println!(
                "added the activation section to {} in {:.0} s: {figures}",
                out.display(),
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: activation section: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Measures the generation section and adds it, with its figure, to the in-process report
/// in `out`.
pub(super) fn decode_only(out: &Path, tiny: bool) -> ExitCode {
    use burn_rtp_benches::decode;
    let settings = if tiny {
        decode::Settings::tiny()
    } else {
        decode::Settings::full()
    };
    let started = Instant::now();
    let log = stamped_log(started);
    let added = decode::run(&settings, &log).and_then(|v| {
        runner::add_section(
            out,
            decode::HEADING,
            &decode::markdown(&settings, &v),
            decode::KEY,
            &v,
        )?;
        let figures = decode::figures(&v);
        runner::add_figures(out, &figures, burn_rtp_benches::figures::IN_PROCESS)?;
        Ok(figures)
    });
    match added {
        Ok(figures) => {
            println!(
                "added the generation section to {} in {:.0} s: {figures}",
                out.display(),
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: generation section: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Adds Burn's own DDP (the peer binary's findings), and ours on its model, to the report in
/// `out`.
pub(super) fn add_burn_ddp(bin: &Path, out: &Path) -> ExitCode {
    let Some(exe) = this_exe("to run our strategies on the peer's model") else {
        return ExitCode::FAILURE;
    };
    section_status(
        "Burn DDP peer",
        burn_rtp_benches::burn_ddp::add_to_report(bin, out, &exe),
    )
}

/// Adds the wgpu figures to the report in `out`.
pub(super) fn add_wgpu(cli: &Cli, out: &Path) -> ExitCode {
    #[cfg(feature = "wgpu")]
    {
        let (repeats, steps) = if quick(cli) { (3, 1) } else { (5, 3) };
        let log = |m: &str| eprintln!("{m}");
        section_status(
            "wgpu, config A at N = 2",
            burn_rtp_benches::wgpu_figures::add_to_report(out, repeats, steps, &log),
        )
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = (cli, out);
        eprintln!("error: --wgpu needs `--features wgpu` (and a Vulkan driver: apt-get install mesa-vulkan-drivers)");
        ExitCode::FAILURE
    }
}

/// Adds ours against PyTorch on the same cores to the MPI report in `--out`.
pub(super) fn add_speed(cli: &Cli) -> ExitCode {
    let log = |m: &str| eprintln!("{m}");
    let (Some(python), TransportKind::Mpi) = (&cli.pytorch, cli.transport) else {
        eprintln!("error: --speed needs --transport mpi and --pytorch PYTHON");
        return ExitCode::FAILURE;
    };
    let Some(exe) = this_exe("to start under mpirun") else {
        return ExitCode::FAILURE;
    };
    let repeats = cli.repeats.unwrap_or(if quick(cli) { 1 } else { 3 });
    section_status(
        "speed against PyTorch",
        burn_rtp_benches::mpi_speed::add_to_report(
            &mpi_config(cli),
            &exe,
            python,
            repeats.max(1),
            &log,
        ),
    )
}

/// Adds the inner backends' figures to the report in `out`: in-process, or with
/// `--transport mpi` each cell as its own `mpirun` job.
pub(super) fn add_backends(cli: &Cli, out: &Path) -> ExitCode {
    let log = |m: &str| eprintln!("{m}");
    if cli.transport == TransportKind::Mpi {
        let Some(exe) = this_exe("to start under mpirun") else {
            return ExitCode::FAILURE;
        };
        let cfg = mpi_config(cli);
        let repeats = cli.repeats.unwrap_or(if quick(cli) { 1 } else { 3 });
        return section_status(
            "inner backends under MPI, config A at N = 4",
            burn_rtp_benches::mpi_backends::add_to_report(&cfg, &exe, repeats.max(1), &log),
        );
    }
    let (repeats, steps) = if quick(cli) { (2, 1) } else { (5, 3) };
    section_status(
        "inner backends, config A",
        burn_rtp_benches::backend_figures::add_to_report(out, repeats, steps, &log),
    )
}

/// Adds weights rotating against activations routed to the MPI report, each cell as its own
/// `mpirun` job.
pub(super) fn add_routing(cli: &Cli) -> ExitCode {
    let log = |m: &str| eprintln!("{m}");
    if cli.transport != TransportKind::Mpi {
        eprintln!("error: --routing measures under MPI: add --transport mpi");
        return ExitCode::FAILURE;
    }
    let Some(exe) = this_exe("to start under mpirun") else {
        return ExitCode::FAILURE;
    };
    let cfg = mpi_config(cli);
    let repeats = cli.repeats.unwrap_or(if quick(cli) { 1 } else { 3 });
    if cli.net {
        let net = net_config(cli, cfg.out);
        return section_status(
            "RTP choosing per pass over the 1 Gbit/s link, config B, N = 2",
            burn_rtp_benches::net_report::routing::add_to_report(&net, &exe, repeats.max(1), &log),
        );
    }
    section_status(
        "weights rotating against activations routed under MPI, N = 4",
        burn_rtp_benches::mpi_routing::add_to_report(&cfg, &exe, repeats.max(1), &log),
    )
}

/// Prints what adding a report section gave (its summary, or its error) as the exit status.
fn section_status(what: &str, added: Result<String, runner::Failure>) -> ExitCode {
    match added {
        Ok(summary) => {
            println!("{what}: {summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {what}: {e}");
            ExitCode::FAILURE
        }
    }
}
