//! Cancellation and panics: a dropped guard, a cancelled or panicking
//! locked body, a cancelled acquire (at any stage of its wait) and a
//! dropped runtime free what they held at once, and leave nothing behind:
//! no local waiter, no pending release, no place in a fair queue.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::{with_lock, LockError, LockRuntime};
use lock_tests::{fair_runtime, on_every_backend, redis, unique, until_queued, wait_until, Kind};
use redis::AsyncCommands;
use tokio::sync::oneshot;
use tokio::time::Instant;

on_every_backend!(
    cancelled_holder_frees_lock_within_100ms,
    panicking_body_frees_lock,
    a_dropped_guard_frees_the_key_for_this_process_at_once,
    dropped_guards_on_many_keys_free_each_key_at_once,
    cancelled_acquires_do_not_unbalance_the_pending_releases,
);

// ---------------------------------------------------------------------------
// Holders
// ---------------------------------------------------------------------------

/// A `with_lock` call dropped by `timeout` frees its lock through the guard's
/// drop: a peer already waiting gets it within 100 ms of the timeout firing.
async fn cancelled_holder_frees_lock_within_100ms(kind: Kind) {
    let (runtime, peer) = kind.two("cancel").await;
    let key = unique("cancel-key");

    let (inside_tx, inside_rx) = oneshot::channel();
    let (deadline_tx, deadline_rx) = oneshot::channel();
    let holder = {
        let runtime = runtime.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_millis(200);
            deadline_tx.send(deadline).unwrap();
            let outcome = tokio::time::timeout_at(
                deadline,
                with_lock(runtime.lock(key), async move {
                    inside_tx.send(()).unwrap();
                    std::future::pending::<()>().await;
                    Ok::<_, LockError>(())
                }),
            )
            .await;
            assert!(
                outcome.is_err(),
                "the body never ends: only the timeout can"
            );
        })
    };
    let deadline = deadline_rx.await.unwrap();
    inside_rx.await.expect("the holder entered its body");

    let waiter = {
        let peer = peer.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let guard = peer.lock(key).wait(Duration::from_secs(5)).acquire().await;
            (Instant::now(), guard)
        })
    };
    holder.await.expect("holder task");
    let (acquired_at, guard) = waiter.await.expect("waiter task");
    let guard = guard.expect("the waiter got the lock of the cancelled holder");
    assert!(
        acquired_at >= deadline,
        "the waiter got in before the holder was cancelled"
    );
    let latency = acquired_at - deadline;
    println!(
        "cancelled holder ({kind:?}): waiter acquired {} µs after the timeout fired",
        latency.as_micros()
    );
    assert!(
        latency < Duration::from_millis(100),
        "the waiter got the lock {latency:?} after the cancel (limit 100 ms)"
    );
    guard.release().await.unwrap();
    assert_eq!(runtime.stats().held, 0);
}

/// A body that panics frees its lock at once, long before its 30 s lease.
async fn panicking_body_frees_lock(kind: Kind) {
    let (runtime, peer) = kind.two("panic").await;
    let key = unique("panic-key");

    let task = {
        let runtime = runtime.clone();
        let key = key.clone();
        tokio::spawn(async move {
            with_lock(
                runtime.lock(key).lease(Duration::from_secs(30)),
                async move {
                    if true {
                        panic!("the locked body panics (expected by the test)");
                    }
                    Ok::<_, LockError>(())
                },
            )
            .await
        })
    };
    let joined = task.await;
    assert!(
        joined.as_ref().is_err_and(tokio::task::JoinError::is_panic),
        "the body should have panicked: {joined:?}"
    );

    let asked = Instant::now();
    let request = peer.lock(&key).wait(Duration::from_secs(1));
    let guard = request
        .acquire()
        .await
        .expect("the panicked holder's lock is free well before its 30 s lease");
    assert!(asked.elapsed() < Duration::from_secs(1));
    guard.release().await.unwrap();
    assert_eq!(runtime.stats().held, 0);
}

/// `let _ = lock(k).acquire().await` frees the key for this process's next
/// acquire at once on every backend (on a server the release is still sent
/// in the background; the next acquire waits for it).
async fn a_dropped_guard_frees_the_key_for_this_process_at_once(kind: Kind) {
    // (A try-once shares its bound with waiting for this process's pending
    // release: a roomy one, so that a slow ensemble's answer is not taken
    // for the failure this test looks for, a "busy".)
    let runtime = kind
        .builder(&unique("dropped"))
        .try_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    for round in 0..100 {
        let guard = runtime.lock("k").acquire().await.unwrap();
        drop(guard);
        let again = runtime.lock("k").try_acquire().await.unwrap();
        assert!(again.is_some(), "round {round}: still busy after the drop");
    }
}

/// 300 guards dropped at once, on 300 keys: each key is free for this
/// process's next try at once (each waits for its own key's release only).
async fn dropped_guards_on_many_keys_free_each_key_at_once(kind: Kind) {
    let runtime = kind.runtime(&unique("rv-many")).await;
    let mut guards = Vec::new();
    for k in 0..300 {
        guards.push(runtime.lock(format!("k{k}")).acquire().await.unwrap());
    }
    drop(guards);
    for k in 0..300 {
        let again = runtime.lock(format!("k{k}")).try_acquire().await.unwrap();
        assert!(
            again.is_some(),
            "k{k} still busy after its guard was dropped"
        );
    }
    // Nothing stays counted: a shutdown drains at once.
    shutdown_drains_at_once(&runtime).await;
}

/// Dropping the last handle of a Redis runtime right after dropping a guard
/// still sends the release: another client gets the key long before the
/// lease would have freed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_runtime_sends_the_releases_it_had_queued() {
    let prefix = unique("droprt");
    let first = Kind::Redis.runtime(&prefix).await;
    let second = Kind::Redis.runtime(&prefix).await;
    for round in 0..20 {
        let runtime = Kind::Redis.runtime(&prefix).await;
        let request = runtime.lock("k").lease(Duration::from_secs(30));
        let guard = request.acquire().await.unwrap();
        drop(guard);
        drop(runtime);
        let start = Instant::now();
        let request = second.lock("k").wait(Duration::from_secs(5));
        let next = request.acquire().await;
        assert!(next.is_ok(), "round {round}: {next:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        next.unwrap().release().await.unwrap();
    }
    drop(first);
}

// ---------------------------------------------------------------------------
// Waiters
// ---------------------------------------------------------------------------

/// Acquires cancelled while they wait for a dropped guard's release to be
/// answered (and right after their script went out) leave the count of
/// pending releases balanced: the key stays usable and shutdown drains.
async fn cancelled_acquires_do_not_unbalance_the_pending_releases(kind: Kind) {
    let runtime = kind.runtime(&unique("rv-cancel-settle")).await;
    for round in 0..60u64 {
        drop(runtime.lock("k").acquire().await.unwrap());
        let cut = Duration::from_micros(round * 50);
        let _ = tokio::time::timeout(cut, runtime.lock("k").acquire()).await;
        let again = tokio::time::timeout(
            Duration::from_secs(2),
            runtime.lock("k").wait(Duration::from_secs(2)).acquire(),
        )
        .await
        .expect("the next acquire hung")
        .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        drop(again);
    }
    shutdown_drains_at_once(&runtime).await;
}

/// The same with fair mode on Redis: a fair runtime's dropped guards and
/// cancelled acquires leave no queue place and no pending count behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_dropped_guards_and_cancelled_acquires_leave_nothing_behind() {
    let prefix = unique("rv-fair-settle");
    let url = redis().url();
    let runtime = fair_runtime(&url, &prefix).await;
    let hash = runtime.backend_key("k");
    let mut con = redis().connection().await;
    for round in 0..60u64 {
        drop(runtime.lock("k").acquire().await.unwrap());
        let cut = Duration::from_micros(round * 50);
        let _ = tokio::time::timeout(cut, runtime.lock("k").acquire()).await;
        let again = runtime.lock("k").try_acquire().await;
        assert!(
            matches!(again, Ok(Some(_))),
            "round {round}: {again:?} right after a dropped guard"
        );
    }
    until_queued(&mut con, &hash, 0).await;
    shutdown_drains_at_once(&runtime).await;
    assert!(!con.exists::<_, bool>(&hash).await.unwrap());
}

/// Waiters cancelled at every stage of their wait (their first script in
/// flight, subscribing, retrying, asleep, using the fair place), many at
/// once, leave nothing: no local waiter, no queue place in Redis, no lock
/// taken by a cancelled script; the key goes to the next waiter at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_cancelled_anywhere_leave_no_trace_plain_and_fair() {
    for fair in [false, true] {
        let prefix = unique("rv-cancel");
        let url = redis().url();
        let build = || async {
            LockRuntime::builder()
                .redis(&url)
                .key_prefix(&prefix)
                .fair(fair)
                .build()
                .await
                .unwrap()
        };
        let (holder, waiter, third) = (build().await, build().await, build().await);
        let hash = holder.backend_key("k");
        let mut con = redis().connection().await;
        let guard = holder.lock("k").acquire().await.unwrap();
        for round in 0..40u64 {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..4u64 {
                let w = waiter.clone();
                let cut = Duration::from_micros(round * 250 + i * 700);
                set.spawn(async move {
                    let _ = tokio::time::timeout(
                        cut,
                        w.lock("k").wait(Duration::from_secs(10)).acquire(),
                    )
                    .await;
                });
            }
            while set.join_next().await.is_some() {}
        }
        // Key free: cancelled acquires whose script was in flight gave their
        // id back (if one had taken it, the third would wait a whole lease).
        wait_until("the waiters left", || waiter.stats().waiting_keys == 0).await;
        if fair {
            until_queued(&mut con, &hash, 0).await;
        }
        guard.release().await.unwrap();
        let start = Instant::now();
        let next = third.lock("k").wait(Duration::from_secs(2)).acquire().await;
        assert!(next.is_ok(), "fair={fair}: {next:?}");
        assert!(start.elapsed() < Duration::from_secs(1), "fair={fair}");
        next.unwrap().release().await.unwrap();
        let mine = waiter.lock("k").try_acquire().await.unwrap();
        assert!(mine.is_some(), "fair={fair}: a cancelled acquire holds `k`");
    }
}

/// Nothing stays counted (no pending release, no waiter): a shutdown
/// drains at once.
async fn shutdown_drains_at_once(runtime: &LockRuntime) {
    let start = Instant::now();
    runtime.shutdown().await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// A try right after a dropped guard waits for that guard's release (so
/// the key is free for it at once); when the server does not answer that
/// release within the try timeout, the try's error says so, instead of
/// reading as a server that did not answer the try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_behind_an_unanswered_release_of_its_key_says_so() {
    let (proxy, runtime) = lock_tests::behind_proxy(&unique("behind-release")).await;
    let guard = runtime.lock("k").acquire().await.unwrap();
    proxy.stall();
    drop(guard);
    let error = runtime
        .lock("k")
        .try_acquire()
        .await
        .expect_err("the server answers nothing");
    proxy.resume();
    let message = error.to_string();
    assert!(message.contains("own earlier release"), "{message}");
}
