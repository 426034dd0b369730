//! Bounded memory: a lock that has ended leaves nothing permanent behind.
//!
//! A key's fence counter lives for the fence window after its token was
//! issued (the hold keeps its own copy in the lock hash); fair mode's queue
//! and its entries live as long as a place in them. These tests lock thousands of distinct keys, plain and fair
//! and with contention, and then read every name left under the prefix with
//! a raw client: each one must carry a TTL within its bound, and once the
//! bound has passed none may be left. The window is shortened to a second
//! (`LockRuntimeBuilder::fence_window`) so that the wait is short.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::LockRuntime;
use lock_tests::{on_every_backend, redis, unique, Kind};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::task::JoinSet;

/// The shortened fence window of these tests.
const WINDOW: Duration = Duration::from_secs(1);
/// How long a fair-mode queue place lives without a refresh (the runtime's
/// `QUEUE_ENTRY_LIFE`): the queue keys expire at most this long after it.
const PLACE_LIFE: Duration = Duration::from_secs(3);
/// Distinct keys locked per test.
const KEYS: usize = 2000;
/// Keys in flight at once (each contended by two runtimes).
const IN_FLIGHT: usize = 50;

async fn runtime(prefix: &str, fair: bool) -> LockRuntime {
    LockRuntime::builder()
        .redis(redis().url())
        .key_prefix(prefix)
        .fair(fair)
        .fence_window(WINDOW)
        .build()
        .await
        .expect("build the lock runtime")
}

/// Every name under `prefix` with its PTTL in ms (-1: no TTL). `SCAN` also
/// drops the expired names it meets, as a read would.
async fn names_left(con: &mut MultiplexedConnection, prefix: &str) -> Vec<(String, i64)> {
    let mut names = Vec::new();
    let mut cursor = 0u64;
    // Bounded: a full scan of the test server is far below this many steps.
    for _ in 0..100_000 {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await
            .unwrap();
        for name in batch {
            let ttl: i64 = con.pttl(&name).await.unwrap();
            if ttl != -2 {
                names.push((name, ttl));
            }
        }
        cursor = next;
        if cursor == 0 {
            return names;
        }
    }
    panic!("SCAN did not finish");
}

/// Polls (bounded by `limit`) until nothing is left under `prefix`.
async fn until_nothing_left(con: &mut MultiplexedConnection, prefix: &str, limit: Duration) {
    let started = tokio::time::Instant::now();
    loop {
        let left = names_left(con, prefix).await;
        if left.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "{} names still there after {limit:?}, e.g. {:?}",
            left.len(),
            &left[..left.len().min(3)]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two runtimes (two processes) take each of `KEYS` distinct keys in turn
/// and release it; then every name left has a TTL within its bound, and
/// after the bound nothing is left.
async fn distinct_keys_leave_nothing_behind(fair: bool) {
    let prefix = unique(if fair { "retain-fair" } else { "retain" });
    let a = runtime(&prefix, fair).await;
    let b = runtime(&prefix, fair).await;
    let mut con = redis().connection().await;
    let mut holds = 0;
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(IN_FLIGHT) {
        let mut tasks = JoinSet::new();
        for &n in chunk {
            for runtime in [&a, &b] {
                let runtime = runtime.clone();
                tasks.spawn(async move {
                    let guard = runtime
                        .lock(format!("order:{n}"))
                        .wait(Duration::from_secs(10))
                        .acquire()
                        .await
                        .unwrap();
                    tokio::task::yield_now().await;
                    guard.release().await.unwrap();
                });
            }
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
            holds += 1;
        }
    }
    assert_eq!(holds, 2 * KEYS);
    // Nothing per key stays in the processes either.
    for runtime in [&a, &b] {
        let stats = runtime.stats();
        assert_eq!((stats.held, stats.waiting_keys), (0, 0), "{stats:?}");
    }

    let left = names_left(&mut con, &prefix).await;
    eprintln!(
        "fair={fair}: {} names left under the prefix after {KEYS} keys",
        left.len()
    );
    assert!(left.len() <= KEYS + 2 * IN_FLIGHT, "{} left", left.len());
    for (name, ttl) in &left {
        let bound = if name.ends_with(":fence") {
            WINDOW
        } else if name.ends_with(":queue") || name.ends_with(":queued") {
            PLACE_LIFE
        } else {
            panic!("{name} is left after every lock was released");
        };
        assert!(*ttl >= 0, "{name} has no TTL");
        assert!(
            u128::from(ttl.unsigned_abs()) <= bound.as_millis(),
            "{name}: TTL {ttl} ms, more than {bound:?}"
        );
    }
    until_nothing_left(&mut con, &prefix, PLACE_LIFE + Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_keys_leave_nothing_behind_after_the_window() {
    distinct_keys_leave_nothing_behind(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_keys_leave_nothing_behind_after_the_window_in_fair_mode() {
    distinct_keys_leave_nothing_behind(true).await;
}

/// A hold that outlasts the window keeps its token (a re-entry through the
/// backend, or a claim, reads it from the lock hash) while the key's counter
/// expires on time; the next hold's token is still larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_longer_than_the_window_keeps_its_token_and_the_counter_expires() {
    let prefix = unique("retain-held");
    let runtime = runtime(&prefix, false).await;
    let hash = runtime.backend_key("k");
    let fence = format!("{hash}:fence");
    let mut con = redis().connection().await;
    let lease = Duration::from_millis(300);
    let guard = runtime.lock("k").lease(lease).acquire().await.unwrap();
    let token = guard.fence();
    let ttl: i64 = con.pttl(&fence).await.unwrap();
    assert!(
        ttl > 0 && u128::from(ttl.unsigned_abs()) <= WINDOW.as_millis(),
        "counter TTL {ttl} ms"
    );
    // Bounded: the counter is gone a window after the acquire.
    let mut gone = false;
    for _ in 0..100 {
        if !con.exists::<_, bool>(&fence).await.unwrap() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the counter outlived the window");
    assert!(!guard.is_lost(), "the watchdog kept the lock");
    let stored: u64 = con.hget(&hash, "fence").await.unwrap();
    assert_eq!(stored, token, "the hold's own token");
    guard.release().await.unwrap();
    let next = runtime.lock("k").acquire().await.unwrap();
    assert!(next.fence() > token, "{} <= {token}", next.fence());
    next.release().await.unwrap();
}

/// The token after the counter expired is still above every earlier one.
async fn tokens_grow_across_the_window(kind: Kind) {
    let prefix = unique("retain-grow");
    let runtime = kind
        .builder(&prefix)
        .fair(false)
        .fence_window(WINDOW)
        .build()
        .await
        .unwrap();
    let mut last = 0;
    for round in 0..2 {
        let guard = runtime.lock("k").acquire().await.unwrap();
        let token = guard.fence();
        assert!(token > last, "round {round}: token {token} <= {last}");
        last = token;
        guard.release().await.unwrap();
        let servers = kind.connections().await;
        for mut con in servers.iter().cloned() {
            until_nothing_left(&mut con, &prefix, WINDOW + Duration::from_secs(2)).await;
        }
        if servers.is_empty() {
            // Nothing to observe from outside: wait the window out.
            tokio::time::sleep(WINDOW + Duration::from_millis(50)).await;
        }
    }
}

on_every_backend!(tokens_grow_across_the_window);

/// A counter left without a TTL by an earlier version: tokens continue above
/// it (even when it is ahead of the clock), and it gets a TTL on first use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_counter_of_an_earlier_version_keeps_counting_and_expires() {
    let prefix = unique("retain-upgrade");
    let runtime = runtime(&prefix, false).await;
    let fence = format!("{}:fence", runtime.backend_key("k"));
    let mut con = redis().connection().await;
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros();
    // As if issued just before the clock stepped back ten minutes.
    let old = u64::try_from(now_us).unwrap() + 600_000_000;
    let () = con.set(&fence, old).await.unwrap();
    assert_eq!(con.pttl::<_, i64>(&fence).await.unwrap(), -1);

    let lease = Duration::from_secs(5);
    let guard = runtime.lock("k").lease(lease).acquire().await.unwrap();
    assert_eq!(
        guard.fence(),
        old + 1,
        "the token continues above the counter"
    );
    let ttl: i64 = con.pttl(&fence).await.unwrap();
    assert!(
        ttl > 0 && u128::from(ttl.unsigned_abs()) <= WINDOW.as_millis(),
        "TTL {ttl} ms once used"
    );
    guard.release().await.unwrap();
    let second = runtime.lock("k").acquire().await.unwrap();
    // Above the first and the tokens reserved with it (lock cohorting).
    let reserved = u64::from(lock_runtime::DEFAULT_COHORT.handoffs);
    assert_eq!(second.fence(), old + 2 + reserved);
    second.release().await.unwrap();
    until_nothing_left(&mut con, &prefix, WINDOW + Duration::from_secs(2)).await;
}

/// Fair mode's queue is dropped with its last place: a waiter that gives up
/// leaves the queue at once, and one that dies leaves it to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_fair_queue_expires_with_its_last_place() {
    let prefix = unique("retain-queue");
    let holder = runtime(&prefix, true).await;
    let waiter = runtime(&prefix, true).await;
    let hash = holder.backend_key("k");
    let mut con = redis().connection().await;
    let guard = holder.lock("k").acquire().await.unwrap();
    // The waiter queues, then "dies": its runtime is dropped mid-wait.
    let waiting = tokio::spawn(async move {
        let _ = waiter
            .lock("k")
            .wait(Duration::from_secs(30))
            .acquire()
            .await;
    });
    let mut queued = false;
    for _ in 0..200 {
        let places: usize = con.hlen(format!("{hash}:queued")).await.unwrap();
        if places == 1 {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(queued, "the waiter never queued");
    waiting.abort();
    let _ = waiting.await;
    for name in [format!("{hash}:queue"), format!("{hash}:queued")] {
        let ttl: i64 = con.pttl(&name).await.unwrap();
        assert!(
            ttl == -2 || (ttl > 0 && u128::from(ttl.unsigned_abs()) <= PLACE_LIFE.as_millis()),
            "{name}: TTL {ttl} ms"
        );
    }
    guard.release().await.unwrap();
    until_nothing_left(
        &mut con,
        &prefix,
        PLACE_LIFE + WINDOW + Duration::from_secs(2),
    )
    .await;
}
