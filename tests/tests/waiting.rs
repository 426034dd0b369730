//! Waiting and wake-ups: a bounded wait ends on time (and tries once more
//! at its deadline), a try-once within the try timeout whatever the
//! network does, a release or a lease end wakes the waiters at once (also
//! after a lost subscription), and a wait completes on any executor.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use lock_runtime::{fence, with_lock, LockError};
use lock_tests::{
    acquire_elsewhere, behind_proxy, block_on, builder_at, on_every_backend, redis, runtime_at,
    spawn_acquire, timing_turn, unique, wait_until, FaultProxy, Kind, Unpark,
};
use tokio::time::Instant;

on_every_backend!(
    a_tokio_runtime_without_timers_can_take_locks,
    wait_timeout_returns_timeout_within_ten_percent,
    zero_wait_on_held_lock_times_out_at_once,
    release_wakes_waiter_without_waiting_for_the_lease,
    many_waiters_each_get_the_lock_once,
    a_queued_waiter_tries_when_the_holder_lease_ends,
    locks_work_from_an_executor_other_than_tokio,
    an_acquire_moved_between_executors_mid_wait_completes,
);

/// Scheduling slack allowed on top of every computed bound.
const SLACK: Duration = Duration::from_millis(150);

// ---------------------------------------------------------------------------
// Bounded waits and tries
// ---------------------------------------------------------------------------

/// A 500 ms wait on a held lock ends with `Timeout` between 500 and 550 ms.
async fn wait_timeout_returns_timeout_within_ten_percent(kind: Kind) {
    let (holder, waiter) = kind.two("wait").await;
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
        LockError::Timeout { key, waited, .. } => {
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
    let (holder, waiter) = kind.two("zero").await;
    let _guard = holder.lock("busy").acquire().await.unwrap();
    let start = Instant::now();
    let request = waiter.lock("busy").wait(Duration::ZERO);
    let err = request.acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_millis(100));
}

/// A bounded wait whose deadline passes while it sleeps tries once more:
/// here the lock vanished without a release message (deleted by hand), and
/// the holder's lease was far away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_makes_a_last_try_at_its_deadline() {
    let _turn = timing_turn().await;
    let prefix = unique("last-try");
    let holder = runtime_at(&redis().url(), &prefix).await;
    let waiter = runtime_at(&redis().url(), &prefix).await;
    let held = holder.lock("k").acquire().await.unwrap();
    let begun = Instant::now();
    let waiting = spawn_acquire(waiter.lock("k").wait(Duration::from_millis(600)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut con = redis().connection().await;
    let _: () = redis::cmd("DEL")
        .arg(holder.backend_key("k"))
        .query_async(&mut con)
        .await
        .unwrap();
    let (ended, got) = waiting.await.unwrap();
    let took = ended - begun;
    assert!(got.is_ok(), "{got:?}: no last try before the timeout");
    assert!(
        took >= Duration::from_millis(600),
        "{took:?}: woken before its deadline"
    );
    assert!(took <= Duration::from_millis(600) + SLACK, "{took:?}");
    drop(held);
}

/// A try-once takes at most the try timeout (250 ms by default), however
/// the network behaves; no answer in time is a backend error, not "busy".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_once_answers_within_the_try_timeout_when_the_network_stalls() {
    let _turn = timing_turn().await;
    let prefix = unique("try-once");
    let (proxy, runtime) = behind_proxy(&prefix).await;
    let bound = lock_runtime::DEFAULT_TRY_TIMEOUT + SLACK;

    proxy.stall();
    let begun = Instant::now();
    let tried = runtime.lock("k").try_acquire().await;
    let took = begun.elapsed();
    assert!(matches!(tried, Err(LockError::Backend(_))), "{tried:?}");
    assert!(
        took <= bound,
        "try_acquire took {took:?} on a stalled network"
    );

    let begun = Instant::now();
    let once = runtime.lock("k").wait(Duration::ZERO).acquire().await;
    let took = begun.elapsed();
    assert!(matches!(once, Err(LockError::Backend(_))), "{once:?}");
    assert!(took <= bound, "wait(ZERO) took {took:?}");

    let begun = Instant::now();
    let request = runtime.lock("k").wait(Duration::from_millis(50));
    let short = request.acquire().await;
    let took = begun.elapsed();
    assert!(matches!(short, Err(LockError::Timeout { .. })), "{short:?}");
    assert!(
        took <= Duration::from_millis(50) + SLACK,
        "wait(50ms) took {took:?}"
    );

    // Redis unreachable: connections cut and refused.
    proxy.resume();
    proxy.refuse(true);
    proxy.drop_connections();
    let begun = Instant::now();
    let down = runtime.lock("k").try_acquire().await;
    let took = begun.elapsed();
    assert!(down.is_err(), "{down:?}");
    assert!(
        took <= bound,
        "try_acquire took {took:?} with Redis unreachable"
    );
    proxy.refuse(false);
    eprintln!(
        "try-once bound {:?} held on a stalled and on a refused network",
        lock_runtime::DEFAULT_TRY_TIMEOUT
    );
}

/// A dropped guard's release stuck behind a stalled network does not hold
/// up a try-once past its try timeout (it reports `Backend`), and once the
/// network is back the count settles and the key is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_release_does_not_stretch_a_try_past_its_timeout() {
    let proxy = FaultProxy::start(redis().port()).await;
    let prefix = unique("rv-stuck");
    let builder = builder_at(&proxy.url(), &prefix).try_timeout(Duration::from_millis(200));
    let runtime = builder.build().await.unwrap();
    let guard = runtime.lock("k").acquire().await.unwrap();
    proxy.stall();
    drop(guard);
    let start = Instant::now();
    let tried = runtime.lock("k").try_acquire().await;
    let took = start.elapsed();
    assert!(matches!(tried, Err(LockError::Backend(_))), "{tried:?}");
    assert!(took < Duration::from_millis(400), "took {took:?}");
    proxy.resume();
    let request = runtime.lock("k").wait(Duration::from_secs(5));
    let again = request.acquire().await;
    assert!(again.is_ok(), "{again:?}");
    drop(again);
    runtime.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Wake-ups
// ---------------------------------------------------------------------------

/// A waiter behind a 30 s lease gets the lock right after the release, not
/// after the lease: the release message wakes it.
async fn release_wakes_waiter_without_waiting_for_the_lease(kind: Kind) {
    let (holder, waiter) = kind.two("wake").await;
    let request = holder.lock("k").lease(Duration::from_secs(30));
    let guard = request.acquire().await.unwrap();
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
    let (runtime, peer) = kind.two("queue").await;
    let first = runtime.lock("q").acquire().await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let rt = [&runtime, &peer][i % 2].clone();
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

/// Defect: a waiter that queued behind other waiters of its process slept
/// on its own lease or deadline; when the key's holder (a local waiter that
/// had taken it) let it end by expiry, nobody was woken, and the waiters
/// timed out with the key free.
async fn a_queued_waiter_tries_when_the_holder_lease_ends(kind: Kind) {
    let _turn = timing_turn().await;
    let prefix = unique("expiry");
    let runtime = kind.runtime(&prefix).await;
    let first = runtime.lock("k").acquire().await.unwrap();
    let spawn_waiter = |lease: Duration, fixed: bool| {
        let runtime = runtime.clone();
        tokio::spawn(async move {
            let guard = runtime
                .lock("k")
                .lease(lease)
                .watchdog(!fixed)
                .wait(Duration::from_secs(5))
                .acquire()
                .await;
            (guard, Instant::now())
        })
    };
    // The head: will hold with a fixed 600 ms lease and never release.
    let head = spawn_waiter(Duration::from_millis(600), true);
    wait_until("the head waits", || runtime.stats().waiting_keys == 1).await;
    // Two more queue behind it, in this order. (Each waits until the one
    // before it is queued: a task spawned first may still be queued
    // second on a loaded machine, and a third that got the key before the
    // second would hold it until the end, as the test only releases it
    // after the second's turn.)
    let second = spawn_waiter(Duration::from_secs(30), false);
    wait_until("the second waits", || runtime.stats().waiting == 2).await;
    let third = spawn_waiter(Duration::from_secs(30), false);
    wait_until("the third waits", || runtime.stats().waiting == 3).await;
    first.release().await.unwrap();
    let (head_guard, head_at) = head.await.unwrap();
    let head_guard = head_guard.unwrap();
    let (second_guard, second_at) = second.await.unwrap();
    let second_guard = second_guard.expect("the second waiter timed out with the key free");
    let waited = second_at - head_at;
    eprintln!("{kind:?}: the head's 600 ms lease ran out; the next waiter got the key {waited:?} after the head");
    assert!(
        waited >= Duration::from_millis(550),
        "{waited:?}: before the lease ended"
    );
    // etcd keeps a lease in whole seconds and revokes expired leases every
    // 500 ms: a 600 ms fixed lease ends there within 1.5 s (README "etcd").
    let ends = if matches!(kind, Kind::Etcd | Kind::Etcd3) {
        Duration::from_millis(1500)
    } else {
        Duration::from_millis(600)
    };
    assert!(waited <= ends + SLACK, "{waited:?}");
    assert!(head_guard.is_lost());
    drop(second_guard);
    let (third_guard, _) = third.await.unwrap();
    drop(third_guard.expect("the third waiter"));
}

/// Defect: a SUBSCRIBE lost to a dropped connection was never sent again;
/// waiters then learned of releases only from the holder's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_subscribe_is_retried_and_waiters_are_woken_promptly() {
    let _turn = timing_turn().await;
    let prefix = unique("lost-subscribe");
    let proxy = FaultProxy::start(redis().port()).await;
    let holder = runtime_at(&redis().url(), &prefix).await;
    let waiter = runtime_at(&proxy.url(), &prefix).await;
    let held = holder.lock("k").acquire().await.unwrap();
    proxy.drop_at_command("SUBSCRIBE");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let request = waiter.lock("k").wait(Duration::from_secs(20));
            let guard = request.acquire().await;
            (guard, Instant::now())
        }
    });
    // The subscription reaches the server in the end.
    let channel = format!("{}:released", holder.backend_key("k"));
    let mut con = redis().connection().await;
    let mut subscribed = false;
    for _ in 0..300 {
        let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut con)
            .await
            .unwrap();
        if matches!(reply.get(1), Some(redis::Value::Int(n)) if *n >= 1) {
            subscribed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(proxy.dropped_at_command(), 1, "the SUBSCRIBE was not cut");
    assert!(subscribed, "the lost SUBSCRIBE was never sent again");
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (guard, got_at) = waiting.await.unwrap();
    drop(guard.unwrap());
    let woken = got_at - released_at;
    eprintln!("lost SUBSCRIBE: re-subscribed; the waiter got the key {woken:?} after the release");
    assert!(
        woken <= Duration::from_millis(500),
        "{woken:?}: not woken by the release"
    );
}

// ---------------------------------------------------------------------------
// Any executor
// ---------------------------------------------------------------------------

/// Called from a thread with no tokio runtime, a contended acquire waits
/// (timers, release messages), runs its body and releases: on Redis too,
/// where the client's timers used to panic with "there is no reactor
/// running".
async fn locks_work_from_an_executor_other_than_tokio(kind: Kind) {
    let (holder, waiter) = kind.two("executor").await;
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

/// An acquire that starts waiting on a thread without tokio (it borrows the
/// runtime's context), is moved into a tokio task, and finishes there; and
/// one that starts in tokio and finishes on the plain thread.
async fn an_acquire_moved_between_executors_mid_wait_completes(kind: Kind) {
    let (holder, waiter) = kind.two("rv-move-fut").await;
    type Acquiring =
        Pin<Box<dyn Future<Output = Result<lock_runtime::LockGuard, LockError>> + Send>>;

    // Plain thread first, then tokio.
    let guard = holder.lock("k").acquire().await.unwrap();
    let w = waiter.clone();
    let started = std::thread::spawn(move || {
        let waker = Arc::new(Unpark(std::thread::current())).into();
        let mut cx = Context::from_waker(&waker);
        let mut fut: Acquiring = Box::pin(w.lock("k").wait(Duration::from_secs(10)).acquire());
        let give_up = Instant::now() + Duration::from_secs(5);
        while w.stats().waiting_keys == 0 {
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            assert!(Instant::now() < give_up, "never started waiting");
            std::thread::park_timeout(Duration::from_millis(5));
        }
        fut
    })
    .join()
    .expect("no panic");
    let token = guard.fence();
    guard.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), started)
        .await
        .expect("the moved acquire was never woken")
        .unwrap();
    assert!(got.fence() > token);
    let token = got.fence();

    // Tokio first, then a plain thread.
    let mut fut: Acquiring = Box::pin(waiter.lock("k").wait(Duration::from_secs(10)).acquire());
    tokio::select! {
        biased;
        r = &mut fut => panic!("finished while `k` was held: {r:?}"),
        () = wait_until("the second acquire waits", || waiter.stats().waiting_keys == 1) => {}
    }
    let finished = std::thread::spawn(move || block_on(fut));
    got.release().await.unwrap();
    let last = tokio::task::spawn_blocking(move || finished.join())
        .await
        .unwrap()
        .expect("no panic")
        .unwrap();
    assert!(last.fence() > token);
    last.release().await.unwrap();
}

/// A caller inside a tokio runtime built without timers (`enable_io()`
/// only: a tokio context, but no time driver) takes, waits for, holds
/// through a locked body and releases locks: the acquire's timers, the
/// waiter's sleeps, the body's lease-end watch and the Redis client's
/// response timeouts belong to the lock runtime's context, never to the
/// caller's, so nothing panics with "timers are disabled".
async fn a_tokio_runtime_without_timers_can_take_locks(kind: Kind) {
    let runtime = kind.runtime(&unique("rv-no-timers")).await;
    let rt = runtime.clone();
    let outcome = std::thread::spawn(move || {
        let io_only = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        io_only.block_on(async move {
            let guard = rt.lock("k").acquire().await?;
            let request = rt.lock("k").wait(Duration::from_millis(100));
            let waited = acquire_elsewhere(request).await.map(drop);
            assert!(
                matches!(waited, Err(LockError::Timeout { .. })),
                "{waited:?}"
            );
            let token = with_lock(rt.lock("other"), async {
                tokio::task::yield_now().await;
                Ok::<_, LockError>(fence())
            })
            .await?;
            assert!(token.is_some());
            guard.release().await
        })
    })
    .join();
    match outcome {
        Ok(result) => result.unwrap(),
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            panic!("the acquire panicked: {text}");
        }
    }
}

/// A nested call that re-enters a hold while the connection is down: the
/// entry gate wants a renewal to confirm the hold, none can come, and the
/// call ends in `Timeout` by its wait's deadline plus the try timeout,
/// not when the connection comes back. (It once went round the gate again
/// and again until a renewal got through: 2.6 s for a 288 ms wait in the
/// nemesis.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_the_gate_cannot_confirm_ends_by_its_deadline() {
    let _turn = timing_turn().await;
    let (proxy, runtime) = behind_proxy(&unique("reenter-down")).await;
    let request = runtime.lock("k").lease(Duration::from_secs(20));
    let outer = request.acquire().await.unwrap();
    proxy.refuse(true);
    proxy.drop_connections();
    // The connection is lost: its epoch moves on (waited for, bounded).
    let lost = Instant::now() + Duration::from_secs(5);
    while runtime.stats().connections_lost == 0 {
        assert!(
            Instant::now() < lost,
            "the runtime never saw its connection drop"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let wait = Duration::from_millis(300);
    let begun = Instant::now();
    let nested = outer.scope(runtime.lock("k").wait(wait).acquire()).await;
    let took = begun.elapsed();
    proxy.refuse(false);
    assert!(
        matches!(nested, Err(LockError::Timeout { .. })),
        "{nested:?}"
    );
    let bound = wait + lock_runtime::DEFAULT_TRY_TIMEOUT * 2 + SLACK;
    assert!(
        took <= bound,
        "a {wait:?} wait took {took:?} (bound {bound:?})"
    );
    drop(outer);
}
