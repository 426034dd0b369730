//! Redis Sentinel: locks through the sentinels' primary, and what a failover
//! does to them, with and without `sync_replicas`.
//!
//! Each failover test starts its own primary, replicas and three sentinels
//! (`lock_testkit::SentinelSet`, down-after 1 s), kills or demotes the
//! primary, and reports what it observed (`--nocapture` shows the lines
//! starting with `sentinel:`). Two runtimes of one test stand for two
//! processes: their holder ids differ, as between processes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockGuard, LockRuntime};
use lock_testkit::sentinel::SERVICE;
use lock_testkit::SentinelSet;
use lock_tests::looked::at_once;
use lock_tests::{count_under_lock, take_and_release, unique};

/// Longest a failover may take before a test fails.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);

/// A runtime on `set`'s service; `sync`: `sync_replicas(1, 300 ms)`.
async fn runtime(set: &SentinelSet, prefix: &str, sync: bool) -> LockRuntime {
    let mut builder = LockRuntime::builder()
        .redis_sentinel(set.sentinel_urls(), SERVICE)
        .key_prefix(prefix)
        .try_timeout(Duration::from_secs(2));
    if sync {
        builder = builder.sync_replicas(1, Duration::from_millis(300));
    }
    builder.build().await.expect("build a sentinel runtime")
}

/// Two runtimes on `set`'s service under a new prefix named after `name`:
/// the first has every lock acknowledged by a replica (`runtime`'s `sync`),
/// the second does not.
async fn synced_and_plain(set: &SentinelSet, name: &str) -> (LockRuntime, LockRuntime) {
    let prefix = unique(name);
    (
        runtime(set, &prefix, true).await,
        runtime(set, &prefix, false).await,
    )
}

/// A plain connection to the data node at `address`.
async fn node(set: &SentinelSet, address: &str) -> redis::aio::MultiplexedConnection {
    set.node(address)
        .unwrap_or_else(|| panic!("no node at {address}"))
        .connection()
        .await
}

/// Whether the node at `address` has the key `key` (a replica answers reads).
async fn has_key(set: &SentinelSet, address: &str, key: &str) -> bool {
    let mut con = node(set, address).await;
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
    n == 1
}

/// After a fault at `since`, side by side: a bounded acquire on `rt` (which
/// rides out the switch by itself) and the wait until the sentinels agree on
/// a new primary. Returns that primary, when they named it and when the
/// acquire held, both counted from `since`. (Where the acquire landed is not
/// checked: with a short down-after the sentinels sometimes replace the
/// replica they just promoted, and the runtime follows them again.)
async fn recovery(
    set: &SentinelSet,
    rt: &LockRuntime,
    since: Instant,
) -> (String, Duration, Duration) {
    let working = async {
        let probe = rt.lock("probe").wait(FAILOVER_LIMIT).acquire().await;
        let at = since.elapsed();
        drop(probe.expect("locks work again after the failover"));
        at
    };
    let named = async {
        let (promoted, _) = set.wait_for_failover(FAILOVER_LIMIT).await;
        (promoted, since.elapsed())
    };
    let (working, (promoted, named)) = tokio::join!(working, named);
    (promoted, named, working)
}

/// Checks that the lock `guard` holds survived a failover, as `other` (on
/// the new primary once it answers) sees it: recorded with the guard's
/// token, closed to others, and, once the guard gives it back, taken with a
/// larger token. Returns both tokens.
async fn survived(guard: LockGuard, other: &LockRuntime) -> (u64, u64) {
    let key = guard.key().to_owned();
    // Bounded: until `other` reaches the new primary.
    let mut seen = None;
    for _ in 0..100 {
        if let Ok(Some(info)) = other.inspect(&key).await {
            seen = Some(info);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let info = seen.expect("the lock is on the new primary");
    let token = guard.fence();
    assert_eq!(info.fence, Some(token));
    assert!(other.lock(&key).try_acquire().await.unwrap().is_none());
    assert!(!guard.is_lost());
    guard.release().await.expect("the holder still held it");
    let next = other.lock(&key).try_acquire().await.unwrap().expect("free");
    assert!(next.fence() > token);
    (token, next.fence())
}

/// Waits (bounded: 5 s) until `lost` is told its lock is gone; `false` if
/// it never was.
async fn told_lost(guard: &LockGuard) -> bool {
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_backend_excludes_across_two_runtimes_and_names_the_primary() {
    let set = &SentinelSet::start(1);
    let prefix = unique("sentinel-excl");
    let (a, b) = (
        runtime(set, &prefix, false).await,
        runtime(set, &prefix, false).await,
    );
    let primary = format!("127.0.0.1:{}", set.first_primary().port());
    assert_eq!(
        a.describe(),
        format!("redis sentinel service {SERVICE}, primary at {primary}")
    );

    let (count, most_inside) = count_under_lock(&[a.clone(), b.clone()], "counter", 8, 20).await;
    assert_eq!(count, 8 * 20);
    assert_eq!(most_inside, 1, "two holders were inside at once");

    // A hold of one runtime keeps the other out, and tokens grow.
    let first = a.lock("one").acquire().await.unwrap();
    assert!(b.lock("one").try_acquire().await.unwrap().is_none());
    let token = first.fence();
    first.release().await.unwrap();
    let second = at_once(b.lock("one"), "free now").await;
    assert!(second.fence() > token, "{} <= {token}", second.fence());
    // The lock lives on the primary the sentinels name.
    assert!(has_key(set, &primary, &b.backend_key("one")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_unknown_service_or_unreachable_sentinels_fail_with_a_clear_error() {
    let set = &SentinelSet::start(1);
    let error = LockRuntime::builder()
        .redis_sentinel(set.sentinel_urls(), "no-such-service")
        .build()
        .await
        .expect_err("an unknown service must not start");
    let text = error.to_string();
    assert!(
        text.contains("no primary found for Redis Sentinel service `no-such-service`"),
        "{text}"
    );
    assert!(
        text.contains("does not monitor `no-such-service`"),
        "{text}"
    );
    assert!(text.contains("check the service name"), "{text}");

    let nobody = format!("redis://:secret@127.0.0.1:{}", lock_testkit::free_port());
    let error = LockRuntime::builder()
        .redis_sentinel([nobody], SERVICE)
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect_err("no sentinel answers");
    let text = error.to_string();
    assert!(text.contains("sentinel 127.0.0.1:"), "{text}");
    assert!(!text.contains("secret"), "{text}");

    let error = LockRuntime::builder()
        .redis("redis://127.0.0.1:1")
        .sync_replicas(1, Duration::from_millis(100))
        .build()
        .await
        .expect_err("sync_replicas is for Sentinel");
    assert!(error.to_string().contains("needs the Sentinel backend"));
}

/// The primary is SIGKILLed with two locks held: `kept`, which had reached
/// the replicas, and `unreplicated`, taken while the replicas were frozen.
/// Reports the sentinels' failover time, the time until locks work again,
/// and what became of each hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_primary_killed_a_replica_is_promoted_and_locks_work_again() {
    let mut set = SentinelSet::start(2);
    let prefix = unique("sentinel-kill");
    let holder = runtime(&set, &prefix, false).await;
    let other = runtime(&set, &prefix, false).await;
    let lease = Duration::from_secs(15);
    let first = format!("127.0.0.1:{}", set.first_primary().port());

    let kept = holder.lock("kept").lease(lease).acquire().await.unwrap();
    let kept_key = holder.backend_key("kept");
    let replicas: Vec<String> = set
        .replicas()
        .iter()
        .map(|r| format!("127.0.0.1:{}", r.port()))
        .collect();
    let mut replicated = false;
    for _ in 0..200 {
        if has_key(&set, &replicas[0], &kept_key).await
            && has_key(&set, &replicas[1], &kept_key).await
        {
            replicated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(replicated, "kept never reached the replicas");
    // A waiter of `kept` in the other runtime: it must be woken by the
    // release on the new primary (its watch moved there).
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move {
            let request = other.lock("kept").wait(Duration::from_secs(40));
            let guard = request.acquire().await;
            (guard, Instant::now())
        })
    };
    lock_tests::wait_until("the waiter is registered", || {
        other.stats().waiting_keys == 1
    })
    .await;

    // Cut the replicas off: frozen, so they cannot reconnect, and their
    // links closed, so nothing more reaches even their sockets' buffers.
    for replica in set.replicas() {
        replica.freeze();
    }
    let mut primary = set.first_primary().connection().await;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut primary)
        .await
        .unwrap();
    let request = holder.lock("unreplicated").lease(lease);
    let unreplicated = request.acquire().await.unwrap();
    let killed_at = Instant::now();
    set.kill_primary();
    for replica in set.replicas() {
        replica.thaw();
    }

    // Locks work again: a bounded wait rides out the switch by itself.
    let (promoted, promoted_after, working_after) = recovery(&set, &other, killed_at).await;
    assert_ne!(promoted, first);

    // `unreplicated` is gone from the new primary: another holder gets in,
    // with a larger token, and the first holder is told it lost the lock.
    let request = other.lock("unreplicated").wait(Duration::from_secs(10));
    let second = request
        .acquire()
        .await
        .expect("the unreplicated lock was lost in the failover");
    assert!(second.fence() > unreplicated.fence());
    assert!(told_lost(&unreplicated).await, "the holder was never told");

    // `kept` survived: still the holder's, the waiter still out.
    let info = other.inspect("kept").await.unwrap().expect("kept survived");
    assert_eq!(info.fence, Some(kept.fence()));
    assert!(!kept.is_lost());
    assert!(
        !waiter.is_finished(),
        "the waiter got in while kept was held"
    );
    let released_at = Instant::now();
    kept.release().await.expect("kept was still held");
    let (waited, got_at) = waiter.await.unwrap();
    let waited = waited.expect("the waiter got kept after its release");
    let wake_up = got_at.saturating_duration_since(released_at);
    assert!(waited.fence() > info.fence.unwrap());
    assert!(
        wake_up < Duration::from_secs(3),
        "woken by the lease, not the release: {wake_up:?}"
    );
    println!(
        "sentinel: kill -> sentinels name {promoted} after {promoted_after:?}; an acquire \
         started at the kill held after {working_after:?}; kept survived (token {} then {} for the waiter, \
         woken {wake_up:?} after the release); unreplicated lost: holder told, second holder \
         in with token {} > {}",
        info.fence.unwrap(),
        waited.fence(),
        second.fence(),
        unreplicated.fence()
    );
}

/// With `sync_replicas(1, …)` the acquire returns only once a replica has
/// the lock, so killing the primary right after it loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_sync_replicas_lock_survives_a_kill_right_after_the_acquire() {
    let mut set = SentinelSet::start(1);
    let (holder, other) = synced_and_plain(&set, "sentinel-sync").await;

    // The cost of the sync: the same first acquisition without it.
    let started = Instant::now();
    let plain = other.lock("plain").acquire().await.unwrap();
    let plain_took = started.elapsed();
    drop(plain);
    let started = Instant::now();
    let request = holder.lock("synced").lease(Duration::from_secs(15));
    let guard = request.acquire().await.unwrap();
    let sync_took = started.elapsed();
    let killed_at = Instant::now();
    set.kill_primary();

    let (promoted, _) = set.wait_for_failover(FAILOVER_LIMIT).await;
    let promoted_after = killed_at.elapsed();
    // The promoted replica had it before the acquire returned.
    assert!(has_key(&set, &promoted, &holder.backend_key("synced")).await);
    let (token, next) = survived(guard, &other).await;
    println!(
        "sentinel: sync acquire took {sync_took:?} (plain {plain_took:?}); kill -> {promoted} named after \
         {promoted_after:?}; the lock survived with token {token}; next token {next}"
    );
}

/// With the replica frozen no acknowledgement comes: the lock is released
/// and the acquire says why; once it thaws, sync acquires work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failed_sync_releases_the_lock_and_says_so() {
    let set = SentinelSet::start(1);
    let (synced, plain) = synced_and_plain(&set, "sentinel-nosync").await;
    let primary = format!("127.0.0.1:{}", set.first_primary().port());

    set.replicas()[0].freeze();
    let error = synced
        .lock("k")
        .try_acquire()
        .await
        .expect_err("no replica acknowledged the lock");
    let text = error.to_string();
    assert!(
        matches!(&error, LockError::Backend(e) if e.is_replica_sync_failure()),
        "{error:?}"
    );
    assert!(text.contains("replication sync failed"), "{text}");
    assert!(text.contains("only 0 of 1 replicas"), "{text}");
    assert!(text.contains("it was released again"), "{text}");
    assert!(!has_key(&set, &primary, &synced.backend_key("k")).await);
    // A bounded wait reports it at once (after one WAIT), not at its deadline.
    let started = Instant::now();
    let request = synced.lock("k").wait(Duration::from_secs(10));
    let error = request.acquire().await.expect_err("still no replica");
    assert!(
        error.to_string().contains("replication sync failed"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The lock is free for everyone meanwhile.
    let guard = plain.lock("k").try_acquire().await.unwrap().expect("free");
    guard.release().await.unwrap();

    set.replicas()[0].thaw();
    let request = synced.lock("k").wait(Duration::from_secs(10));
    let guard = request
        .acquire()
        .await
        .expect("the replica acknowledges again");
    assert!(
        has_key(
            &set,
            &format!("127.0.0.1:{}", set.replicas()[0].port()),
            &synced.backend_key("k")
        )
        .await
    );
    guard.release().await.unwrap();
}

/// A read hold waits for its replica as any hold does: with the replica
/// frozen, the read acquire fails with the sync failure and gives back its
/// own share only, leaving the reader already there holding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failed_sync_of_a_read_gives_back_only_its_own_share() {
    let set = SentinelSet::start(1);
    let (synced, plain) = synced_and_plain(&set, "sentinel-read-sync").await;
    let reader = plain.lock("k").read().acquire().await.unwrap();

    set.replicas()[0].freeze();
    let error = synced
        .lock("k")
        .read()
        .try_acquire()
        .await
        .expect_err("no replica acknowledged the read hold");
    assert!(
        matches!(&error, LockError::Backend(e) if e.is_replica_sync_failure()),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("it was released again"),
        "{error}"
    );
    let info = plain
        .inspect("k")
        .await
        .unwrap()
        .expect("the first reader holds");
    assert_eq!(info.readers.len(), 1, "{info:?}");
    assert_eq!(info.fence, Some(reader.fence()));
    assert!(!reader.is_lost());
    set.replicas()[0].thaw();

    let joined = synced.lock("k").read().wait(Duration::from_secs(10));
    let joined = joined
        .acquire()
        .await
        .expect("the replica acknowledges again");
    assert_eq!(plain.inspect("k").await.unwrap().unwrap().readers.len(), 2);
    joined.release().await.unwrap();
    reader.release().await.unwrap();
}

/// `SENTINEL FAILOVER` replaces a primary that stays up: it answers as a
/// primary until a sentinel demotes it (up to one `INFO` round, 10 s), so
/// no call fails; the runtime moves on the sentinels' `+switch-master`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_forced_failover_of_a_live_primary_is_followed_at_once() {
    let set = SentinelSet::start(1);
    let prefix = unique("sentinel-forced");
    let rt = runtime(&set, &prefix, false).await;
    take_and_release(rt.lock("before")).await;

    let first = format!("127.0.0.1:{}", set.first_primary().port());
    let mut old = node(&set, &first).await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut old)
        .await
        .unwrap();
    assert!(runtime_connections(&clients) >= 1, "{clients}");
    let mut sentinel = redis::Client::open(set.sentinel_urls()[0].as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let forced_at = Instant::now();
    let _: String = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SERVICE)
        .query_async(&mut sentinel)
        .await
        .unwrap();
    let (promoted, _) = set.wait_for_failover(FAILOVER_LIMIT).await;
    let named_after = forced_at.elapsed();
    let old_still_master = set.is_master(&first);
    // Bounded: 60 tries 50 ms apart, each a short acquire.
    let mut moved = None;
    for _ in 0..60 {
        let request = rt.lock("after").wait(Duration::from_secs(2));
        let guard = request.acquire().await;
        if let Ok(guard) = guard {
            let landed = has_key(&set, &promoted, &rt.backend_key("after")).await;
            let _ = guard.release().await;
            if landed {
                moved = Some(forced_at.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let moved = moved.expect("the runtime follows the new primary");
    assert!(
        moved < named_after + Duration::from_secs(3),
        "moved {moved:?} after the failover, the sentinels named {promoted} after {named_after:?}"
    );
    // The old primary's backend was dropped: its connections (the main one,
    // with its subscription task and releaser) close.
    let mut left = usize::MAX;
    for _ in 0..100 {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut old)
            .await
            .unwrap();
        left = runtime_connections(&clients);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "connections to the old primary stayed open");
    println!(
        "sentinel: forced failover {first} -> {promoted} named after {named_after:?} (old \
         primary still a master then: {old_still_master}); locks on the new one after {moved:?}"
    );
}

/// Connections in a `CLIENT LIST` that are neither a sentinel's, nor a
/// replication link, nor the one asking.
fn runtime_connections(clients: &str) -> usize {
    clients
        .lines()
        .filter(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(name))
                    .unwrap_or("")
                    .to_owned()
            };
            !field("name=").starts_with("sentinel-")
                && !field("flags=").contains(['S', 'M'])
                && field("cmd=") != "client|list"
        })
        .count()
}

/// A frozen primary (SIGSTOP) answers nothing: calls time out, the
/// sentinels promote the replica, and the runtime moves there; a lock held
/// across it stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_frozen_primary_is_replaced_and_a_held_lock_rides_it_out() {
    let set = SentinelSet::start(1);
    let (holder, other) = synced_and_plain(&set, "sentinel-frozen").await;
    let first = format!("127.0.0.1:{}", set.first_primary().port());
    let request = holder.lock("held").lease(Duration::from_secs(20));
    let guard = request.acquire().await.unwrap();

    let frozen_at = Instant::now();
    set.freeze_primary();
    let (promoted, named_after, working_after) = recovery(&set, &other, frozen_at).await;
    assert_ne!(promoted, first);

    let (token, next) = survived(guard, &other).await;
    println!(
        "sentinel: freeze -> sentinels name {promoted} after {named_after:?}; an acquire \
         started at the freeze held after {working_after:?}; the held lock survived (token {token}, next {next})"
    );
}
