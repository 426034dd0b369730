//! What a Redis Cluster adds to the single server: locks spread over every
//! master, renewals that must stay in one slot per pipeline, and slots that
//! move, with their keys and their sharded release channels, while locks are
//! held and waited for. (Every behaviour of `on_every_backend!` also runs on
//! this cluster; these are the cluster's own.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{LockGuard, LockRuntime};
use lock_testkit::RedisCluster;
use lock_tests::{cluster, unique, Kind, Occupancy};

/// Keys whose locks live on `masters` different masters, `per_master` each.
async fn keys_on_every_master(
    runtime: &LockRuntime,
    masters: usize,
    per_master: usize,
) -> Vec<String> {
    let mut found: Vec<Vec<String>> = vec![Vec::new(); masters];
    for n in 0..10_000 {
        let key = format!("k{n}");
        let owner = cluster().owner_of(cluster().slot_of(&runtime.backend_key(&key)));
        if found[owner].len() < per_master {
            found[owner].push(key);
        }
        if found.iter().all(|keys| keys.len() == per_master) {
            return found.concat();
        }
    }
    panic!("no keys found on every master");
}

/// Two runtimes (two processes) contend for keys on all three masters: each
/// key's counter is exact and no key ever has two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_locks_on_every_master_exclude_across_runtimes() {
    let prefix = unique("cl-excl");
    let a = Kind::Cluster.runtime(&prefix).await;
    let b = Kind::Cluster.runtime(&prefix).await;
    let keys = keys_on_every_master(&a, 3, 2).await;
    let masters: BTreeSet<usize> = keys
        .iter()
        .map(|k| cluster().owner_of(cluster().slot_of(&a.backend_key(k))))
        .collect();
    assert_eq!(masters.len(), 3, "the keys do not cover every master");
    let mut tasks = Vec::new();
    let state: Vec<(Arc<AtomicU64>, Arc<Occupancy>)> =
        keys.iter().map(|_| Default::default()).collect();
    for worker in 0..8 {
        let rt = if worker % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        };
        let keys = keys.clone();
        let state = state.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..10 {
                let i = (worker + round) % keys.len();
                let guard = rt.lock(&keys[i]).acquire().await.unwrap();
                let (counter, occupancy) = &state[i];
                let inside = occupancy.enter();
                let read = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(read + 1, Ordering::SeqCst);
                drop(inside);
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let total: u64 = state.iter().map(|(c, _)| c.load(Ordering::SeqCst)).sum();
    assert_eq!(total, 80, "lost updates: two holders of one key at once");
    for (key, (_, occupancy)) in keys.iter().zip(&state) {
        assert_eq!(occupancy.max(), 1, "two holders of {key} at once");
    }
}

/// Thirty locks on keys of every master, each renewed by the watchdog for
/// three leases: renewals go out in one pipeline per slot (a pipeline across
/// slots is refused by the cluster), so none is lost and each keeps its
/// holder and token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_renewals_across_slots_keep_every_lock() {
    let prefix = unique("cl-renew");
    let runtime = Kind::Cluster.runtime(&prefix).await;
    let observer = Kind::Cluster.runtime(&prefix).await;
    let keys = keys_on_every_master(&runtime, 3, 10).await;
    let lease = Duration::from_millis(400);
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(runtime.lock(key).lease(lease).acquire().await.unwrap());
    }
    let trips_before = runtime.stats().watchdog.round_trips;
    // Three leases: without renewals every lock would have expired.
    tokio::time::sleep(lease * 3).await;
    for (key, guard) in keys.iter().zip(&guards) {
        assert!(!guard.is_lost(), "{key} was lost");
        let info = observer.inspect(key).await.unwrap().expect("still held");
        assert_eq!(info.fence, Some(guard.fence()), "{key}: another token");
    }
    let stats = runtime.stats().watchdog;
    assert!(
        stats.round_trips - trips_before >= 2,
        "the watchdog did not renew"
    );
    assert_eq!(stats.lost, 0, "the watchdog lost locks");
    for guard in guards {
        guard.release().await.unwrap();
    }
    for key in &keys {
        assert!(
            !observer.is_locked(key).await.unwrap(),
            "{key} still locked"
        );
    }
}

/// The slot of a held lock moves to another master while a waiter of
/// another process waits for it (subscribed to its sharded release channel
/// at the old master, which drops that subscription when the slot leaves):
/// the holder keeps the lock through renewals at the new master, and its
/// release still wakes the waiter at once, long before the lease would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_slot_moved_mid_hold_keeps_the_holder_and_still_wakes_the_waiter() {
    // A cluster of its own: moving a slot would disturb the other tests.
    let cluster = &*Box::leak(Box::new(RedisCluster::start(3)));
    let prefix = unique("cl-move");
    let holder = runtime_on(cluster, &prefix).await;
    let waiter = runtime_on(cluster, &prefix).await;
    let key = "order:7";
    let slot = cluster.slot_of(&holder.backend_key(key));
    // Long enough that a waiter retrying at the holder's lease end could not
    // be mistaken for one woken by the release.
    let lease = Duration::from_secs(4);
    let guard = holder.lock(key).lease(lease).acquire().await.unwrap();
    let first_token = guard.fence();

    let waiting = spawn_waiter(&waiter, key);
    lock_tests::wait_until("the waiter waits", || waiter.stats().waiting_keys == 1).await;

    let from = cluster.owner_of(slot);
    let to = (from + 1) % 3;
    tokio::task::spawn_blocking(move || cluster.move_slot(slot, to))
        .await
        .unwrap();
    assert_eq!(cluster.owner_of(slot), to, "the slot did not move");

    // The waiter's subscription follows the slot to its new master.
    let channel = format!("{}:released", holder.backend_key(key));
    let moved = Instant::now();
    until_subscribed(cluster, to, &channel).await;
    eprintln!(
        "re-subscribed at the new master {:?} after the move",
        moved.elapsed()
    );
    assert_eq!(
        subscribers(cluster, from, &channel).await,
        0,
        "still subscribed at the old master"
    );

    // Past a renewal at the new master (the watchdog renews every third of
    // the lease): kept only if renewals reach it.
    tokio::time::sleep(lease / 2).await;
    assert!(
        !guard.is_lost(),
        "the holder lost the lock when its slot moved"
    );
    let info = waiter.inspect(key).await.unwrap().expect("still held");
    assert_eq!(info.fence, Some(first_token));

    let second = release_and_wake(guard, waiting, lease).await;
    assert!(
        second.fence() > first_token,
        "tokens must grow across the move"
    );
    second.release().await.unwrap();
}

/// A task of `waiter` waiting (up to 20 s) for `key`; it returns when it got
/// the lock, and the lock.
fn spawn_waiter(
    waiter: &LockRuntime,
    key: &'static str,
) -> tokio::task::JoinHandle<(Instant, LockGuard)> {
    let waiter = waiter.clone();
    tokio::spawn(async move {
        let lock = waiter.lock(key).wait(Duration::from_secs(20));
        let guard = lock.acquire().await.unwrap();
        (Instant::now(), guard)
    })
}

/// Releases `guard` while `waiting` still waits, and checks the waiter got
/// the lock at once (well before the lease would have let it in).
async fn release_and_wake(
    guard: LockGuard,
    waiting: tokio::task::JoinHandle<(Instant, LockGuard)>,
    lease: Duration,
) -> LockGuard {
    assert!(
        !waiting.is_finished(),
        "the waiter got in while the lock was held"
    );
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (woken_at, second) = waiting.await.unwrap();
    let after = woken_at.duration_since(released_at);
    assert!(
        after < Duration::from_millis(500),
        "the waiter took {after:?} after the release (lease {lease:?}): it was not woken"
    );
    second
}

/// A runtime on `cluster` (a test's own).
async fn runtime_on(cluster: &RedisCluster, prefix: &str) -> LockRuntime {
    LockRuntime::builder()
        .redis_cluster(cluster.urls())
        .key_prefix(prefix)
        .build()
        .await
        .unwrap()
}

/// Subscribers of the sharded channel `channel` at master `node`.
async fn subscribers(cluster: &RedisCluster, node: usize, channel: &str) -> u64 {
    let mut con = cluster.node(node).connection().await;
    let reply: (String, u64) = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query_async(&mut con)
        .await
        .unwrap();
    reply.1
}

/// Waits (bounded: 5 s) until master `node` has one subscriber of `channel`.
async fn until_subscribed(cluster: &RedisCluster, node: usize, channel: &str) {
    for _ in 0..500 {
        if subscribers(cluster, node, channel).await == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no subscriber of {channel} at master {node} within 5 s");
}

/// The master of a waited-for lock drops the waiter's connection (and with
/// it the subscription): the client reconnects, subscribes again, and the
/// release still wakes the waiter at once; the holder never noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_subscriptions_come_back_after_a_dropped_connection() {
    // A cluster of its own: dropping connections would disturb the others.
    let cluster = &*Box::leak(Box::new(RedisCluster::start(3)));
    let prefix = unique("cl-reconnect");
    let holder = runtime_on(cluster, &prefix).await;
    let waiter = runtime_on(cluster, &prefix).await;
    let key = "order:9";
    let channel = format!("{}:released", holder.backend_key(key));
    let node = cluster.owner_of(cluster.slot_of(&channel));
    let lease = Duration::from_secs(4);
    let guard = holder.lock(key).lease(lease).acquire().await.unwrap();
    let waiting = spawn_waiter(&waiter, key);
    until_subscribed(cluster, node, &channel).await;

    let mut admin = cluster.node(node).connection().await;
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 1, "no subscribed connection to drop");
    let dropped = Instant::now();
    until_subscribed(cluster, node, &channel).await;
    eprintln!(
        "re-subscribed {:?} after the connection was dropped",
        dropped.elapsed()
    );

    let second = release_and_wake(guard, waiting, lease).await;
    second.release().await.unwrap();
}

/// A cluster configuration a user can get wrong is refused with a message
/// that says what to do, and never echoes a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_configuration_errors_say_what_is_wrong() {
    let empty: [&str; 0] = [];
    let error = LockRuntime::builder()
        .redis_cluster(empty)
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("at least one cluster node"), "{error}");

    let error = LockRuntime::builder()
        .redis_cluster(["redis://:hunter2@127.0.0.1:1", "http://x"])
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("expected redis://"), "{error}");
    assert!(!error.contains("hunter2"), "{error}");

    // A single server that is not in cluster mode.
    let single = lock_tests::redis().url();
    let error = LockRuntime::builder()
        .redis_cluster([single])
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("cannot connect"), "{error}");
}
