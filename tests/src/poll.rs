//! Waiting, bounded, for state that sends no event to await: a runtime's
//! counters, what a server stores, what `inspect` reports. Every loop here
//! gives up at its limit and fails the test naming what never came, so a
//! test that waits for something can neither hang nor pass on a timeout.

use std::time::Duration;

/// How often the conditions are looked at again.
const STEP: Duration = Duration::from_millis(5);

/// Waits (bounded: 5 s) until `ready` says yes: for state with no event to
/// await (a runtime's counters, say). Panics naming `what` otherwise.
pub async fn wait_until(what: &str, ready: impl Fn() -> bool) {
    for _ in 0..1000 {
        if ready() {
            return;
        }
        tokio::time::sleep(STEP).await;
    }
    panic!("timed out: {what}");
}

/// Looks (every 5 ms, bounded by `limit`) until the asynchronous `ready`
/// says yes: for state a test must ask a server or a runtime about (a
/// queue's length, `inspect`). Panics naming `what` otherwise.
pub async fn poll_until(what: &str, limit: Duration, ready: impl AsyncFnMut() -> bool) {
    poll_every(STEP, what, limit, ready).await;
}

/// Like [`poll_until`], looking every `step`: for a test that must act
/// within a few milliseconds of the change.
pub async fn poll_every(
    step: Duration,
    what: &str,
    limit: Duration,
    mut ready: impl AsyncFnMut() -> bool,
) {
    let started = tokio::time::Instant::now();
    loop {
        if ready().await {
            return;
        }
        assert!(started.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(step).await;
    }
}
