//! What a newcomer trips on: self-deadlocks, guards and scopes, other
//! executors, dropped guards, shutdown. Each test keeps one promise of the
//! README ("Where re-entry stops", "Shutting down") on both backends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::{fence, with_lock, LockError, LockRuntime};
use lock_tests::{block_on, on_every_backend, unique, wait_until, Kind};

on_every_backend!(
    a_guard_scope_lets_calls_on_its_key_reenter_and_see_its_token,
    a_task_waiting_for_its_own_guard_gets_self_deadlock_naming_the_key,
    a_spawned_task_waiting_for_its_parents_lock_gets_a_plain_timeout,
    a_join_arm_waiting_for_its_siblings_locked_call_gets_a_plain_timeout,
    locks_work_from_an_executor_other_than_tokio,
    a_dropped_guard_frees_the_key_for_this_process_at_once,
    shutdown_releases_every_held_lock_and_refuses_new_ones,
);

/// Inside `guard.scope(..)`, locked calls on the guard's key re-enter the
/// guard's hold (no wait) and `fence()` is the guard's token; outside it,
/// `fence()` stays `None` and the same call would wait.
async fn a_guard_scope_lets_calls_on_its_key_reenter_and_see_its_token(kind: Kind) {
    let runtime = kind.runtime(&unique("scope")).await;
    let guard = runtime.lock("account").acquire().await.unwrap();
    assert_eq!(fence(), None, "a guard does not change the caller's scope");
    let rt = runtime.clone();
    let start = Instant::now();
    let (outer, inner) = guard
        .scope(async move {
            let outer = fence();
            let inner = with_lock(rt.lock("account").wait(Duration::ZERO), async {
                Ok::<_, LockError>(fence())
            })
            .await;
            (outer, inner)
        })
        .await;
    assert_eq!(outer, Some(guard.fence()));
    assert_eq!(
        inner.unwrap(),
        Some(guard.fence()),
        "the nested call did not re-enter"
    );
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    assert_eq!(runtime.stats().held, 0);
}

/// Acquiring a key the same task holds through a guard cannot succeed (the
/// task is busy waiting): it ends at its deadline with `SelfDeadlock`, whose
/// message names the key and the way out.
async fn a_task_waiting_for_its_own_guard_gets_self_deadlock_naming_the_key(kind: Kind) {
    let runtime = kind.runtime(&unique("selfwait")).await;
    let _guard = runtime.lock("order:7").acquire().await.unwrap();
    let wait = Duration::from_millis(300);
    let start = Instant::now();
    let err = with_lock(runtime.lock("order:7").wait(wait), async {
        Ok::<_, LockError>(())
    })
    .await
    .unwrap_err();
    assert!(start.elapsed() >= wait);
    match &err {
        LockError::SelfDeadlock { key, waited } => {
            assert_eq!(key, "order:7");
            assert!(*waited >= wait);
        }
        other => panic!("expected SelfDeadlock, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("`order:7`") && text.contains("guard.scope"),
        "{text}"
    );
    // Trying once is an ordinary "busy".
    assert!(runtime
        .lock("order:7")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
}

/// A task spawned from a locked body is another owner: it times out, and
/// the error is a plain `Timeout` (its own task holds nothing).
async fn a_spawned_task_waiting_for_its_parents_lock_gets_a_plain_timeout(kind: Kind) {
    let runtime = kind.runtime(&unique("spawned")).await;
    let rt = runtime.clone();
    let child = with_lock(runtime.lock("job"), async move {
        let child = tokio::spawn(async move {
            rt.lock("job")
                .wait(Duration::from_millis(200))
                .acquire()
                .await
                .map(drop)
        });
        Ok::<_, LockError>(child.await.unwrap())
    })
    .await
    .unwrap();
    assert!(matches!(child, Err(LockError::Timeout { .. })), "{child:?}");
}

/// Two locked calls side by side in one task (`join!` arms at the top
/// level): the holder's body ends by itself, so the waiter's wait is not a
/// self-deadlock; it takes turns, and here runs out with a plain `Timeout`.
async fn a_join_arm_waiting_for_its_siblings_locked_call_gets_a_plain_timeout(kind: Kind) {
    let runtime = kind.runtime(&unique("joinarms")).await;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = with_lock(runtime.lock("report"), async {
        let _ = done_rx.await;
        Ok::<_, LockError>(())
    });
    let waiter = async {
        let wait = Duration::from_millis(200);
        let outcome = with_lock(runtime.lock("report").wait(wait), async {
            Ok::<_, LockError>(())
        })
        .await;
        let _ = done_tx.send(());
        outcome
    };
    let (held, waited) = tokio::join!(holder, waiter);
    held.unwrap();
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
}

/// Called from a thread with no tokio runtime, a contended acquire waits
/// (timers, release messages), runs its body and releases: on Redis too,
/// where the client's timers used to panic with "there is no reactor
/// running".
async fn locks_work_from_an_executor_other_than_tokio(kind: Kind) {
    let prefix = unique("executor");
    let holder = kind.runtime(&prefix).await;
    let waiter = kind.peer(&holder, &prefix).await;
    let guard = holder.lock("k").acquire().await.unwrap();
    let rt = waiter.clone();
    let thread = std::thread::spawn(move || {
        block_on(async move {
            let body = with_lock(rt.lock("k").wait(Duration::from_secs(10)), async {
                Ok::<_, LockError>(fence())
            })
            .await?;
            let other = rt.lock("other").acquire().await?;
            other.release().await?;
            rt.ping().await?;
            Ok::<_, LockError>(body)
        })
    });
    wait_until("the thread waits", || waiter.stats().waiting_keys == 1).await;
    let held_fence = guard.fence();
    guard.release().await.unwrap();
    let token = thread.join().expect("no panic").unwrap();
    assert!(token.unwrap() > held_fence);
}

/// `let _ = lock(k).acquire().await` frees the key for this process's next
/// acquire at once on both backends (on Redis the release is still sent in
/// the background; the next acquire waits for it).
async fn a_dropped_guard_frees_the_key_for_this_process_at_once(kind: Kind) {
    let runtime = kind.runtime(&unique("dropped")).await;
    for round in 0..100 {
        let guard = runtime.lock("k").acquire().await.unwrap();
        drop(guard);
        let again = runtime.lock("k").try_acquire().await.unwrap();
        assert!(again.is_some(), "round {round}: still busy after the drop");
    }
}

/// `shutdown()` gives back every lock the runtime holds (nested ones once),
/// stops a running body with `ShutDown`, fails the waiters and every later
/// acquire with `ShutDown`, and another client can take the keys at once.
async fn shutdown_releases_every_held_lock_and_refuses_new_ones(kind: Kind) {
    let prefix = unique("shutdown");
    let runtime = kind.runtime(&prefix).await;
    let a = runtime.lock("a").acquire().await.unwrap();
    let b = runtime.lock("b").acquire().await.unwrap();
    let nested = b.scope(runtime.lock("b").acquire()).await.unwrap();
    let rt = runtime.clone();
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let body = tokio::spawn(async move {
        with_lock(rt.lock("c"), async move {
            let _ = entered_tx.send(());
            std::future::pending::<()>().await;
            Ok::<_, LockError>(())
        })
        .await
    });
    entered_rx.await.unwrap();
    let rt = runtime.clone();
    let waiter = tokio::spawn(async move { rt.lock("a").acquire().await.map(drop) });
    wait_until("the waiter waits", || runtime.stats().waiting_keys == 1).await;

    assert_eq!(runtime.shutdown().await.unwrap(), 3);
    assert!(runtime.is_shut_down());
    assert!(matches!(body.await.unwrap(), Err(LockError::ShutDown)));
    assert!(matches!(waiter.await.unwrap(), Err(LockError::ShutDown)));
    assert!(a.is_lost() && b.is_lost());
    assert!(matches!(b.release().await, Err(LockError::ShutDown)));
    drop(nested);
    drop(a);
    assert!(matches!(
        runtime.lock("d").acquire().await,
        Err(LockError::ShutDown)
    ));
    assert_eq!(runtime.stats().held, 0);
    let other = kind.peer(&runtime, &prefix).await;
    for key in ["a", "b", "c"] {
        assert!(
            !other.force_unlock(key).await.unwrap(),
            "`{key}` was still locked after shutdown"
        );
    }
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
        let guard = runtime
            .lock("k")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        drop(guard);
        drop(runtime);
        let start = Instant::now();
        let next = second
            .lock("k")
            .wait(Duration::from_secs(5))
            .acquire()
            .await;
        assert!(next.is_ok(), "round {round}: {next:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        next.unwrap().release().await.unwrap();
    }
    drop(first);
}

/// `LockRuntime::builder()` bounds waits by default ([`DEFAULT_WAIT`]): a
/// request that sets none gives up with an error instead of hanging. (The
/// 30 s default itself is checked in the runtime's unit tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_wait_is_bounded_and_configurable() {
    assert_eq!(lock_runtime::DEFAULT_WAIT, Duration::from_secs(30));
    let runtime = LockRuntime::builder()
        .memory()
        .default_wait(Some(Duration::from_millis(200)))
        .build()
        .await
        .unwrap();
    let _guard = runtime.lock("k").acquire().await.unwrap();
    let rt = runtime.clone();
    let err = tokio::spawn(async move { rt.lock("k").acquire().await.map(drop) })
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
}
