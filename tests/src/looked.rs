//! Whether a key is held, as another client finds it: one try, given back
//! at once, and bounded waits for a key to be taken or freed. For tests
//! that check what a call holds from outside it (many keys at once).

use std::time::Duration;

use lock_runtime::LockRuntime;
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
