//! A holder process dies (SIGKILL): its lock frees when its lease runs out,
//! never before.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_tests::assert_token_above;
use lock_tests::unique;
use tokio::time::Instant;

use crate::{ms, next_line, own_server, spawn_contender};

const LEASE: Duration = Duration::from_secs(2);

/// A contender holding a 2 s lease is SIGKILLed after its watchdog renewed
/// the lease. Until the TTL Redis had at the kill runs out, every
/// `try_acquire` of a peer fails; a waiter started at the kill gets the lock
/// no earlier than that TTL and within lease + 500 ms of the kill, with a
/// greater fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_frees_its_lock_after_the_lease_and_never_before() {
    let timeouts = Duration::from_millis(500);
    let (_turn, server, prefix, runtime, prober) = own_server("crash", timeouts).await;
    let key = unique("crash-key");
    let hash = runtime.backend_key(&key);
    let mut con = server.connection().await;

    let lease_ms = LEASE.as_millis().to_string();
    let (mut child, mut lines) =
        spawn_contender(&[&server.url(), &prefix, "hold", &key, &lease_ms]);
    let line = next_line(&mut lines, Duration::from_secs(10)).await;
    let old_fence: u64 = line
        .strip_prefix("held ")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("unexpected contender output {line:?}"));

    // Let the contender's watchdog renew at least once (every lease / 3).
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        prober.lock(&key).try_acquire().await.unwrap().is_none(),
        "the live contender's lock was free"
    );

    child.start_kill().expect("SIGKILL the contender");
    let killed_at = Instant::now();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&hash)
        .query_async(&mut con)
        .await
        .unwrap();
    child.wait().await.expect("reap the contender");
    assert!(
        pttl > 0 && pttl <= LEASE.as_millis() as i64,
        "PTTL of the killed holder's lock: {pttl}"
    );
    // Redis keeps the key at least this long after `killed_at`.
    let frees_at = killed_at + Duration::from_millis(pttl as u64);

    let waiter = {
        let runtime = runtime.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let request = runtime.lock(key).lease(LEASE).wait(Duration::from_secs(10));
            let guard = request.acquire().await;
            (Instant::now(), guard)
        })
    };

    // During the lease: every try fails.
    let mut probes = 0;
    while Instant::now() + Duration::from_millis(100) < frees_at && probes < 200 {
        let got = prober.lock(&key).try_acquire().await.unwrap();
        assert!(
            got.is_none(),
            "a peer got the killed holder's lock {:?} after the kill, {:?} before its TTL ran out",
            killed_at.elapsed(),
            frees_at - Instant::now()
        );
        probes += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (acquired_at, guard) = tokio::time::timeout(Duration::from_secs(12), waiter)
        .await
        .expect("the waiter ended within 12 s")
        .expect("waiter task");
    let guard = guard.expect("the lock freed after the lease");
    let after_kill = acquired_at - killed_at;
    println!(
        "SIGKILL: lease {} ms, TTL left at the kill {pttl} ms; {probes} try_acquire during it all failed; \
         waiter acquired {} ms after the kill ({} ms after the TTL ran out)",
        ms(LEASE),
        ms(after_kill),
        after_kill.as_millis() as i64 - pttl
    );
    assert!(
        acquired_at + Duration::from_millis(20) >= frees_at,
        "acquired {after_kill:?} after the kill, before the TTL of {pttl} ms ran out"
    );
    assert!(
        after_kill <= LEASE + Duration::from_millis(500),
        "acquired {after_kill:?} after the kill: the lease should have freed it sooner"
    );
    assert_token_above(&guard, old_fence, "the killed holder");
    guard.release().await.unwrap();
    assert_eq!(runtime.stats().held, 0);
    assert_eq!(runtime.stats().watchdog.tracked, 0);
}

/// Fair mode: a waiter process queued for a key is SIGKILLed just before the
/// holder releases. The release may hand the lock to the dead waiter's place
/// (still alive in Redis for up to 3 s), but only with a claim of at most
/// 3 s, not the dead waiter's 30 s lease: the next live waiter gets the lock
/// within the claim plus one refresh of its own place, with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_queued_waiter_blocks_a_fair_lock_for_its_claim_at_most() {
    let timeouts = Duration::from_millis(500);
    let (_turn, server, prefix, holder, waiter) = own_server("crash-fair", timeouts).await;
    let key = unique("crash-fair-key");
    let queue = format!("{}:queue", holder.backend_key(&key));
    let con = server.connection().await;
    let llen = |mut con: redis::aio::MultiplexedConnection, queue: String| async move {
        redis::cmd("LLEN")
            .arg(&queue)
            .query_async::<i64>(&mut con)
            .await
            .unwrap()
    };
    let until_queued = |want: i64| {
        let (con, queue) = (con.clone(), queue.clone());
        async move {
            for _ in 0..400 {
                if llen(con.clone(), queue.clone()).await == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("the fair queue never held {want} places");
        }
    };

    let request = holder.lock(&key).fair(true).lease(Duration::from_secs(30));
    let guard = request.acquire().await.unwrap();
    let (mut child, mut lines) = crate::spawn_contender_env(
        &[&server.url(), &prefix, "herd", &key, "1", "60000", "0"],
        &[("LOCK_FAIR", "1")],
    );
    assert_eq!(
        next_line(&mut lines, Duration::from_secs(30)).await,
        "ready"
    );
    until_queued(1).await;
    child.start_kill().expect("SIGKILL the queued contender");
    child.wait().await.expect("reap the contender");

    let task = tokio::spawn(async move {
        let request = waiter.lock(&key).fair(true).lease(Duration::from_secs(30));
        let g = request.acquire().await.unwrap();
        (Instant::now(), g.fence(), waiter)
    });
    until_queued(2).await;
    let fence = guard.fence();
    let released = Instant::now();
    guard.release().await.unwrap();
    let (acquired, new_fence, _waiter) = task.await.unwrap();
    let waited = acquired - released;
    println!(
        "fair crash: the live waiter got the lock {} ms after the release, behind a killed \
         queued waiter",
        ms(waited)
    );
    assert!(new_fence > fence);
    assert!(
        waited <= Duration::from_millis(4500),
        "blocked {waited:?}: more than a 3 s claim plus a 1 s refresh"
    );
}
