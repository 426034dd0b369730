//! Re-entry and nesting: who owns a hold (a locked body and what it
//! `inherit`s, a guard's `scope`, a task, a task of another executor), when
//! a locked call on a held key re-enters and when it waits its turn, and
//! when a wait is a `SelfDeadlock` rather than a plain `Timeout`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::time::{Duration, Instant};

use lock_runtime::{fence, inherit, with_lock, LockError, LockRuntime};
use lock_testkit::RedisServer;
use lock_tests::{on_every_backend, unique, Kind, Occupancy, Unpark};
use tokio::sync::oneshot;

on_every_backend!(
    two_tasks_of_a_foreign_executor_in_a_tokio_context_are_not_one_task,
    a_guard_moved_to_another_task_is_not_a_self_deadlock,
    reentrancy_three_deep_holds_one_lock,
    hold_count_follows_nesting_and_stays_local,
    sibling_calls_on_a_held_key_take_turns,
    a_guard_scope_lets_calls_on_its_key_reenter_and_see_its_token,
    explicit_guard_outside_any_scope_is_not_reentrant,
    spawned_task_with_inherit_reenters,
    an_inherited_child_and_its_parent_take_turns,
    a_spawned_task_waiting_for_its_parents_lock_times_out_naming_this_process_and_inherit,
    a_join_arm_waiting_for_its_siblings_locked_call_gets_a_plain_timeout,
    a_task_waiting_for_its_own_guard_gets_a_timeout_naming_the_key,
    join_arms_of_one_task_hand_a_guard_over_without_error,
    two_local_set_tasks_are_not_one_task,
    two_spawn_blocking_closures_are_not_one_task,
);

// ---------------------------------------------------------------------------
// Nesting: one hold, one token, however deep
// ---------------------------------------------------------------------------

/// Three nested locked calls on one key: no self-deadlock, one backend hold,
/// the same token all the way down, and the key free only after the outermost.
async fn reentrancy_three_deep_holds_one_lock(kind: Kind) {
    let (runtime, peer) = kind.two("nest").await;
    let rt = &runtime;
    let tokens = with_lock(rt.lock("k").wait(Duration::from_secs(1)), async {
        let outer = fence().unwrap();
        let (middle, inner) = with_lock(rt.lock("k").wait(Duration::from_secs(1)), async {
            let middle = fence().unwrap();
            let inner = with_lock(rt.lock("k").wait(Duration::from_secs(1)), async {
                assert_eq!(rt.stats().held, 1, "nested holds share one backend hold");
                Ok::<_, LockError>(fence().unwrap())
            })
            .await?;
            // The inner release did not free the key: a stranger still can't get it.
            let stranger = tokio::spawn({
                let peer = peer.clone();
                async move { peer.lock("k").try_acquire().await.map(|g| g.is_some()) }
            });
            assert!(!stranger.await.unwrap()?, "key freed by an inner release");
            Ok::<_, LockError>((middle, inner))
        })
        .await?;
        Ok::<_, LockError>((outer, middle, inner))
    })
    .await
    .unwrap();
    assert_eq!(tokens.0, tokens.1);
    assert_eq!(tokens.1, tokens.2);
    assert_eq!(runtime.stats().held, 0);
    // (The outermost call returned before its release was answered: a peer
    // gets the key once the release arrives, long before its 30 s lease.)
    let after = peer.lock("k").wait(Duration::from_secs(1)).acquire().await;
    assert!(
        after.is_ok(),
        "key not free after the outermost release: {after:?}"
    );
}

/// Nested holds are counted in the process: the backend records one hold,
/// `hold_count` says how deep the running code is.
async fn hold_count_follows_nesting_and_stays_local(kind: Kind) {
    let runtime = kind.runtime(&unique("holds")).await;
    assert_eq!(runtime.hold_count("k"), 0);
    let rt = runtime.clone();
    let (outer, inner, recorded) = with_lock(runtime.lock("k"), async {
        let outer = rt.hold_count("k");
        let (inner, recorded) = with_lock(rt.lock("k"), async {
            let info = rt.inspect("k").await?.expect("held");
            Ok::<_, LockError>((rt.hold_count("k"), info.holds))
        })
        .await?;
        Ok::<_, LockError>((outer, inner, recorded))
    })
    .await
    .unwrap();
    assert_eq!((outer, inner, recorded), (1, 2, 1));
    assert_eq!(runtime.hold_count("k"), 0, "outside every locked body");
    // A guard outside any scope is not "around" the caller...
    let guard = runtime.lock("k").acquire().await.unwrap();
    assert_eq!(runtime.hold_count("k"), 0);
    // ...until the code runs inside its scope.
    let rt = runtime.clone();
    assert_eq!(guard.scope(async move { rt.hold_count("k") }).await, 1);
}

/// Both arms of a `join!` inside a locked body, each locked on the same key:
/// each re-enters (the parent holds the key), but never both at once; a
/// call nested in an arm re-enters below it.
async fn sibling_calls_on_a_held_key_take_turns(kind: Kind) {
    let runtime = kind.runtime(&unique("siblings")).await;
    let rt = &runtime;
    let inside = Occupancy::new();
    let arm = |name: &'static str| {
        let inside = &inside;
        with_lock(rt.lock("k").wait(Duration::from_secs(5)), async move {
            let _token = inside.enter();
            let outer = fence();
            tokio::time::sleep(Duration::from_millis(30)).await;
            // Nested below this arm: re-enters at once.
            let nested = with_lock(rt.lock("k").wait(Duration::ZERO), async {
                Ok::<_, LockError>(fence())
            })
            .await?;
            assert_eq!(nested, outer);
            tokio::time::sleep(Duration::from_millis(30)).await;
            Ok::<_, LockError>(name)
        })
    };
    let (a, b, token) = with_lock(rt.lock("k"), async {
        let (a, b) = tokio::join!(arm("a"), arm("b"));
        Ok::<_, LockError>((a?, b?, fence()))
    })
    .await
    .unwrap();
    assert_eq!((a, b), ("a", "b"));
    assert!(token.is_some());
    assert_eq!(inside.max(), 1, "two sibling bodies were inside at once");
    assert_eq!(runtime.stats().held, 0);
}

/// Siblings wait for each other in the process: the turns cost no Redis
/// command (a private server, so other tests' traffic does not count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sibling_turns_send_no_redis_command() {
    let server = RedisServer::start();
    let runtime = LockRuntime::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap();
    let rt = &runtime;
    let arm = || {
        with_lock(rt.lock("k"), async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, LockError>(())
        })
    };
    let mut con = server.connection().await;
    let before = commands(&mut con).await;
    with_lock(rt.lock("k"), async {
        let marks = commands(&mut con).await;
        let (a, b, c) = tokio::join!(arm(), arm(), arm());
        a?;
        b?;
        c?;
        let after = commands(&mut con).await;
        // The INFO calls themselves count one each.
        assert_eq!(after - marks, 1, "sibling turns sent Redis commands");
        Ok::<_, LockError>(())
    })
    .await
    .unwrap();
    assert!(commands(&mut con).await > before);
}

/// Commands the server has processed (`INFO stats`).
async fn commands(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

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

/// Outside any locked body each explicit acquire is its own owner, so a
/// second acquire of a held key waits like anybody else's.
async fn explicit_guard_outside_any_scope_is_not_reentrant(kind: Kind) {
    let runtime = kind.runtime(&unique("plain")).await;
    let _held = runtime.lock("k").acquire().await.unwrap();
    let again = runtime.lock("k").try_acquire().await.unwrap();
    assert!(again.is_none());
}

// ---------------------------------------------------------------------------
// Tasks: strangers unless they inherit
// ---------------------------------------------------------------------------

/// With `inherit`, the spawned task shares the caller's owner scope and
/// re-enters at once, with the caller's token; the lock stays held until the
/// child is done even if the parent finishes first.
async fn spawned_task_with_inherit_reenters(kind: Kind) {
    let (runtime, peer) = kind.two("inherit").await;
    let rt = runtime.clone();
    let (release_child, child_may_finish) = tokio::sync::oneshot::channel::<()>();
    let (child_in, child_has_it) = tokio::sync::oneshot::channel::<()>();
    let (child, parent_token) = with_lock(runtime.lock("job"), async move {
        let child = tokio::spawn(inherit(async move {
            let request = rt.lock("job").wait(Duration::from_millis(500));
            let guard = request.acquire().await?;
            let token = guard.fence();
            let _ = child_in.send(());
            let _ = child_may_finish.await;
            guard.release().await?;
            Ok::<_, LockError>(token)
        }));
        // Finish only once the child holds the key too.
        child_has_it.await.expect("child acquired");
        Ok::<_, LockError>((child, fence().unwrap()))
    })
    .await
    .unwrap();
    // The parent is done; the child still holds the key.
    let stranger = peer.lock("job").try_acquire().await.unwrap();
    assert!(
        stranger.is_none(),
        "lock freed while the inheriting child held it"
    );
    release_child.send(()).unwrap();
    let child_token = child.await.unwrap().unwrap();
    assert_eq!(child_token, parent_token);
    let request = peer.lock("job").wait(Duration::from_secs(1));
    let after = request.acquire().await;
    assert!(after.is_ok(), "lock not freed after the child released");
}

/// An `inherit`ed child that holds the key makes its parent's next locked
/// call on that key wait until the child is done (and not the other way
/// round: the child re-enters the parent's hold at once).
async fn an_inherited_child_and_its_parent_take_turns(kind: Kind) {
    let runtime = kind.runtime(&unique("inherit-turns")).await;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let rt = runtime.clone();
    let log = order.clone();
    with_lock(runtime.lock("k"), async move {
        let child = tokio::spawn(inherit({
            let (rt, log) = (rt.clone(), log.clone());
            async move {
                with_lock(rt.lock("k").wait(Duration::ZERO), async {
                    log.lock().unwrap().push("child in");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    log.lock().unwrap().push("child out");
                    Ok::<_, LockError>(())
                })
                .await
            }
        }));
        // Let the child enter first.
        for _ in 0..200 {
            if !log.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        with_lock(rt.lock("k").wait(Duration::from_secs(5)), async {
            log.lock().unwrap().push("parent in");
            Ok::<_, LockError>(())
        })
        .await?;
        child.await.unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        ["child in", "child out", "parent in"],
        "the parent's nested call entered while the child held the key"
    );
}

/// A task spawned from a locked body without `inherit` is another owner:
/// it waits instead of re-entering and times out; the timeout says that this
/// same process holds the key and points to `inherit` (a plain "timed out"
/// read as contention with some other process).
async fn a_spawned_task_waiting_for_its_parents_lock_times_out_naming_this_process_and_inherit(
    kind: Kind,
) {
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
    let Err(LockError::Timeout { cause, .. }) = &child else {
        panic!("expected a timeout: {child:?}");
    };
    assert!(cause.held_by_this_process(), "{child:?}");
    assert!(cause.backend_error().is_none(), "{child:?}");
    let text = child.unwrap_err().to_string();
    assert!(text.contains("this same process holds the lock"), "{text}");
    assert!(text.contains("lock_runtime::inherit"), "{text}");
}

/// Two locked calls side by side in one task (`join!` arms at the top
/// level): the holder's body ends by itself, so the waiter's wait is not a
/// self-deadlock; it takes turns, and here runs out with a plain `Timeout`.
async fn a_join_arm_waiting_for_its_siblings_locked_call_gets_a_plain_timeout(kind: Kind) {
    let runtime = kind.runtime(&unique("joinarms")).await;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = with_lock(runtime.lock("report"), async {
        let _ = inside_tx.send(());
        let _ = done_rx.await;
        Ok::<_, LockError>(())
    });
    let waiter = async {
        // Two acquires sent at once reach etcd in either order (each gRPC
        // stream is served on its own): the waiter starts once the holder
        // is inside.
        let _ = inside_rx.await;
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

// ---------------------------------------------------------------------------
// SelfDeadlock: only for a wait that cannot end
// ---------------------------------------------------------------------------

/// Acquiring a key the same task holds through a guard cannot succeed (the
/// task is busy waiting): it ends at its deadline with a `Timeout` naming
/// the key. (Not `SelfDeadlock`: the runtime cannot tell this from a guard
/// handed to another task, see `a_guard_moved_to_another_task_is_not_a_self_deadlock`;
/// the wait's start logs a warning naming the key and `guard.scope`, checked
/// in lock-runtime's held.rs.)
async fn a_task_waiting_for_its_own_guard_gets_a_timeout_naming_the_key(kind: Kind) {
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
        LockError::Timeout { key, waited, .. } => {
            assert_eq!(key, "order:7");
            assert!(*waited >= wait);
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("`order:7`"), "{text}");
    // Trying once is an ordinary "busy".
    assert!(runtime
        .lock("order:7")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
}

/// Both arms of one `join!` (one task): one holds a guard and gives it back
/// after a while; the other, waiting for it, gets the key, no error.
async fn join_arms_of_one_task_hand_a_guard_over_without_error(kind: Kind) {
    let runtime = kind.runtime(&unique("rv-join")).await;
    let guard = runtime.lock("k").acquire().await.unwrap();
    let token = guard.fence();
    let (released, got) = tokio::join!(
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await
        },
        runtime.lock("k").wait(Duration::from_secs(5)).acquire()
    );
    released.unwrap();
    let got = got.unwrap();
    assert!(got.fence() > token);
    got.release().await.unwrap();
}

/// A holder and a waiter of `k` on `runtime`, for a test to run as two
/// tasks of the kind it means: the holder takes `k` and keeps it until the
/// waiter has tried it for 300 ms; the waiter returns how that ended.
fn holder_and_waiter(
    runtime: &LockRuntime,
) -> (
    impl Future<Output = Result<(), LockError>> + Send + 'static,
    impl Future<Output = Result<(), LockError>> + Send + 'static,
) {
    let (held_tx, held_rx) = oneshot::channel::<()>();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let rt = runtime.clone();
    let holder = async move {
        let guard = rt.lock("k").acquire().await.unwrap();
        held_tx.send(()).unwrap();
        let _ = release_rx.await;
        guard.release().await
    };
    let rt = runtime.clone();
    let waiter = async move {
        held_rx.await.unwrap();
        let request = rt.lock("k").wait(Duration::from_millis(300));
        let got = request.acquire().await.map(drop);
        release_tx.send(()).unwrap();
        got
    };
    (holder, waiter)
}

/// Two `spawn_local` tasks of one `LocalSet` (one thread) are two tasks:
/// the waiter's wait ends with a plain `Timeout`.
async fn two_local_set_tasks_are_not_one_task(kind: Kind) {
    let runtime = kind.runtime(&unique("rv-localset")).await;
    let local = tokio::task::LocalSet::new();
    let got = local
        .run_until(async {
            let (holder, waiter) = holder_and_waiter(&runtime);
            let holder = tokio::task::spawn_local(holder);
            let waiter = tokio::task::spawn_local(waiter);
            let got = waiter.await.unwrap();
            holder.await.unwrap().unwrap();
            // And the `run_until` future itself against a local task.
            let guard = runtime.lock("k").acquire().await.unwrap();
            let rt = runtime.clone();
            let other = tokio::task::spawn_local(async move {
                rt.lock("k")
                    .wait(Duration::from_millis(200))
                    .acquire()
                    .await
                    .map(drop)
            })
            .await
            .unwrap();
            guard.release().await.unwrap();
            (got, other)
        })
        .await;
    assert!(matches!(got.0, Err(LockError::Timeout { .. })), "{got:?}");
    assert!(matches!(got.1, Err(LockError::Timeout { .. })), "{got:?}");
}

/// Two `spawn_blocking` closures that each `Handle::block_on` a lock
/// future are two tasks, whichever pool thread they land on.
async fn two_spawn_blocking_closures_are_not_one_task(kind: Kind) {
    let runtime = kind.runtime(&unique("rv-blocking")).await;
    let (holder, waiter) = holder_and_waiter(&runtime);
    let handle = tokio::runtime::Handle::current();
    let holder = tokio::task::spawn_blocking(move || handle.block_on(holder));
    let handle = tokio::runtime::Handle::current();
    let waiter = tokio::task::spawn_blocking(move || handle.block_on(waiter));
    let got = waiter.await.unwrap();
    holder.await.unwrap().unwrap();
    assert!(matches!(got, Err(LockError::Timeout { .. })), "{got:?}");
}

/// A guard taken by one task and moved to another (guards are `Send`;
/// handing one to a worker task is ordinary): the taker's bounded wait for
/// the key ends with a plain `Timeout`, not `SelfDeadlock` ("which this
/// same task holds"), since another task holds it and may release it any
/// moment. (The runtime cannot see the move, so it never gives that
/// verdict: see `HeldTable::taken_by_this_task`.)
async fn a_guard_moved_to_another_task_is_not_a_self_deadlock(kind: Kind) {
    let runtime = kind.runtime(&unique("rv-moved-guard")).await;
    let guard = runtime.lock("k").acquire().await.unwrap();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let holder = tokio::spawn(async move {
        let _ = release_rx.await;
        guard.release().await
    });
    let err = runtime
        .lock("k")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .map(drop)
        .unwrap_err();
    release_tx.send(()).unwrap();
    holder.await.unwrap().unwrap();
    assert!(
        matches!(err, LockError::Timeout { .. }),
        "another task holds the guard, yet: {err}"
    );
}

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A foreign executor running several independent tasks on one thread, each
/// poll inside `handle`'s tokio context: what `async_compat::Compat` does for
/// smol or async-std tasks that use tokio-based libraries.
fn run_tasks_in_context(handle: &tokio::runtime::Handle, tasks: Vec<Task>) {
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut tasks: Vec<Option<Task>> = tasks.into_iter().map(Some).collect();
    let give_up = Instant::now() + Duration::from_secs(20);
    while tasks.iter().any(Option::is_some) {
        for slot in &mut tasks {
            if let Some(task) = slot {
                let _entered = handle.enter();
                if task.as_mut().poll(&mut cx).is_ready() {
                    *slot = None;
                }
            }
        }
        assert!(Instant::now() < give_up, "a task was never woken");
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

/// Two independent tasks of a foreign executor (smol, async-std) whose
/// polls enter a tokio context, as `async_compat::Compat` does, on one
/// thread and (as a crude executor may) under one waker: the second one's
/// wait for the first one's guard ends in `Timeout`, not `SelfDeadlock`.
async fn two_tasks_of_a_foreign_executor_in_a_tokio_context_are_not_one_task(kind: Kind) {
    let runtime = kind.runtime(&unique("rv-compat")).await;
    let handle = tokio::runtime::Handle::current();
    let (held_tx, held_rx) = oneshot::channel::<()>();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let (result_tx, result_rx) = oneshot::channel();
    let (rt1, rt2) = (runtime.clone(), runtime.clone());
    let first: Task = Box::pin(async move {
        let guard = rt1.lock("k").acquire().await.unwrap();
        held_tx.send(()).unwrap();
        let _ = release_rx.await;
        guard.release().await.unwrap();
    });
    let second: Task = Box::pin(async move {
        held_rx.await.unwrap();
        let got = rt2
            .lock("k")
            .wait(Duration::from_millis(300))
            .acquire()
            .await
            .map(drop);
        release_tx.send(()).unwrap();
        result_tx.send(got).unwrap();
    });
    let thread = std::thread::spawn(move || run_tasks_in_context(&handle, vec![first, second]));
    tokio::task::spawn_blocking(move || thread.join())
        .await
        .unwrap()
        .expect("no panic");
    let got = result_rx.await.unwrap();
    assert!(
        matches!(got, Err(LockError::Timeout { .. })),
        "another task of the executor holds the guard, yet: {got:?}"
    );
}
