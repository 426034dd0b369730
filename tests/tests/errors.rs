//! Configuration and connection errors are clear and never leak secrets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockRuntime};
use lock_testkit::RedisServer;
use lock_tests::{redis, unique};

#[tokio::test]
async fn malformed_url_is_invalid_config_without_echoing_it() {
    for url in [
        "http://user:hunter2@127.0.0.1:6379",
        "redis://user:hunter2@[::1",
        "hunter2",
    ] {
        let err = LockRuntime::builder().redis(url).build().await.unwrap_err();
        assert!(matches!(err, LockError::InvalidConfig(_)), "{url}: {err:?}");
        let shown = format!("{err} {err:?}");
        assert!(
            shown.contains("redis://"),
            "message should show the expected shape: {shown}"
        );
        assert!(!shown.contains("hunter2"), "secret leaked: {shown}");
    }
}

#[tokio::test]
async fn unreachable_redis_fails_fast_and_names_the_address_not_the_password() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let err = LockRuntime::builder()
        .redis(format!("redis://app:hunter2@127.0.0.1:{port}"))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains(&format!("127.0.0.1:{port}")), "{shown}");
    assert!(!shown.contains("hunter2"), "secret leaked: {shown}");
}

#[tokio::test]
async fn wrong_password_is_a_backend_error_without_the_password() {
    let server = RedisServer::start_with(&["--requirepass", "right-one"]);
    let err = LockRuntime::builder()
        .redis(format!("redis://:hunter2@127.0.0.1:{}", server.port()))
        .build()
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(matches!(err, LockError::Backend(_)), "{shown}");
    assert!(!shown.contains("hunter2"), "secret leaked: {shown}");
}

#[tokio::test]
async fn runtime_debug_and_describe_hide_credentials() {
    let builder = LockRuntime::builder().redis("redis://app:hunter2@127.0.0.1:6379");
    assert!(!format!("{builder:?}").contains("hunter2"));
    let runtime = LockRuntime::builder()
        .redis(redis().url())
        .build()
        .await
        .unwrap();
    assert_eq!(
        runtime.describe(),
        format!("redis at 127.0.0.1:{}", redis().port())
    );
}

#[tokio::test]
async fn bad_keys_and_leases_are_refused_before_any_round_trip() {
    let runtime = LockRuntime::builder()
        .redis(redis().url())
        .key_prefix(unique("bad"))
        .build()
        .await
        .unwrap();
    let empty = runtime.lock("").acquire().await.unwrap_err();
    assert!(matches!(empty, LockError::InvalidKey { .. }), "{empty}");
    let long = runtime.lock("x".repeat(5000)).acquire().await.unwrap_err();
    assert!(matches!(long, LockError::InvalidKey { .. }), "{long}");
    assert!(long.to_string().len() < 300, "the error repeats a huge key");
    let lease = runtime
        .lock("k")
        .lease(Duration::from_millis(1))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(lease, LockError::InvalidConfig(_)), "{lease}");
    let prefix = LockRuntime::builder()
        .memory()
        .key_prefix("a{b")
        .build()
        .await
        .unwrap_err();
    assert!(matches!(prefix, LockError::InvalidConfig(_)), "{prefix}");
}

/// A runtime whose Redis is gone for good keeps answering with errors (never
/// a panic, never a hang): bounded waits end in `Timeout` at their deadline,
/// single tries and releases report the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_after_redis_is_gone_for_good_returns_errors() {
    let server = RedisServer::start();
    let runtime = LockRuntime::builder()
        .redis(server.url())
        .response_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let guard = runtime.lock("k").acquire().await.unwrap();
    drop(server);

    let start = Instant::now();
    let once = runtime.lock("other").wait(Duration::ZERO).acquire().await;
    assert!(matches!(once, Err(LockError::Backend(_))), "{once:?}");
    let bounded = runtime
        .lock("other")
        .wait(Duration::from_millis(500))
        .acquire()
        .await;
    assert!(
        matches!(bounded, Err(LockError::Timeout { .. })),
        "{bounded:?}"
    );
    assert!(runtime.ping().await.is_err());
    assert!(runtime.force_unlock("k").await.is_err());
    let released = guard.release().await;
    assert!(
        matches!(
            released,
            Err(LockError::Backend(_) | LockError::Lost { .. })
        ),
        "{released:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(runtime.stats().held, 0);
}

/// `wait(Duration::MAX)` means forever, not an overflow.
#[tokio::test]
async fn enormous_wait_is_a_wait_forever() {
    let runtime = LockRuntime::builder().memory().build().await.unwrap();
    let guard = runtime
        .lock("k")
        .wait(Duration::MAX)
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let guard = runtime
        .lock("k")
        .lease(Duration::from_secs(24 * 3600))
        .wait(Duration::MAX)
        .acquire()
        .await
        .unwrap();
    assert!(!guard.is_lost());
}
