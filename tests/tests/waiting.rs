//! Waiting: bounded waits end on time, releases wake waiters at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::LockError;
use lock_tests::{on_every_backend, unique, Kind};

on_every_backend!(
    wait_timeout_returns_timeout_within_ten_percent,
    zero_wait_on_held_lock_times_out_at_once,
    release_wakes_waiter_without_waiting_for_the_lease,
    many_waiters_each_get_the_lock_once,
);

/// A 500 ms wait on a held lock ends with `Timeout` between 500 and 550 ms.
async fn wait_timeout_returns_timeout_within_ten_percent(kind: Kind) {
    let prefix = unique("wait");
    let holder = kind.runtime(&prefix).await;
    let waiter = kind.peer(&holder, &prefix).await;
    let _guard = holder.lock("busy").acquire().await.unwrap();
    let wait = Duration::from_millis(500);
    let start = Instant::now();
    // From another task: on the embedded backend the peer is the same
    // runtime, and a wait in the holder's own task would be a self-deadlock.
    let request = waiter.lock("busy").wait(wait);
    let err = tokio::spawn(async move { request.acquire().await.map(drop) })
        .await
        .unwrap()
        .unwrap_err();
    let took = start.elapsed();
    match err {
        LockError::Timeout { key, waited } => {
            assert_eq!(key, "busy");
            assert!(waited >= wait, "reported {waited:?}");
        }
        other => panic!("expected Timeout, got {other}"),
    }
    assert!(took >= wait, "gave up early: {took:?}");
    assert!(took <= wait + wait / 10, "gave up late: {took:?}");
    assert_eq!(
        waiter.stats().waiting_keys,
        0,
        "the waiter left its registration behind"
    );
}

/// `wait(ZERO)` tries once: a held lock gives `Timeout` at once.
async fn zero_wait_on_held_lock_times_out_at_once(kind: Kind) {
    let prefix = unique("zero");
    let holder = kind.runtime(&prefix).await;
    let waiter = kind.peer(&holder, &prefix).await;
    let _guard = holder.lock("busy").acquire().await.unwrap();
    let start = Instant::now();
    let err = waiter
        .lock("busy")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_millis(100));
}

/// A waiter behind a 30 s lease gets the lock right after the release, not
/// after the lease: the release message wakes it.
async fn release_wakes_waiter_without_waiting_for_the_lease(kind: Kind) {
    let prefix = unique("wake");
    let holder = kind.runtime(&prefix).await;
    let waiter = kind.peer(&holder, &prefix).await;
    let guard = holder
        .lock("k")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let (registered_tx, registered) = tokio::sync::oneshot::channel();
    let w = waiter.clone();
    let task = tokio::spawn(async move {
        let fut = w.lock("k").wait(Duration::from_secs(10)).acquire();
        let _ = registered_tx.send(());
        let g = fut.await.unwrap();
        (Instant::now(), g.fence())
    });
    registered.await.unwrap();
    // Wait (bounded) until the waiter is registered as waiting on the key.
    for _ in 0..200 {
        if waiter.stats().waiting_keys == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(waiter.stats().waiting_keys, 1);
    let token = guard.fence();
    let released = Instant::now();
    guard.release().await.unwrap();
    let (acquired, new_token) = task.await.unwrap();
    let handoff = acquired - released;
    println!("{kind:?}: handoff after release took {handoff:?}");
    assert!(
        handoff < Duration::from_millis(200),
        "woken late: {handoff:?}"
    );
    assert!(new_token > token);
}

/// 20 waiters queue on one key; each gets it exactly once, and nobody is left
/// registered afterwards.
async fn many_waiters_each_get_the_lock_once(kind: Kind) {
    let prefix = unique("queue");
    let runtime = kind.runtime(&prefix).await;
    let peer = kind.peer(&runtime, &prefix).await;
    let first = runtime.lock("q").acquire().await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let rt = if i % 2 == 0 {
            runtime.clone()
        } else {
            peer.clone()
        };
        tasks.push(tokio::spawn(async move {
            let g = rt.lock("q").wait(Duration::from_secs(20)).acquire().await?;
            tokio::task::yield_now().await;
            let token = g.fence();
            g.release().await?;
            Ok::<_, LockError>(token)
        }));
    }
    first.release().await.unwrap();
    let mut tokens = Vec::new();
    for t in tasks {
        tokens.push(t.await.unwrap().unwrap());
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 20, "two waiters shared a hold");
    assert_eq!(runtime.stats().waiting_keys, 0);
    assert_eq!(peer.stats().waiting_keys, 0);
}
