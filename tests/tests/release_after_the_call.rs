//! A locked call returns when its body is done, without waiting for its
//! release's answer, when its hold was known valid to the body's end (see
//! `with_lock`): one round trip per uncontended call. What that must not
//! cost: the key is free for this process's next call and for its peers at
//! once, and a hold the release finds gone still reaches someone (counted
//! and logged; an error with `on_lost = "confirm"`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::{with_lock, LockError, LockRuntime, OnLost};
use lock_tests::{on_every_backend, redis, unique, wait_until, FaultProxy, Kind};

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
    let again = runtime
        .lock(&key)
        .try_acquire()
        .await
        .unwrap()
        .expect("this process takes the key again at once");
    again.release().await.unwrap();

    with_lock(runtime.lock(&key), async { Ok::<_, LockError>(()) })
        .await
        .unwrap();
    let started = Instant::now();
    let theirs = peer
        .lock(&key)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("a peer takes the key after the call returned");
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
    let proxy = FaultProxy::start(redis().port()).await;
    let runtime = LockRuntime::builder()
        .redis(proxy.url())
        .key_prefix(unique("one-trip"))
        .build()
        .await
        .unwrap();
    proxy.slow(Some(Duration::from_millis(40)));
    let key = unique("one-trip-key");
    let mut rtt = Duration::MAX;
    for _ in 0..3 {
        rtt = rtt.min(runtime.ping().await.unwrap());
    }
    const CALLS: u32 = 6;
    let started = Instant::now();
    for _ in 0..CALLS {
        with_lock(runtime.lock(&key), async { Ok::<_, LockError>(()) })
            .await
            .unwrap();
    }
    let took = started.elapsed();
    assert!(
        took < rtt * CALLS * 3 / 2,
        "{CALLS} calls took {took:?} with a round trip of {rtt:?}: more than one round trip each"
    );
    // `confirm` still waits for the release's answer: two each.
    let started = Instant::now();
    for _ in 0..CALLS {
        with_lock(runtime.lock(&key).on_lost(OnLost::Confirm), async {
            Ok::<_, LockError>(())
        })
        .await
        .unwrap();
    }
    let confirmed = started.elapsed();
    assert!(
        confirmed > rtt * CALLS * 2 * 9 / 10,
        "{CALLS} confirmed calls took {confirmed:?} with a round trip of {rtt:?}"
    );
    proxy.slow(None);
}

/// A call whose release cannot be answered (the connection stalls as the
/// body ends) still returns at once; the release goes through when the
/// connection does, and frees the key for a peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_returns_while_its_release_is_unanswered() {
    let proxy = FaultProxy::start(redis().port()).await;
    let prefix = unique("unanswered");
    let runtime = LockRuntime::builder()
        .redis(proxy.url())
        .key_prefix(&prefix)
        .build()
        .await
        .unwrap();
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
    let theirs = peer
        .lock(&key)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the release went through once the connection did");
    theirs.release().await.unwrap();
}
