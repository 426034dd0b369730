//! The easy path for users' tests: every `#[tokio::test]` calls
//! `init_from_env()`, and all of them get the one installed runtime, which
//! serves each test's own tokio runtime (it runs on a thread of its own).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::{init_from_env, lock, LockRuntime};

/// Runs in each test: install (or find) the runtime, then use it.
async fn init_and_lock(key: &str) {
    // The embedded backend on purpose, whatever the environment says.
    std::env::set_var("LOCK_BACKEND", "memory");
    std::env::remove_var("LOCK_REDIS_URL");
    std::env::remove_var("REDIS_URL");
    let runtime = init_from_env().await.expect("init_from_env in every test");
    let installed = LockRuntime::global().unwrap();
    assert_eq!(runtime.describe(), installed.describe());
    let again = init_from_env()
        .await
        .expect("a second call in the same test");
    assert_eq!(again.describe(), installed.describe());
    let guard = lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn first_test_calls_init_from_env() {
    init_and_lock("first").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_test_calls_init_from_env() {
    init_and_lock("second").await;
}

#[tokio::test]
async fn third_test_calls_init_from_env() {
    init_and_lock("third").await;
}
