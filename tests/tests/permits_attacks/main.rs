//! Permits (`permits = N`) pushed at their edges, as `many_keys_attacks.rs`
//! pushes many keys: a permit acquire cut at every poll, shut down while it
//! waits for all N, a permit forced free under its body, sibling and
//! inherited calls inside a permit body, a wait for permits its own task
//! holds, many permits under contention, the bounds of a wait, a waiter of
//! another process beside a process that keeps taking permits, and permits
//! mixed with other counts, other modes and multi-key calls. Each test
//! states the promise of `docs/guarantees.md` ("Permits") it checks;
//! `permits.rs` holds the plain cases.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use lock_runtime::{LockGuard, LockRuntime};
use tokio::time::Instant;

mod bounds;
mod cut;
mod fair;
mod handoff;
mod loss;
mod mixed;
mod nesting;
mod scale;

/// The key of permit `i` of `key`, as the feature names it: the key itself
/// for permit 0, `key#i` for the others.
fn permit_key(key: &str, i: u32) -> String {
    if i == 0 {
        key.to_owned()
    } else {
        format!("{key}#{i}")
    }
}

/// Every permit key of `key` below `n`.
fn permit_keys(key: &str, n: u32) -> Vec<String> {
    (0..n).map(|i| permit_key(key, i)).collect()
}

/// Holds every permit of `key` below `n` on `runtime`, each taken as the
/// ordinary lock it is (one try each: a test's blockers of a free key).
async fn block_all(runtime: &LockRuntime, key: &str, n: u32) -> Vec<LockGuard> {
    let mut guards = Vec::with_capacity(n as usize);
    for permit in permit_keys(key, n) {
        let tried = runtime.lock(&permit).try_acquire().await.unwrap();
        guards.push(tried.unwrap_or_else(|| panic!("{permit} was not free")));
    }
    guards
}

/// Releases `guards`, each release answered before the next.
async fn release_all(guards: Vec<LockGuard>) {
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// Takes every permit of `key` below `n` on `runtime` at its first try and
/// gives them back: nothing (a ghost holder, a ghost place that a release
/// handed a permit to) keeps any of them.
async fn all_free_at_once(runtime: &LockRuntime, key: &str, n: u32) {
    let mut taken = Vec::with_capacity(n as usize);
    for permit in permit_keys(key, n) {
        match runtime.lock(&permit).try_acquire().await.unwrap() {
            Some(guard) => taken.push(guard),
            None => panic!("{permit} is not free: {:?}", runtime.inspect(&permit).await),
        }
    }
    release_all(taken).await;
}

/// Waits (bounded: 5 s each) until `runtime` finds every permit of `key`
/// below `n` free: after calls of another client, whose releases may
/// follow their return (released behind the call).
async fn all_free_soon(runtime: &LockRuntime, key: &str, n: u32) {
    for permit in permit_keys(key, n) {
        lock_tests::looked::until_free(runtime, &permit).await;
    }
}

/// Waits (bounded: 10 s) until no permit of `key` below `n` has a place in
/// its fair queue, as `runtime` sees it (`inspect` shows a queue only while
/// the permit is held: the caller holds them all).
async fn no_place_left(runtime: &LockRuntime, key: &str, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for permit in permit_keys(key, n) {
        loop {
            let info = runtime.inspect(&permit).await.unwrap();
            let info = info.unwrap_or_else(|| panic!("{permit} is not held any more"));
            if info.queue.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{permit} keeps a place: {:?}",
                info.queue
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Nothing of `runtime` is left held (but `others` holds of its own) or
/// waiting (bounded: 5 s).
async fn settled(runtime: &LockRuntime, others: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = runtime.stats();
        if stats.held == others && stats.waiting == 0 && stats.waiting_keys == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "left behind: {stats:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How a future polled by [`cut_after`] ended.
enum Polled<T> {
    /// It finished first.
    Done(T),
    /// It was dropped after its `polls`-th pending poll.
    Cut,
    /// It was left pending for the whole patience before that (asleep, with
    /// nothing to wake it), then dropped; `probe` said this then.
    Idle(bool),
}

/// Polls `fut` until it has been left pending `polls` times, then drops it
/// (`polls == 0`: dropped before its first poll): a cancellation at its
/// `polls`-th await. A future left pending for `patience` is dropped then,
/// after `probe` is asked about the state it sleeps in.
async fn cut_after<F: Future>(
    fut: F,
    polls: usize,
    patience: Duration,
    probe: impl Fn() -> bool,
) -> Polled<F::Output> {
    if polls == 0 {
        drop(fut);
        return Polled::Cut;
    }
    let mut fut = pin!(fut);
    let mut pending = 0;
    let polled = poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending => {
            pending += 1;
            if pending >= polls {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        }
    });
    match tokio::time::timeout(patience, polled).await {
        Ok(Some(out)) => Polled::Done(out),
        Ok(None) => Polled::Cut,
        Err(_) => Polled::Idle(probe()),
    }
}
