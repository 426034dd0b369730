//! Whether a key is held, as another client finds it: one try, given back
//! at once, and bounded waits for a key to be taken or freed. For tests
//! that check what a call holds from outside it (many keys at once), that
//! take a key they know free (`at_once`) or just freed (`taken_within`), or
//! wait for another client's place in a queue (`until_contenders`).

use std::future::Future;
use std::time::Duration;

use lock_runtime::{LockError, LockGuard, LockRequest, LockRuntime};
use tokio::time::Instant;

/// Whether `runtime` finds `key` free now (and gives it back at once).
pub async fn free(runtime: &LockRuntime, key: &str) -> bool {
    let tried = runtime.lock(key).try_acquire().await.unwrap();
    match tried {
        Some(guard) => {
            guard.release().await.unwrap();
            true
        }
        None => false,
    }
}

/// What `request` takes at its first try, which must find the key free
/// (`why` says why it should be, for the failure).
pub async fn at_once(request: LockRequest, why: &str) -> LockGuard {
    let tried = request.try_acquire().await.unwrap();
    tried.unwrap_or_else(|| panic!("{why}"))
}

/// What `acquire` (of a key, or of keys, just freed) takes, which it must
/// within `bound`: no place left by a call that gave up may be served
/// first. `what` names the keys for the failure.
pub async fn taken_within<G>(
    acquire: impl Future<Output = Result<G, LockError>>,
    bound: Duration,
    what: &str,
) -> G {
    let started = Instant::now();
    let taken = acquire.await;
    let took = started.elapsed();
    let guard = taken.unwrap_or_else(|e| panic!("{what} not taken: {e:?}"));
    assert!(
        took < bound,
        "{what} went to a place given up first ({took:?})"
    );
    guard
}

/// Waits (bounded: 10 s) until `runtime` finds `key` held by someone else.
pub async fn until_held(runtime: &LockRuntime, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while free(runtime, key).await {
        assert!(Instant::now() < deadline, "{key} never taken");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (bounded: 5 s) until `runtime` finds `key` free: a released key
/// may take a moment to be free for another client (a release behind the
/// call).
pub async fn until_free(runtime: &LockRuntime, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !free(runtime, key).await {
        assert!(Instant::now() < deadline, "{key} still held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (bounded: 5 s) until `runtime` finds `want` contenders for `key`:
/// its holders (the readers, or the one holder) and those queued behind
/// them. For a queue whose places show up by themselves (another client's,
/// a task's): no event says when one landed.
pub async fn until_contenders(runtime: &LockRuntime, key: &str, want: usize) {
    for _ in 0..500 {
        let info = runtime.inspect(key).await.unwrap();
        if info.map_or(0, |i| i.readers.len().max(1) + i.queue.len()) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{key} never had {want} contenders: {:?}",
        runtime.inspect(key).await
    );
}
