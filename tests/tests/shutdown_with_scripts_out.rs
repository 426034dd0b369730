#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Shutdown with acquire scripts out: an acquire's script is answered on the
//! lock runtime's worker whatever becomes of its caller, and shutdown gives
//! back what it took.

use std::time::{Duration, Instant};

use lock_runtime::LockRuntime;
use lock_testkit::RedisServer;
use lock_tests::unique;
use redis::AsyncCommands;

/// The caller's own tokio runtime ends while its acquire's script is out
/// (a `#[tokio::test]`, a request's runtime, a CLI's `block_on`): the script
/// is still answered on the lock runtime's worker, and what it took is given
/// back by `shutdown`, within its drain limit. (Its timers must not belong to
/// the caller's runtime: a timer of a runtime that shut down panics.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_callers_runtime_ends_with_its_script_out_is_still_given_back() {
    let server = RedisServer::start();
    let prefix = unique("hostile-rt-ends");
    let runtime = LockRuntime::builder()
        .redis(server.url())
        .key_prefix(&prefix)
        .fair(false)
        .try_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_secs(3))
        .default_lease(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let key = "k";
    let lock_key = runtime.backend_key(key);
    let mut con = server.connection().await;

    server.freeze();
    // The caller: its own short-lived runtime (a #[tokio::test], a request's
    // runtime, a CLI's block_on), which ends while the script is out.
    let caller = runtime.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let outcome = rt.block_on(caller.lock("k").try_acquire());
        assert!(outcome.is_err(), "the frozen server cannot answer");
        drop(rt); // its time driver shuts down: fires the client's Sleep
    })
    .join()
    .unwrap();
    // Let the worker poll the script's task once more.
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.thaw();
    // The script reaches the server now and takes the lock (the key is free).
    for _ in 0..200 {
        if con.exists::<_, bool>(&lock_key).await.unwrap() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = Instant::now();
    let shut = runtime.shutdown().await;
    let took = started.elapsed();
    let left: bool = con.exists(&lock_key).await.unwrap();
    eprintln!("shutdown: {shut:?} after {took:?}; lock left in Redis: {left}");
    assert!(shut.is_ok(), "shutdown: {shut:?} after {took:?}");
    assert!(!left, "the script's lock was never given back");
}
