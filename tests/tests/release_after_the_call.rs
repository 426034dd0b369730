//! A locked call returns when its body is done, without waiting for its
//! release's answer, when its hold was known valid to the body's end (see
//! `with_lock`): one round trip per uncontended call. What that must not
//! cost: the key is free for this process's next call and for its peers at
//! once, and a hold the release finds gone still reaches someone (counted
//! and logged; an error with `on_lost = "confirm"`). A release that gets no
//! answer, awaited or not, is sent again in the background: the key does not
//! stay taken until its lease ends.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::{with_lock, LockError, LockRuntime, OnLost};
use lock_testkit::RedisServer;
use lock_tests::looked::at_once;
use lock_tests::{
    behind_proxy, builder_at, on_every_backend, redis, unique, until_queued, wait_until,
    FaultProxy, Kind,
};

on_every_backend!(
    a_returned_call_leaves_its_key_free_for_this_process_and_its_peers,
    a_hold_found_gone_at_its_release_is_counted_or_with_confirm_an_error,
);

/// After a locked call returns, this process reads its key free and takes
/// it again at once, calls in a row get growing tokens, and a peer's
/// acquire gets the key without waiting for a lease to run out.
async fn a_returned_call_leaves_its_key_free_for_this_process_and_its_peers(kind: Kind) {
    let (runtime, peer) = kind.two("behind").await;
    let key = unique("behind-key");
    let mut last = 0;
    for _ in 0..10 {
        let fence = with_lock(runtime.lock(&key), async {
            Ok::<_, LockError>(lock_runtime::fence())
        })
        .await
        .expect("an uncontended call");
        let fence = fence.expect("a token inside the body");
        assert!(fence > last, "tokens grow: {fence} after {last}");
        last = fence;
        assert_eq!(
            runtime.inspect(&key).await.unwrap(),
            None,
            "this process reads the key free once its call returned"
        );
    }
    let again = at_once(
        runtime.lock(&key),
        "this process takes the key again at once",
    )
    .await;
    again.release().await.unwrap();

    with_lock(runtime.lock(&key), async { Ok::<_, LockError>(()) })
        .await
        .unwrap();
    let started = Instant::now();
    let theirs = peer.lock(&key).wait(PATIENCE).acquire().await;
    let theirs = theirs.expect("a peer takes the key after the call returned");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the peer waited {:?}: the release did not go out (the lease is 30 s)",
        started.elapsed()
    );
    assert!(theirs.fence() > last);
    theirs.release().await.unwrap();
}

/// A body whose lock is deleted under it (a forced release) and that ends
/// before any renewal: by default the call returns the body's result (or
/// `Lost`, if the backend told the holder first) and the runtime counts the
/// loss that its release found; with `on_lost = "confirm"` the call always
/// ends in `Lost`.
async fn a_hold_found_gone_at_its_release_is_counted_or_with_confirm_an_error(kind: Kind) {
    let (runtime, peer) = kind.two("gone").await;
    let key = unique("gone-key");
    let (peer, key) = (&peer, &key);
    let force = || async move {
        assert!(
            peer.force_unlock(key).await.unwrap(),
            "nothing to force free"
        );
        Ok::<_, LockError>(7)
    };

    let before = runtime.stats().lost_at_release;
    match with_lock(runtime.lock(key), force()).await {
        Ok(7) => {
            wait_until("the release to find the hold gone", || {
                runtime.stats().lost_at_release > before
            })
            .await;
        }
        // (The backend told the holder of the deletion before the body
        // ended: the loss was the call's error.)
        Err(LockError::Lost { key: lost }) => assert_eq!(&lost, key),
        other => panic!("expected Ok(7) or Lost, got {other:?}"),
    }

    let confirmed = with_lock(runtime.lock(key).on_lost(OnLost::Confirm), force()).await;
    match confirmed {
        Err(LockError::Lost { key: lost }) => assert_eq!(&lost, key),
        other => panic!("on_lost = confirm: expected Lost, got {other:?}"),
    }
    assert_eq!(runtime.stats().held, 0);
}

/// On one Redis server the release is written to the connection before the
/// call returns, so the next call's acquire follows it on the same
/// connection and need not wait for its answer: calls in a row cost one
/// round trip each, where an awaited release cost two. Measured through a
/// proxy that adds 40 ms each way, so that round trips dwarf the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_a_row_on_one_redis_server_cost_one_round_trip_each() {
    let (proxy, runtime) = behind_proxy(&unique("one-trip")).await;
    proxy.slow(Some(Duration::from_millis(40)));
    let key = unique("one-trip-key");
    let mut rtt = Duration::MAX;
    for _ in 0..3 {
        rtt = rtt.min(runtime.ping().await.unwrap());
    }
    // The median call of each kind: a stall of the machine during one call
    // (a loaded CI runner) moves it, not the verdict.
    const CALLS: usize = 7;
    let median = |mut took: Vec<Duration>| {
        took.sort();
        took[CALLS / 2]
    };
    let mut behind = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let started = Instant::now();
        with_lock(runtime.lock(&key), async { Ok::<_, LockError>(()) })
            .await
            .unwrap();
        behind.push(started.elapsed());
    }
    let behind = median(behind);
    assert!(
        behind < rtt * 3 / 2,
        "a call took {behind:?} (median) with a round trip of {rtt:?}: more than one round trip"
    );
    // `confirm` still waits for the release's answer: two each.
    let mut confirmed = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let started = Instant::now();
        with_lock(runtime.lock(&key).on_lost(OnLost::Confirm), async {
            Ok::<_, LockError>(())
        })
        .await
        .unwrap();
        confirmed.push(started.elapsed());
    }
    let confirmed = median(confirmed);
    assert!(
        confirmed > rtt * 2 * 9 / 10,
        "a confirmed call took {confirmed:?} (median) with a round trip of {rtt:?}"
    );
    proxy.slow(None);
}

/// A call whose release cannot be answered (the connection stalls as the
/// body ends) still returns at once; the release goes through when the
/// connection does, and frees the key for a peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_returns_while_its_release_is_unanswered() {
    let prefix = unique("unanswered");
    let (proxy, runtime) = behind_proxy(&prefix).await;
    let peer = Kind::Redis.runtime(&prefix).await;
    let key = unique("unanswered-key");
    let started = Instant::now();
    with_lock(runtime.lock(&key), async {
        proxy.stall();
        Ok::<_, LockError>(())
    })
    .await
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the call waited {:?} for a release that could not be answered",
        started.elapsed()
    );
    assert!(
        peer.is_locked(&key).await.unwrap(),
        "the release cannot have reached the server yet"
    );
    proxy.resume();
    let theirs = peer.lock(&key).wait(PATIENCE).acquire().await;
    let theirs = theirs.expect("the release went through once the connection did");
    theirs.release().await.unwrap();
}

/// `on_lost = "confirm"` finds a hold the server lost during the body
/// (evicted, deleted: no release message, no renewal yet) also when a task
/// of this process waits for the key: its release goes to the server, not
/// to that task (lock cohorting would pass the hold on unasked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_call_whose_lock_the_server_lost_ends_lost_also_when_a_local_task_waits() {
    let prefix = unique("confirm-pass");
    // (A cohort budget that outlasts the test's steps; the default 5 ms
    // passes the same way when the body is that short.)
    let runtime = Kind::Redis
        .builder(&prefix)
        .cohort(8, Duration::from_secs(30))
        // (Fair, whatever LOCK_FAIR says: the test waits for the waiting
        // task's place in the queue.)
        .fair(true)
        .build()
        .await
        .unwrap();
    let key = unique("confirm-pass-key");
    let name = runtime.backend_key(&key);
    let mut con = redis().connection().await;
    let outcome = with_lock(runtime.lock(&key).on_lost(OnLost::Confirm), async {
        let waiter = tokio::spawn({
            let (runtime, key) = (runtime.clone(), key.clone());
            async move {
                runtime
                    .lock(&key)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
            }
        });
        wait_until("a local task waits for the key", || {
            runtime.stats().waiting == 1
        })
        .await;
        until_queued(&mut con, &name, 1).await;
        // The server loses the lock (an eviction; a `DEL`): no release
        // message, so the waiting task is not woken by it.
        let deleted: u64 = redis::cmd("DEL")
            .arg(&name)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(deleted, 1, "the lock was not where the test looked");
        Ok::<_, LockError>(waiter)
    })
    .await;
    let passed = runtime.stats().passed_locally;
    match outcome {
        Err(LockError::Lost { key: lost }) => assert_eq!(lost, key),
        Ok(waiter) => {
            waiter.abort();
            panic!(
                "on_lost = \"confirm\" returned Ok although the server had lost the lock during \
                 the body (passed locally: {passed}; no release was sent, so none was answered)"
            );
        }
        Err(other) => panic!("expected Lost, got {other:?}"),
    }
}

/// Uses up the running task's tokio budget (as a body that drains 128
/// ready messages of a channel in one poll does), so that every tokio
/// resource polled next in this poll answers `Pending`.
async fn use_up_the_task_budget() {
    for _ in 0..10_000 {
        if !tokio::task::coop::has_budget_remaining() {
            return;
        }
        tokio::task::consume_budget().await;
    }
    panic!("the task budget was never used up");
}

/// On one Redis server a locked call's release is written to the
/// connection before the call returns, so this process's next try comes
/// after it and finds the key free: also when the body ends with its task's
/// tokio budget used up (redis-rs's channel counts against that budget, and
/// a poll within it would stop before writing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_after_a_call_finds_the_key_free_also_when_the_body_used_up_its_task_budget() {
    let busy = after_calls_that_used_up_their_budget("budget", |runtime, key| async move {
        match runtime.lock(&key).try_acquire().await.unwrap() {
            Some(guard) => {
                guard.release().await.unwrap();
                false
            }
            None => true,
        }
    })
    .await;
    assert_eq!(
        busy, 0,
        "{busy} of {BUDGET_CALLS} tries right after this process's own call returned found the key busy"
    );
}

/// The same, read with `inspect`: "this process reads the key free once
/// its call returned" (`release_after_the_call.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_after_a_call_reads_the_key_free_also_when_the_body_used_up_its_task_budget() {
    let held = after_calls_that_used_up_their_budget("budget-inspect", |runtime, key| async move {
        runtime.inspect(&key).await.unwrap().is_some()
    })
    .await;
    assert_eq!(
        held, 0,
        "{held} of {BUDGET_CALLS} inspects right after this process's own call returned read the key held"
    );
}

/// Calls whose body used up its task's budget, each followed (after one
/// yield) by `look` at the key; how many looks said "held".
const BUDGET_CALLS: usize = 40;

/// How long a peer waits for a key that should come free at once.
const PATIENCE: Duration = Duration::from_secs(10);

async fn after_calls_that_used_up_their_budget<F, Fut>(name: &str, look: F) -> usize
where
    F: Fn(LockRuntime, String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let runtime = Kind::Redis.runtime(&unique(name)).await;
    let key = unique(&format!("{name}-key"));
    let mut held = 0;
    for _ in 0..BUDGET_CALLS {
        with_lock(runtime.lock(&key), async {
            use_up_the_task_budget().await;
            Ok::<_, LockError>(())
        })
        .await
        .unwrap();
        tokio::task::yield_now().await;
        if look(runtime.clone(), key.clone()).await {
            held += 1;
        }
    }
    held
}

/// `on_lost = "confirm"` returns `Ok` only for a hold the backend confirmed
/// at its release: a release that gets no answer (the connection stalls as
/// the body ends, the response timeout passes) ends the call in an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_call_whose_release_is_never_answered_does_not_return_ok() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    let builder = builder_at(&proxy.url(), &unique("confirm-stall"));
    let builder = builder.response_timeout(Duration::from_millis(300));
    let runtime = builder.build().await.unwrap();
    let key = unique("confirm-stall-key");
    let outcome = with_lock(runtime.lock(&key).on_lost(OnLost::Confirm), async {
        proxy.stall();
        Ok::<_, LockError>(7)
    })
    .await;
    proxy.resume();
    assert!(
        outcome.is_err(),
        "on_lost = \"confirm\" returned {outcome:?} for a release nobody answered"
    );
}

/// An awaited release whose connection closes as it is sent ends in an error
/// that says it is sent again, and it is: a peer gets the key at once, not
/// when the lease runs out. Fair mode (the `release` operation of
/// `fair.lua`) and plain mode (`release.lua`, found by its SHA).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_release_is_sent_again_so_the_key_does_not_wait_for_its_lease() {
    let plain_release =
        redis::Script::new(include_str!("../../lock-runtime/src/scripts/release.lua"))
            .get_hash()
            .to_owned();
    let server = RedisServer::start();
    for (fair, command) in [(true, "release"), (false, plain_release.as_str())] {
        let proxy = FaultProxy::start(server.port()).await;
        let prefix = unique("release-unanswered");
        let builder = |url: String| {
            LockRuntime::builder()
                .redis(url)
                .key_prefix(prefix.clone())
                .fair(fair)
                .build()
        };
        let (holder, peer) = (
            builder(proxy.url()).await.unwrap(),
            builder(server.url()).await.unwrap(),
        );
        let key = unique("release-unanswered-key");
        let lease = Duration::from_secs(60);
        let guard = holder.lock(&key).lease(lease).acquire().await.unwrap();
        let first = guard.fence();
        proxy.drop_at_command(command);
        let error = guard
            .release()
            .await
            .expect_err("a release whose connection closed was answered");
        assert_eq!(proxy.dropped_at_command(), 1, "fair {fair}: not dropped");
        assert!(
            error.to_string().contains("sent again in the background"),
            "fair {fair}: {error}"
        );

        let started = Instant::now();
        let again = peer
            .lock(&key)
            .lease(lease)
            .wait(Duration::from_secs(20))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("fair {fair}: the key stayed taken: {e}"));
        assert!(again.fence() > first, "fair {fair}: token did not grow");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "fair {fair}: the peer waited {:?}",
            started.elapsed()
        );
        again.release().await.unwrap();
        // The holder's own process takes it again too.
        holder
            .lock(&key)
            .lease(lease)
            .wait(Duration::from_secs(20))
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        holder.shutdown().await.unwrap();
        peer.shutdown().await.unwrap();
    }
}

/// The other half of an unanswered release: it reached the server, which
/// applied it, and only its answer came too late (the server frozen past
/// the response timeout). The release sent again then finds nothing: the
/// waiting peer that the first one let in (handed the lock, in fair mode)
/// keeps its hold, and no loss is counted. (In fair mode the first copy
/// hands the lock to the queued peer within its own script, so the second
/// always meets the peer's hold; in plain mode the peer's acquire mostly
/// comes after the second copy.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_after_the_first_was_applied_leaves_the_next_holder_alone() {
    for fair in [true, false] {
        let server = RedisServer::start();
        let prefix = unique("release-late-answer");
        let runtime = |timeout: Duration| {
            LockRuntime::builder()
                .redis(server.url())
                .key_prefix(prefix.clone())
                .fair(fair)
                .response_timeout(timeout)
                .build()
        };
        let holder = runtime(Duration::from_millis(300)).await.unwrap();
        let peer = runtime(Duration::from_secs(5)).await.unwrap();
        let key = unique("release-late-answer-key");
        let lease = Duration::from_secs(60);
        let guard = holder.lock(&key).lease(lease).acquire().await.unwrap();
        let request = peer.lock(&key).lease(lease).wait(Duration::from_secs(20));
        let waiter = tokio::spawn(async move { request.acquire().await });
        if fair {
            let mut admin = server.connection().await;
            until_queued(&mut admin, &holder.backend_key(&key), 1).await;
        } else {
            wait_until("the peer waits", || peer.stats().waiting == 1).await;
        }

        server.freeze();
        let error = guard
            .release()
            .await
            .expect_err("a frozen server answered the release");
        assert!(
            error.to_string().contains("sent again in the background"),
            "fair {fair}: {error}"
        );
        // Both copies are on their way; the server applies the first, lets
        // the peer in, then finds nothing to release in the second.
        server.thaw();
        let next = waiter
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("fair {fair}: the peer never got the key: {e}"));
        // Shutdown waits until the background release was answered.
        holder.shutdown().await.unwrap();
        assert_eq!(holder.stats().lost_at_release, 0, "fair {fair}");
        let recorded = peer
            .inspect(&key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("fair {fair}: the peer's hold was released"));
        assert_eq!(recorded.fence, Some(next.fence()), "fair {fair}");
        assert!(!next.is_lost(), "fair {fair}");
        next.release()
            .await
            .unwrap_or_else(|e| panic!("fair {fair}: the peer's release: {e}"));
        peer.shutdown().await.unwrap();
    }
}
