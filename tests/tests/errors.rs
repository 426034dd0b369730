//! Configuration and connection errors are clear and never leak secrets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockRuntime};
use lock_tests::{redis, unique, RedisServer};

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
