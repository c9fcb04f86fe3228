//! A test hook that kills this process at a chosen point of the save protocol, so that tests
//! can check that no kill, wherever it lands, leaves a checkpoint that loads wrong.
//!
//! `RTP_TEST_KILL_AT_SAVE_POINT=K` kills the process with SIGKILL when it reaches its `K`-th
//! save point (counted from 1 over the life of the process, every save included);
//! `K@R` counts only the points rank `R` reaches. Unset, each point costs one load of a
//! cached `Option`. The points sit between the steps of the protocol: before and after each
//! file is written, with a file half written, before and after each rename.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable that arms the hook.
pub const KILL_AT_SAVE_POINT: &str = "RTP_TEST_KILL_AT_SAVE_POINT";

/// Which point kills, and on which rank's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Armed {
    point: u64,
    rank: Option<usize>,
}

/// Parses `K` or `K@R`; anything else leaves the hook disarmed (and says so once).
fn parse(text: &str) -> Option<Armed> {
    let (point, rank) = match text.trim().split_once('@') {
        Some((p, r)) => (p, Some(r.trim().parse().ok()?)),
        None => (text.trim(), None),
    };
    let point = point.trim().parse().ok().filter(|&p| p > 0)?;
    Some(Armed { point, rank })
}

fn armed() -> Option<Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    *ARMED.get_or_init(|| {
        let text = std::env::var(KILL_AT_SAVE_POINT).ok()?;
        let armed = parse(&text);
        if armed.is_none() {
            tracing::warn!("{KILL_AT_SAVE_POINT}={text:?} is not `K` or `K@RANK`; ignored");
        }
        armed
    })
}

/// Save points this process has passed, per the hook's rank filter.
static PASSED: AtomicU64 = AtomicU64::new(0);

/// Marks a point of the save protocol on `rank`; kills the process here if the hook says so.
pub(crate) fn point(rank: usize, name: &str) {
    let Some(armed) = armed() else { return };
    if armed.rank.is_some_and(|r| r != rank) {
        return;
    }
    let n = PASSED.fetch_add(1, Ordering::SeqCst) + 1;
    if n == armed.point {
        eprintln!("rank {rank}: killed at save point {n} ({name}) by {KILL_AT_SAVE_POINT}");
        // A kill from outside, as a crash or an OOM killer would: no destructor or buffer
        // flush runs after it.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        loop {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_takes_a_point_and_an_optional_rank() {
        assert_eq!(
            parse("7"),
            Some(Armed {
                point: 7,
                rank: None
            })
        );
        assert_eq!(
            parse(" 12@3 "),
            Some(Armed {
                point: 12,
                rank: Some(3)
            })
        );
        assert_eq!(parse("0"), None);
        assert_eq!(parse("x"), None);
        assert_eq!(parse("4@"), None);
    }
}
