//! Runs the user's per-rank program on every rank of an in-process world.

use crate::backend::device::RtpDevice;
use crate::backend::device::{enter_rank, in_process_world};
use crate::comm::transport::Transport;
use crate::config::{RtpConfig, TransportKind};
use crate::error::{RtpError, RtpResult};
use burn::tensor::backend::Backend;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// The error a panic of `rank`'s program stands for: a typed error as raised, or its message.
fn panic_reason(rank: usize, payload: Box<dyn std::any::Any + Send>) -> RtpError {
    if let Some(err) = payload.downcast_ref::<RtpError>() {
        return err.clone();
    }
    let reason = crate::error::panic_message(payload.as_ref())
        .unwrap_or_else(|| "panicked with a non-string payload".to_string());
    RtpError::RankFailed { rank, reason }
}

/// A panic hook, as `std::panic` stores it.
type Hook = dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static;

/// The worlds running in this process, and the hook that was in place before the first.
static HOOK: Mutex<(usize, Option<Arc<Hook>>)> = Mutex::new((0, None));

/// While a world runs, panics carrying a typed RTP error (raised inside backend ops) print
/// as one readable line; every other panic goes to the hook that was in place before. When
/// the last running world ends, that hook is put back.
struct PanicHookGuard;

impl PanicHookGuard {
    fn install() -> Self {
        let mut state = HOOK.lock().unwrap_or_else(|e| e.into_inner());
        // Ours may still be in place, if the last world ended on an unwinding thread.
        if state.0 == 0 && state.1.is_none() && !std::thread::panicking() {
            let previous: Arc<Hook> = Arc::from(std::panic::take_hook());
            state.1 = Some(previous.clone());
            std::panic::set_hook(Box::new(move |info| {
                if let Some(err) = info.payload().downcast_ref::<RtpError>() {
                    let thread = std::thread::current();
                    eprintln!("{}: {err}", thread.name().unwrap_or("rtp"));
                } else {
                    previous(info);
                }
            }));
        }
        state.0 += 1;
        Self
    }
}

impl Drop for PanicHookGuard {
    fn drop(&mut self) {
        let mut state = HOOK.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        // `set_hook` panics on a panicking thread: the hook then stays until the next world
        // ends on a thread that is not unwinding.
        if state.0 == 0 && !std::thread::panicking() {
            if let Some(previous) = state.1.take() {
                drop(std::panic::take_hook());
                std::panic::set_hook(Box::new(move |info| previous(info)));
            }
        }
    }
}

/// Runs `program` on every rank and returns each rank's result in rank order.
///
/// If any rank panics, every other rank stops at its next collective and the error of the
/// rank that failed first is returned.
pub fn launch<B, R, F>(config: RtpConfig, program: F) -> RtpResult<Vec<R>>
where
    B: Backend,
    R: Send,
    F: Fn(RtpDevice<B>) -> R + Send + Sync,
{
    try_launch(config, |device| {
        Ok::<R, std::convert::Infallible>(program(device))
    })
}

/// Like [`launch`], for programs that return a `Result`: an `Err` on one rank stops them all.
pub fn try_launch<B, R, E, F>(config: RtpConfig, program: F) -> RtpResult<Vec<R>>
where
    B: Backend,
    R: Send,
    E: std::fmt::Display,
    F: Fn(RtpDevice<B>) -> Result<R, E> + Send + Sync,
{
    try_launch_on(config, |_| B::Device::default(), program)
}

/// Like [`try_launch`], with the inner device of each rank chosen by `inner_device(rank)`.
///
/// In-process (the default), every rank is a thread of this process and the result holds
/// every rank's value, in rank order. Under `mpirun` (cargo feature `mpi`), this process is
/// one rank: the program runs once, and the result holds this rank's value only.
pub fn try_launch_on<B, R, E, F>(
    config: RtpConfig,
    inner_device: impl Fn(usize) -> B::Device,
    program: F,
) -> RtpResult<Vec<R>>
where
    B: Backend,
    R: Send,
    E: std::fmt::Display,
    F: Fn(RtpDevice<B>) -> Result<R, E> + Send + Sync,
{
    let _hook = PanicHookGuard::install();
    match config.transport_kind() {
        TransportKind::InProcess => launch_in_process(config, inner_device, program),
        TransportKind::Mpi | TransportKind::Nccl => launch_mpi(config, inner_device, program),
    }
}

/// Runs the program of one rank: checks that every rank was started with the same settings,
/// then runs `program`, turning a panic or an `Err` into the rank's [`RtpError`].
fn run_rank<B, R, E, F>(device: RtpDevice<B>, program: &F) -> Result<R, RtpError>
where
    B: Backend,
    R: Send,
    E: std::fmt::Display,
    F: Fn(RtpDevice<B>) -> Result<R, E> + Sync,
{
    let rank = device.rank();
    // The rank's program runs in a pool of its own share of the cores, so the inner
    // backend's parallel kernels never take more than that (see `with_threads_per_rank`).
    let threads = device.config().threads_per_rank_here();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("rtp-rank-{rank}-compute-{i}"))
        .build()
        .map_err(|e| RtpError::RankFailed {
            rank,
            reason: format!("could not start its pool of {threads} compute threads: {e}"),
        })?;
    pool.install(|| {
        // Inside the pool: the program runs on one of its threads, which becomes this rank's.
        let _current = enter_rank(&device);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let rank_ctx = device.clone();
            let result = device
                .agree(&device.config().shared_settings())
                .map(|()| program(device));
            // The program may return while its rank's background worker still runs a
            // collective it started and never waited for (FSDP's prefetch after an evaluation
            // forward). It ends here, before the rank tells its peers it exited, and its
            // failure fails the rank instead of vanishing with the worker.
            if matches!(result, Ok(Ok(_))) {
                rank_ctx.ctx.comm.wait_background();
            }
            result
        }));
        match outcome {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Err(typed)) => Err(typed),
            Ok(Ok(Err(e))) => Err(RtpError::RankFailed {
                rank,
                reason: e.to_string(),
            }),
            Err(payload) => Err(panic_reason(rank, payload)),
        }
    })
}

fn launch_in_process<B, R, E, F>(
    config: RtpConfig,
    inner_device: impl Fn(usize) -> B::Device,
    program: F,
) -> RtpResult<Vec<R>>
where
    B: Backend,
    R: Send,
    E: std::fmt::Display,
    F: Fn(RtpDevice<B>) -> Result<R, E> + Send + Sync,
{
    let (devices, hub) = in_process_world::<B>(&config, inner_device)?;
    let program = &program;
    let outcomes: Vec<Result<R, RtpError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = devices
            .into_iter()
            .map(|device| {
                let endpoint = hub.endpoint(device.rank());
                std::thread::Builder::new()
                    .name(format!("rtp-rank-{}", device.rank()))
                    .spawn_scoped(scope, move || {
                        let outcome = run_rank(device, program);
                        match &outcome {
                            Ok(_) => Transport::mark_exited(&endpoint),
                            Err(e) => Transport::abort(&endpoint, &e.to_string()),
                        }
                        outcome
                    })
                    .expect("spawning a rank thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank threads catch their own panics"))
            .collect()
    });
    if let Some(first) = hub.first_failure() {
        let err = outcomes
            .into_iter()
            .nth(first.rank)
            .and_then(Result::err)
            .unwrap_or(RtpError::RankFailed {
                rank: first.rank,
                reason: first.reason,
            });
        return Err(err);
    }
    outcomes.into_iter().collect()
}

/// This process's rank of an MPI job, checked against the configuration.
fn mpi_rank(config: &RtpConfig) -> RtpResult<crate::config::MpiLaunch> {
    let unavailable = |reason: &str| RtpError::TransportUnavailable {
        transport: config.transport_kind().to_string(),
        reason: reason.into(),
    };
    let launch = crate::config::mpi_launch().ok_or_else(|| {
        unavailable("this process was not started by mpirun (no OMPI_COMM_WORLD_SIZE or PMI_SIZE in its environment)")
    })?;
    if !cfg!(feature = "mpi") {
        return Err(unavailable(
            "burn-rtp was built without MPI: rebuild with `--features mpi` (Debian packages: libopenmpi-dev openmpi-bin libclang-dev)",
        ));
    }
    if launch.size != config.world_size {
        return Err(RtpError::WorldSizeMismatch {
            configured: config.world_size,
            launched: launch.size,
        });
    }
    Ok(launch)
}

/// Runs this process's rank of an MPI job, its tensors moving over MPI or, when the
/// configuration asks for it, over NCCL. On failure every other rank is told who failed and
/// why, and MPI is left unfinalised, so that `mpirun` ends the job once this process exits
/// (with a non-zero status).
#[cfg(feature = "mpi")]
fn launch_mpi<B, R, E, F>(
    config: RtpConfig,
    inner_device: impl Fn(usize) -> B::Device,
    program: F,
) -> RtpResult<Vec<R>>
where
    B: Backend,
    R: Send,
    E: std::fmt::Display,
    F: Fn(RtpDevice<B>) -> Result<R, E> + Send + Sync,
{
    use crate::comm::transport::{MpiEndpoint, MpiTransport};
    let launch = mpi_rank(&config)?;
    let endpoint = MpiEndpoint(std::sync::Arc::new(MpiTransport::start(
        config.peer_timeout,
        config.mpi_progress,
        config.one_malloc_arena,
        config.keep_freed_pages,
    )?));
    let rank = Transport::<B::FloatTensorPrimitive>::rank(&endpoint);
    if rank != launch.rank {
        return Err(RtpError::Transport {
            rank,
            op: "MPI_Init".into(),
            reason: format!(
                "MPI says this is rank {rank}, the launcher's environment says {}",
                launch.rank
            ),
        });
    }
    let inner = inner_device(rank);
    let transport: std::sync::Arc<dyn Transport<B::FloatTensorPrimitive>> =
        match over_nccl::<B>(&config, &endpoint, &inner) {
            Ok(Some(nccl)) => nccl,
            Ok(None) => std::sync::Arc::new(endpoint.clone()),
            Err(e) => {
                Transport::<B::FloatTensorPrimitive>::abort(&endpoint, &e.to_string());
                return Err(e);
            }
        };
    let device = match crate::backend::device::register_device::<B>(
        rank,
        0,
        inner,
        transport.clone(),
        config,
    ) {
        Ok(device) => device,
        Err(e) => {
            transport.abort(&e.to_string());
            return Err(e);
        }
    };
    let outcome = run_rank(device, &program);
    match &outcome {
        Ok(_) => transport.mark_exited(),
        Err(e) => transport.abort(&e.to_string()),
    }
    outcome.map(|value| vec![value])
}

/// The NCCL transport over `control`, where the configuration asks for it.
#[cfg(feature = "nccl")]
fn over_nccl<B: Backend>(
    config: &RtpConfig,
    control: &crate::comm::transport::MpiEndpoint,
    inner: &B::Device,
) -> RtpResult<Option<std::sync::Arc<dyn Transport<B::FloatTensorPrimitive>>>> {
    use crate::comm::transport::{NcclEndpoint, NcclTransport};
    if config.transport_kind() != TransportKind::Nccl {
        return Ok(None);
    }
    let nccl = NcclTransport::start::<B::FloatTensorPrimitive>(
        control.clone(),
        inner,
        config.peer_timeout,
    )?;
    Ok(Some(std::sync::Arc::new(NcclEndpoint(
        std::sync::Arc::new(nccl),
    ))))
}

/// Without NCCL built in, asking for it is an error that says how to rebuild.
#[cfg(all(feature = "mpi", not(feature = "nccl")))]
fn over_nccl<B: Backend>(
    config: &RtpConfig,
    _control: &crate::comm::transport::MpiEndpoint,
    _inner: &B::Device,
) -> RtpResult<Option<std::sync::Arc<dyn Transport<B::FloatTensorPrimitive>>>> {
    if config.transport_kind() != TransportKind::Nccl {
        return Ok(None);
    }
    Err(RtpError::TransportUnavailable {
        transport: "nccl".into(),
        reason: "burn-rtp was built without NCCL: rebuild with `--features nccl` (needs NVIDIA GPUs and libnccl to run)".into(),
    })
}

#[cfg(not(feature = "mpi"))]
fn launch_mpi<B, R, E, F>(
    config: RtpConfig,
    _inner_device: impl Fn(usize) -> B::Device,
    _program: F,
) -> RtpResult<Vec<R>>
where
    B: Backend,
    F: Fn(RtpDevice<B>) -> Result<R, E> + Send + Sync,
{
    mpi_rank(&config).map(|_| unreachable!("mpi_rank fails without the `mpi` feature"))
}
