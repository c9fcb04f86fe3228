//! Runs the user's per-rank program on every rank of an in-process world.

use crate::config::RtpConfig;
use crate::device::RtpDevice;
use crate::error::{RtpError, RtpResult};
use crate::transport::Transport;
use crate::world::{enter_rank, in_process_world};
use burn::tensor::backend::Backend;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

fn panic_reason(payload: Box<dyn std::any::Any + Send>) -> RtpError {
    if let Some(err) = payload.downcast_ref::<RtpError>() {
        return err.clone();
    }
    let reason = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked with a non-string payload".to_string());
    RtpError::RankFailed {
        rank: usize::MAX,
        reason,
    }
}

/// Prints typed RTP errors raised inside backend ops readably, then defers to the old hook.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(err) = info.payload().downcast_ref::<RtpError>() {
                let thread = std::thread::current();
                eprintln!("{}: {err}", thread.name().unwrap_or("rtp"));
            } else {
                previous(info);
            }
        }));
    });
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
    install_panic_hook();
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
                        let rank = device.rank();
                        let _current = enter_rank(&device);
                        let outcome = catch_unwind(AssertUnwindSafe(|| program(device)));
                        let outcome = match outcome {
                            Ok(Ok(value)) => Ok(value),
                            Ok(Err(e)) => Err(RtpError::RankFailed {
                                rank,
                                reason: e.to_string(),
                            }),
                            Err(payload) => Err(match panic_reason(payload) {
                                RtpError::RankFailed { reason, .. } => {
                                    RtpError::RankFailed { rank, reason }
                                }
                                typed => typed,
                            }),
                        };
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

/// Validates a rank index against a world size.
pub fn check_rank(rank: usize, world_size: usize) -> RtpResult<()> {
    if world_size == 0 {
        Err(RtpError::EmptyWorld)
    } else if rank >= world_size {
        Err(RtpError::RankOutOfRange { rank, world_size })
    } else {
        Ok(())
    }
}
