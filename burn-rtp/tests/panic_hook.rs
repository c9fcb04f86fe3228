//! The panic hook `launch` installs chains to the one in place before it and is put back when
//! the last world ends. Alone in its binary: a panic hook is the whole process's.

use burn::backend::NdArray;
use burn_rtp::{launch, RtpConfig, RtpError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Panics on a thread of its own, with the hook in place, and waits for it.
fn panic_on_a_thread(message: &'static str) {
    let joined = std::thread::spawn(move || panic!("{message}")).join();
    assert!(joined.is_err());
}

/// Panics with a typed RTP error as the payload, as a backend op raises one: burn-rtp's hook
/// prints it itself instead of handing it on.
fn rtp_panic_on_a_thread() {
    let joined = std::thread::spawn(|| {
        std::panic::panic_any(RtpError::WorldEnded {
            reason: "a test".into(),
        })
    })
    .join();
    assert!(joined.is_err());
}

#[test]
fn the_hook_chains_to_the_previous_one_and_is_restored_when_the_world_ends() {
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    std::panic::set_hook(Box::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    }));
    panic_on_a_thread("before any world");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the user's hook is in place"
    );

    // While a world runs, a panic that carries no RTP error reaches the user's hook.
    launch::<NdArray, _, _>(RtpConfig::new(2), |device| {
        device.barrier();
        if device.rank() == 0 {
            panic_on_a_thread("during a world");
        }
        device.barrier();
    })
    .unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 2, "chained to the user's hook");

    // After the world, the user's hook is the process's hook again, and stays so.
    let current = std::panic::take_hook();
    std::panic::set_hook(current);
    panic_on_a_thread("after the world");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        3,
        "the user's hook was put back"
    );

    // A world that fails on one rank still ends with the user's hook back in place.
    let failed = launch::<NdArray, _, _>(RtpConfig::new(2), |device| {
        if device.rank() == 1 {
            panic!("rank 1 fails on purpose");
        }
        device.barrier();
    });
    assert!(failed.is_err());
    let before = seen.load(Ordering::SeqCst);
    rtp_panic_on_a_thread();
    assert_eq!(
        seen.load(Ordering::SeqCst),
        before + 1,
        "put back after a failed world"
    );
    let _ = std::panic::take_hook();
}
