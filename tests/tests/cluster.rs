//! What a Redis Cluster adds to the single server: locks spread over every
//! master, renewals that must stay in one slot per pipeline, slots that
//! move, with their keys, fair queues and sharded release channels, while
//! locks are held and waited for, and one master frozen or restarted empty
//! while the others serve. (Every behaviour of `on_every_backend!` also
//! runs on a cluster; these are the cluster's own.)
//!
//! Every fault test runs on a cluster of its own (freezing a master or
//! moving a slot would disturb any other test on it) and takes its turn
//! (they measure timing on a small machine).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockGuard, LockRuntime};
use lock_testkit::RedisCluster;
use lock_tests::{cluster, unique, wait_until, Kind, Occupancy};
use tokio::time::Instant;

/// Two runtimes (two processes) contend for keys on all three masters: each
/// key's counter is exact and no key ever has two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_locks_on_every_master_exclude_across_runtimes() {
    let prefix = unique("cl-excl");
    let a = Kind::Cluster.runtime(&prefix).await;
    let b = Kind::Cluster.runtime(&prefix).await;
    let keys = keys_by_master(cluster(), &a, 2).concat();
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
    let keys = keys_by_master(cluster(), &runtime, 10).concat();
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

// ---------------------------------------------------------------------------
// Faults of one master: freezes, restarts, slot moves under load
// ---------------------------------------------------------------------------

/// One fault test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A cluster of the test's own, alive until the test process exits.
fn own_cluster() -> &'static RedisCluster {
    Box::leak(Box::new(RedisCluster::start(3)))
}

/// A runtime on `cluster` (one "process" of a test), default timeouts.
async fn cluster_runtime(cluster: &RedisCluster, prefix: &str) -> LockRuntime {
    LockRuntime::builder()
        .redis_cluster(cluster.urls())
        .key_prefix(prefix)
        .fair(false)
        .build()
        .await
        .unwrap()
}

/// The master that stores the lock of `key`.
fn master_of(cluster: &RedisCluster, runtime: &LockRuntime, key: &str) -> usize {
    cluster.owner_of(cluster.slot_of(&runtime.backend_key(key)))
}

/// `per_master` keys whose locks live on each master, by master.
fn keys_by_master(cluster: &RedisCluster, runtime: &LockRuntime, per: usize) -> Vec<Vec<String>> {
    let mut found: Vec<Vec<String>> = vec![Vec::new(); 3];
    for n in 0..10_000 {
        let key = format!("item:{n}");
        let owner = master_of(cluster, runtime, &key);
        if found[owner].len() < per {
            found[owner].push(key);
        }
        if found.iter().all(|keys| keys.len() == per) {
            return found;
        }
    }
    panic!("no keys found on every master");
}

/// Spawns `request.acquire()`; the task returns when it ended, and how.
fn timed_acquire(
    request: lock_runtime::LockRequest,
) -> tokio::task::JoinHandle<(Instant, Result<LockGuard, lock_runtime::LockError>)> {
    tokio::spawn(async move {
        let got = request.acquire().await;
        (Instant::now(), got)
    })
}

/// Locks `holder` takes for a freeze test: one on master 0 (the one to be
/// frozen) and one on master 1, with their keys.
struct TwoHolds {
    frozen_key: String,
    healthy_key: String,
    on_frozen: LockGuard,
    on_healthy: LockGuard,
}

async fn hold_on_two_masters(cluster: &RedisCluster, holder: &LockRuntime) -> TwoHolds {
    let keys = keys_by_master(cluster, holder, 1);
    let (frozen_key, healthy_key) = (keys[0][0].clone(), keys[1][0].clone());
    let lease = Duration::from_secs(10);
    let hold = |key: &str| holder.lock(key).lease(lease).acquire();
    let on_frozen = hold(&frozen_key).await.unwrap();
    let on_healthy = hold(&healthy_key).await.unwrap();
    TwoHolds {
        frozen_key,
        healthy_key,
        on_frozen,
        on_healthy,
    }
}

/// Thaws master 0 at `froze_at` + 1.6 s: before the cluster would declare
/// it failed (node timeout 2 s).
fn thaw_in_time(cluster: &'static RedisCluster, froze_at: Instant) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep_until(froze_at + Duration::from_millis(1600)).await;
        cluster.node(0).thaw();
    })
}

/// Keys that play with the hash tag: braces, a leading `}` or `\`, an
/// empty-ish key, a very long one. Every name of each lock (hash, counter,
/// channel, queue, queue places) must hash to one slot, and the lock must
/// work on the cluster (a script touching two slots is refused there with
/// CROSSSLOT), also in fair mode, which touches the queue names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_odd_keys_keep_every_lock_name_in_one_slot() {
    let cluster = lock_tests::cluster();
    let prefix = unique("rv-odd");
    let plain = cluster_runtime(cluster, &prefix).await;
    let fair = LockRuntime::builder()
        .redis_cluster(cluster.urls())
        .key_prefix(&prefix)
        .fair(true)
        .build()
        .await
        .unwrap();
    let long = "x}{".repeat(1300);
    let keys = [
        "}".to_owned(),
        "}}".to_owned(),
        "{".to_owned(),
        "{}".to_owned(),
        "}{".to_owned(),
        "\\".to_owned(),
        "\\}".to_owned(),
        "}\\".to_owned(),
        "a}b".to_owned(),
        "{a}b".to_owned(),
        "a{b}c".to_owned(),
        "\\\\}".to_owned(),
        " ".to_owned(),
        ":fence".to_owned(),
        "}:fence".to_owned(),
        "x:released".to_owned(),
        long,
    ];
    for key in &keys {
        let hash = plain.backend_key(key);
        let slot = cluster.slot_of(&hash);
        for suffix in [":fence", ":released", ":queue", ":queued"] {
            let name = format!("{hash}{suffix}");
            assert_eq!(
                cluster.slot_of(&name),
                slot,
                "{key:?}: {suffix} is on another slot than the lock"
            );
        }
        for runtime in [&plain, &fair] {
            let guard = runtime
                .lock(key)
                .wait(Duration::from_secs(2))
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("{key:?}: {e}"));
            let info = plain.inspect(key).await.unwrap().expect("held");
            assert_eq!(info.fence, Some(guard.fence()), "{key:?}");
            guard.release().await.unwrap();
            assert!(!plain.is_locked(key).await.unwrap(), "{key:?}");
        }
    }
    // Two different odd keys are two different locks.
    let a = plain.lock("}").acquire().await.unwrap();
    let b = plain.lock("\\}").wait(Duration::ZERO).acquire().await;
    assert!(b.is_ok(), "`}}` and `\\}}` share a lock: {b:?}");
    drop(b);
    a.release().await.unwrap();
}

/// One master frozen for a little less than the cluster's node timeout (so
/// the other masters still serve their slots): the locks held on the two
/// healthy masters are renewed there and must not be declared lost ("the
/// same as one server, per lock, as long as the lock's master is up"); the
/// locks on the frozen master are told lost by their lease end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_frozen_master_costs_no_lock_on_the_healthy_masters() {
    let _turn = SERIAL.lock().await;
    let cluster = own_cluster();
    let prefix = unique("rv-freeze-renew");
    let runtime = cluster_runtime(cluster, &prefix).await;
    let keys = keys_by_master(cluster, &runtime, 3);
    let lease = Duration::from_millis(1200);
    let mut guards = Vec::new();
    for (master, keys) in keys.iter().enumerate() {
        for key in keys {
            let guard = runtime.lock(key).lease(lease).acquire().await.unwrap();
            guards.push((master, key.clone(), guard));
        }
    }
    let frozen = 0;
    // A renewal round first, so every lock is in the watchdog's rhythm.
    tokio::time::sleep(lease / 2).await;
    cluster.node(frozen).freeze();
    let froze_at = Instant::now();
    let freeze = Duration::from_millis(1700);
    let mut lost_at: Vec<Option<Duration>> = vec![None; guards.len()];
    while froze_at.elapsed() < freeze {
        for (i, (_, _, guard)) in guards.iter().enumerate() {
            if guard.is_lost() && lost_at[i].is_none() {
                lost_at[i] = Some(froze_at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cluster.node(frozen).thaw();
    // One more lease after the thaw: the healthy locks must still be held.
    tokio::time::sleep(lease).await;
    let mut healthy_lost = Vec::new();
    for (i, (master, key, guard)) in guards.iter().enumerate() {
        eprintln!(
            "master {master} {key}: lost {} (seen at {:?} after the freeze)",
            guard.is_lost(),
            lost_at[i]
        );
        if *master == frozen {
            assert!(guard.is_lost(), "{key} on the frozen master not told lost");
        } else if guard.is_lost() {
            healthy_lost.push(format!("{key}@{master} at {:?}", lost_at[i]));
        }
    }
    assert!(
        healthy_lost.is_empty(),
        "locks on healthy masters declared lost while master {frozen} was frozen: {healthy_lost:?}"
    );
}

/// One master frozen: a waiter of this process on a lock of a healthy
/// master must still be woken by the release at once. The runtime's one
/// subscription task is made to talk to the frozen master first (the
/// waiter's previous wait, on a key of that master, ends and unsubscribes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_frozen_master_does_not_delay_waiters_on_the_healthy_masters() {
    let _turn = SERIAL.lock().await;
    let cluster = own_cluster();
    let prefix = unique("rv-freeze-wait");
    let holder = cluster_runtime(cluster, &prefix).await;
    let waiter = cluster_runtime(cluster, &prefix).await;
    let TwoHolds {
        frozen_key,
        healthy_key,
        on_frozen,
        on_healthy,
    } = hold_on_two_masters(cluster, &holder).await;

    let first_wait = timed_acquire(waiter.lock(&frozen_key).wait(Duration::from_secs(30)));
    wait_until("the waiter waits on the frozen master's key", || {
        waiter.stats().waiting_keys == 1
    })
    .await;
    cluster.node(0).freeze();
    let froze_at = Instant::now();
    // The first wait ends: its channel is unsubscribed, at the frozen master.
    first_wait.abort();
    let _ = first_wait.await;
    wait_until("the first wait is gone", || {
        waiter.stats().waiting_keys == 0
    })
    .await;

    let second_wait = timed_acquire(waiter.lock(&healthy_key).wait(Duration::from_secs(30)));
    wait_until("the waiter waits on the healthy master's key", || {
        waiter.stats().waiting_keys == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    on_healthy.release().await.unwrap();
    eprintln!("the holder's release took {:?}", released_at.elapsed());
    let thaw = thaw_in_time(cluster, froze_at);
    let (woken_at, second) = second_wait.await.unwrap();
    thaw.await.unwrap();
    let after = woken_at.duration_since(released_at);
    eprintln!("woken {after:?} after the release of the healthy key");
    second.unwrap().release().await.unwrap();
    drop(on_frozen);
    assert!(
        after < Duration::from_millis(500),
        "the waiter on a healthy master took {after:?} after the release (master 0 frozen)"
    );
}

/// One master frozen: a guard dropped on a lock of the frozen master, then
/// one dropped on a lock of a healthy master. The second background
/// release must reach its (healthy) master at once: another process waiting
/// for that lock gets it "one round trip later", not after the frozen
/// master's release gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_frozen_master_does_not_delay_background_releases_on_the_healthy_masters() {
    let _turn = SERIAL.lock().await;
    let cluster = own_cluster();
    let prefix = unique("rv-freeze-release");
    let holder = cluster_runtime(cluster, &prefix).await;
    let other = cluster_runtime(cluster, &prefix).await;
    let TwoHolds {
        frozen_key: _,
        healthy_key,
        on_frozen,
        on_healthy,
    } = hold_on_two_masters(cluster, &holder).await;

    let waiting = timed_acquire(other.lock(&healthy_key).wait(Duration::from_secs(30)));
    wait_until("the other process waits", || {
        other.stats().waiting_keys == 1
    })
    .await;

    cluster.node(0).freeze();
    let froze_at = Instant::now();
    drop(on_frozen);
    // Let the releaser take the frozen master's release as a batch of its own.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    drop(on_healthy);
    let thaw = thaw_in_time(cluster, froze_at);
    let (got_at, guard) = waiting.await.unwrap();
    thaw.await.unwrap();
    let after = got_at.duration_since(released_at);
    eprintln!("the other process got the healthy key {after:?} after the guard was dropped");
    guard.unwrap().release().await.unwrap();
    assert!(
        after < Duration::from_millis(500),
        "a background release on a healthy master took {after:?} (master 0 frozen)"
    );
}

/// The fair-mode queue of a lock moves with its slot: two other processes
/// queue for a held lock, the slot moves to another master, and the holder
/// releases at once (before the waiters can have subscribed again at the new
/// master, so the handoff message may go unheard). The lock must still go
/// to the first in line and then the second, each promptly (the handoff's
/// claim is 3 s: a waiter that misses its handoff would only see the key
/// free when the claim runs out), with the queue entries moved along and
/// nothing left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_fair_queue_moves_with_its_slot_and_hands_over_in_order() {
    let _turn = SERIAL.lock().await;
    let cluster = own_cluster();
    let prefix = unique("rv-fair-move");
    let fair_runtime = || async {
        LockRuntime::builder()
            .redis_cluster(cluster.urls())
            .key_prefix(&prefix)
            .fair(true)
            .build()
            .await
            .unwrap()
    };
    let (holder, first, second) = (
        fair_runtime().await,
        fair_runtime().await,
        fair_runtime().await,
    );
    let key = "order:fair";
    let lock_key = holder.backend_key(key);
    let slot = cluster.slot_of(&lock_key);
    let lease = Duration::from_secs(10);
    let guard = holder.lock(key).lease(lease).acquire().await.unwrap();
    let spawn_waiter = |runtime: LockRuntime| {
        tokio::spawn(async move {
            let guard = runtime
                .lock(key)
                .lease(lease)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            let got = Instant::now();
            // Hold briefly, so the order is visible.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let fence = guard.fence();
            let released = Instant::now();
            guard.release().await.unwrap();
            (got, released, fence)
        })
    };
    let first_task = spawn_waiter(first.clone());
    wait_until("the first waits", || first.stats().waiting_keys == 1).await;
    let queue = format!("{lock_key}:queue");
    let mut from_con = cluster.node(cluster.owner_of(slot)).connection().await;
    for _ in 0..200 {
        let len: u64 = redis::cmd("LLEN")
            .arg(&queue)
            .query_async(&mut from_con)
            .await
            .unwrap();
        if len == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second_task = spawn_waiter(second.clone());
    wait_until("the second waits", || second.stats().waiting_keys == 1).await;
    for _ in 0..200 {
        let len: u64 = redis::cmd("LLEN")
            .arg(&queue)
            .query_async(&mut from_con)
            .await
            .unwrap();
        if len == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let from = cluster.owner_of(slot);
    let to = (from + 1) % 3;
    tokio::task::spawn_blocking(move || cluster.move_slot(slot, to))
        .await
        .unwrap();
    let mut to_con = cluster.node(to).connection().await;
    let queued: Vec<String> = redis::cmd("LRANGE")
        .arg(&queue)
        .arg(0)
        .arg(-1)
        .query_async(&mut to_con)
        .await
        .unwrap();
    assert_eq!(
        queued.len(),
        2,
        "the queue did not move with the slot: {queued:?}"
    );
    let first_token = guard.fence();
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (got_first, first_released, first_fence) = first_task.await.unwrap();
    let (got_second, _, second_fence) = second_task.await.unwrap();
    eprintln!(
        "first in line got it {:?} after the release, second {:?} after the first's",
        got_first.duration_since(released_at),
        got_second.saturating_duration_since(first_released)
    );
    assert!(got_first < got_second, "served out of order");
    assert!(
        first_token < first_fence && first_fence < second_fence,
        "tokens did not grow"
    );
    assert!(
        got_first.duration_since(released_at) < Duration::from_millis(1000),
        "the first in line missed its handoff after the move"
    );
    assert!(
        got_second.duration_since(first_released) < Duration::from_millis(1000),
        "the second in line missed its handoff after the move"
    );
    // Nothing left but the counter.
    let mut left = Vec::new();
    for name in [
        lock_key.clone(),
        queue.clone(),
        format!("{lock_key}:queued"),
    ] {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&name)
            .query_async(&mut to_con)
            .await
            .unwrap();
        if exists {
            left.push(name);
        }
    }
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// An acquire storm (two runtimes, eight tasks, keys that share one slot)
/// while that slot is moved from master to master six times: no acquire
/// fails (the scripts meet `ASK`/`TRYAGAIN` mid-move, which the client
/// retries), no key ever has two holders, and no wake-up is lost: every
/// task is done long before a single lease (20 s) would have let a waiter
/// in by expiry. (It once saw waits of two leases: a runtime had gone deaf
/// to the slot's channel, see the test below.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_acquire_storm_survives_a_slot_moved_back_and_forth() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    let _turn = SERIAL.lock().await;
    let cluster = own_cluster();
    let prefix = unique("rv-storm");
    let a = cluster_runtime(cluster, &prefix).await;
    let b = cluster_runtime(cluster, &prefix).await;
    // Keys with one hash tag inside: `{same}:n` all land in one slot (the
    // lock name's tag is the whole key, so find keys of one slot by search).
    let slot = cluster.slot_of(&a.backend_key("storm:0"));
    let mut keys = vec!["storm:0".to_owned()];
    for n in 1..100_000 {
        let key = format!("storm:{n}");
        if cluster.slot_of(&a.backend_key(&key)) == slot {
            keys.push(key);
            if keys.len() == 2 {
                break;
            }
        }
    }
    // Not finding a second key is fine: one hot key is the harder case.
    let lease = Duration::from_secs(20);
    let state: Arc<Vec<(AtomicU64, lock_tests::Occupancy)>> = Arc::new(
        keys.iter()
            .map(|_| (AtomicU64::new(0), lock_tests::Occupancy::new()))
            .collect(),
    );
    let errors = Arc::new(AtomicU64::new(0));
    let holds = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let longest_wait = Arc::new(AtomicU64::new(0));
    let begun = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..8usize {
        let rt = if worker % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        };
        let (keys, state, errors, longest, holds, stop) = (
            keys.clone(),
            state.clone(),
            errors.clone(),
            longest_wait.clone(),
            holds.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut round = 0usize;
            // Until the slot has made all its moves (bounded by the mover).
            while !stop.load(Ordering::SeqCst) {
                let i = (worker + round) % keys.len();
                round += 1;
                let asked = Instant::now();
                let guard = match rt
                    .lock(&keys[i])
                    .lease(lease)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
                {
                    Ok(guard) => guard,
                    Err(e) => {
                        eprintln!("acquire failed: {e}");
                        errors.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                };
                let waited = u64::try_from(asked.elapsed().as_millis()).unwrap();
                longest.fetch_max(waited, Ordering::SeqCst);
                let (counter, occupancy) = &state[i];
                let inside = occupancy.enter();
                let read = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                counter.store(read + 1, Ordering::SeqCst);
                drop(inside);
                holds.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = guard.release().await {
                    eprintln!("release failed: {e}");
                    errors.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    let mover = {
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || {
            let mut moves = Vec::new();
            for _ in 0..6 {
                std::thread::sleep(Duration::from_millis(150));
                let to = (cluster.owner_of(slot) + 1) % 3;
                let at = std::time::Instant::now();
                cluster.move_slot(slot, to);
                moves.push(at.elapsed());
            }
            std::thread::sleep(Duration::from_millis(150));
            stop.store(true, Ordering::SeqCst);
            moves
        })
    };
    let moves = mover.await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let took = begun.elapsed();
    let total: u64 = state.iter().map(|(c, _)| c.load(Ordering::SeqCst)).sum();
    let max = state.iter().map(|(_, o)| o.max()).max().unwrap();
    eprintln!(
        "{} keys: {total} holds in {took:?}, longest wait {} ms, moves {moves:?}, errors {}",
        keys.len(),
        longest_wait.load(Ordering::SeqCst),
        errors.load(Ordering::SeqCst)
    );
    assert_eq!(max, 1, "two holders of one key at once");
    assert_eq!(
        errors.load(Ordering::SeqCst),
        0,
        "acquires or releases failed"
    );
    assert_eq!(total, holds.load(Ordering::SeqCst), "lost updates");
    assert!(
        longest_wait.load(Ordering::SeqCst) < 10_000,
        "a waiter waited about a lease: a wake-up was lost"
    );
}

/// The master of a held and awaited lock loses its data, scripts and
/// connections, as a restart without persistence would. The holder must be
/// told it lost the lock at its next renewal ("a renewal that finds the
/// lock gone … tells the holder at once"); the waiter of another process
/// gets it long before the holder's lease would have ended, and its token
/// is larger (the restarted master's clock in µs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_restarted_empty_tells_the_holder_and_tokens_still_grow() {
    let _turn = SERIAL.lock().await;
    let cluster = own_cluster();
    let prefix = unique("rv-restart");
    let holder = cluster_runtime(cluster, &prefix).await;
    let waiter = cluster_runtime(cluster, &prefix).await;
    let key = "order:restart";
    let master = master_of(cluster, &holder, key);
    let lease = Duration::from_secs(15);
    let guard = holder.lock(key).lease(lease).acquire().await.unwrap();
    let first = guard.fence();
    let waiting = timed_acquire(waiter.lock(key).lease(lease).wait(Duration::from_secs(60)));
    wait_until("the waiter waits", || waiter.stats().waiting_keys == 1).await;
    let restarted_at = Instant::now();
    cluster_node_restart(cluster, master).await;
    let back = restarted_at.elapsed();
    // The holder renews every lease / 3 = 5 s: told within one renewal
    // period plus the reconnection.
    let told = tokio::time::timeout(Duration::from_secs(10), guard.lost()).await;
    let told_after = restarted_at.elapsed();
    let (got_at, got) = waiting.await.unwrap();
    let got = got.unwrap();
    eprintln!(
        "master back after {back:?}; holder told lost {told_after:?} after the restart; \
         waiter in {:?} after; tokens {first} then {}",
        got_at.duration_since(restarted_at),
        got.fence()
    );
    assert!(told.is_ok(), "the holder was not told within 10 s");
    assert!(
        got.fence() > first,
        "the token did not grow across the restart"
    );
    assert!(
        got_at.duration_since(restarted_at) < lease / 2,
        "the waiter waited for the old lease"
    );
    got.release().await.unwrap();
}

/// Makes master `index` of `cluster` look restarted empty, without losing
/// its place in the cluster: its data and script cache are flushed and its
/// clients' connections dropped (the test kit's `restart` needs the node
/// mutably, which `RedisCluster` does not lend).
async fn cluster_node_restart(cluster: &RedisCluster, index: usize) {
    let mut con = cluster.node(index).connection().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut con)
        .await
        .unwrap();
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con)
        .await
        .unwrap();
}

/// The master of a waited-for lock freezes: waiting must stay bounded ("a
/// bounded wait returns at its deadline … by the deadline plus the try
/// timeout at the latest"; "a try-once takes at most the try timeout … all
/// of this holds while Redis is down or the network stalls").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waits_on_a_frozen_master_stay_bounded() {
    let _turn = SERIAL.lock().await;
    let cluster = own_cluster();
    let prefix = unique("rv-frozen-wait");
    let holder = cluster_runtime(cluster, &prefix).await;
    let waiter = cluster_runtime(cluster, &prefix).await;
    let key = "order:frozen";
    let master = master_of(cluster, &holder, key);
    let guard = holder
        .lock(key)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let try_timeout = Duration::from_millis(250);
    let wait = Duration::from_millis(700);
    let slack = Duration::from_millis(150);
    // A waiter already waiting when the master freezes.
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let asked = Instant::now();
            let outcome = waiter.lock(key).wait(wait).acquire().await;
            (asked.elapsed(), outcome.map(|g| g.fence()))
        })
    };
    wait_until("the waiter waits", || waiter.stats().waiting_keys == 1).await;
    cluster.node(master).freeze();
    let froze_at = Instant::now();
    let asked = Instant::now();
    let tried = waiter.lock(key).try_acquire().await;
    let try_took = asked.elapsed();
    let asked = Instant::now();
    let fresh = waiter.lock(key).wait(wait).acquire().await;
    let fresh_took = asked.elapsed();
    let (waited, outcome) = waiting.await.unwrap();
    let thaw_after = froze_at.elapsed();
    cluster.node(master).thaw();
    eprintln!(
        "frozen {thaw_after:?}: try {try_took:?} ({:?}); fresh wait {fresh_took:?} ({:?}); \
         earlier waiter {waited:?} ({outcome:?})",
        tried.as_ref().map(Option::is_some),
        fresh.as_ref().map(|g| g.fence())
    );
    drop(guard);
    assert!(
        tried.is_err() && try_took <= try_timeout + slack,
        "try-once: {try_took:?}"
    );
    assert!(
        fresh.is_err() && fresh_took <= wait + try_timeout + slack,
        "fresh wait: {fresh_took:?}"
    );
    assert!(
        outcome.is_err() && waited <= wait + try_timeout + slack,
        "earlier wait: {waited:?}"
    );
}

/// A slot whose release channel two runtimes subscribe to (they wait for its
/// lock) moves from master to master while both runtimes hammer locks on
/// every master, so their subscription connections are busy subscribing
/// and unsubscribing. Each move makes the old master send its clients a
/// `SUNSUBSCRIBE` push, which redis-rs takes as the reply of whatever
/// subscribe is in flight on that connection. Every reply must still reach
/// its own command: no key may have two holders, no acquire or release may
/// fail on this healthy cluster, each key's tokens grow in the order of its
/// holders; and no runtime may go deaf to the moved lock's channel: its
/// waiters are woken by its releases, within a moment. (They once slept
/// until the holder's lease ended: a re-subscription that the node had
/// refused was reported done, a stray push having been taken for its reply.
/// A subscription now counts only once the node confirmed its channel by
/// name: `lock-runtime/src/backend/redis/heard.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_replies_stay_with_their_commands_while_subscribed_slots_move() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    let _turn = SERIAL.lock().await;
    let cluster = own_cluster();
    let prefix = unique("rv-push");
    let owner = cluster_runtime(cluster, &prefix).await;
    let a = cluster_runtime(cluster, &prefix).await;
    let b = cluster_runtime(cluster, &prefix).await;
    let moved_key = "moved";
    let slot = cluster.slot_of(&owner.backend_key(moved_key));
    let held = owner
        .lock(moved_key)
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for rt in [&a, &b] {
        let rt = rt.clone();
        waiters.push(tokio::spawn(async move {
            let got = rt
                .lock(moved_key)
                .wait(Duration::from_secs(90))
                .acquire()
                .await;
            let at = Instant::now();
            // Given back at once: the other waiter comes next, and must be
            // woken by this release in turn.
            let got = match got {
                Ok(guard) => guard.release().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            (at, got)
        }));
    }
    wait_until("both runtimes wait for the moved lock", || {
        a.stats().waiting_keys == 1 && b.stats().waiting_keys == 1
    })
    .await;

    let keys: Vec<String> = keys_by_master(cluster, &a, 4).concat();
    let occupancy: Arc<Vec<lock_tests::Occupancy>> =
        Arc::new(keys.iter().map(|_| lock_tests::Occupancy::new()).collect());
    let tokens: Arc<Vec<Mutex<Vec<u64>>>> =
        Arc::new(keys.iter().map(|_| Mutex::new(Vec::new())).collect());
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let holds = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for worker in 0..16usize {
        let rt = if worker % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        };
        let (keys, occupancy, tokens, errors, stop, holds) = (
            keys.clone(),
            occupancy.clone(),
            tokens.clone(),
            errors.clone(),
            stop.clone(),
            holds.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut round = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let i = (worker * 7 + round) % keys.len();
                round += 1;
                let got = rt
                    .lock(&keys[i])
                    .lease(Duration::from_secs(20))
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await;
                let guard = match got {
                    Ok(guard) => guard,
                    Err(e) => {
                        errors
                            .lock()
                            .unwrap()
                            .push(format!("acquire {}: {e}", keys[i]));
                        continue;
                    }
                };
                {
                    let _inside = occupancy[i].enter();
                    tokens[i].lock().unwrap().push(guard.fence());
                    tokio::task::yield_now().await;
                }
                holds.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = guard.release().await {
                    errors
                        .lock()
                        .unwrap()
                        .push(format!("release {}: {e}", keys[i]));
                }
            }
        }));
    }
    let mover = {
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || {
            for _ in 0..9 {
                std::thread::sleep(Duration::from_millis(200));
                let to = (cluster.owner_of(slot) + 1) % 3;
                cluster.move_slot(slot, to);
            }
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::SeqCst);
        })
    };
    mover.await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    // The moved lock is still its owner's: neither waiter may have it yet.
    let owner_lost = held.is_lost();
    let early: Vec<bool> = waiters.iter().map(|w| w.is_finished()).collect();
    let released_at = Instant::now();
    let owner_release = held.release().await;
    let mut woken = Vec::new();
    for waiter in waiters {
        let (at, got) = waiter.await.unwrap();
        woken.push((at.duration_since(released_at), got));
    }
    eprintln!(
        "moved lock: owner lost {owner_lost}, its release {owner_release:?}, \
         waiters done before the release {early:?}"
    );
    assert!(
        !owner_lost && !early.contains(&true),
        "the moved lock had two holders: its owner (lost: {owner_lost}) and a waiter ({early:?})"
    );
    let errors = errors.lock().unwrap().clone();
    let mut doubled = Vec::new();
    let mut unordered = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        if occupancy[i].max() > 1 {
            doubled.push(key.clone());
        }
        if !tokens[i].lock().unwrap().windows(2).all(|w| w[0] < w[1]) {
            unordered.push(key.clone());
        }
    }
    eprintln!(
        "{} holds; {} errors (first: {:?}); two holders: {doubled:?}; tokens out of order: \
         {unordered:?}; moved lock's waiters woken {woken:?} after its release",
        holds.load(Ordering::SeqCst),
        errors.len(),
        errors.iter().take(3).collect::<Vec<_>>()
    );
    assert!(doubled.is_empty(), "two holders at once: {doubled:?}");
    assert!(unordered.is_empty(), "tokens out of order: {unordered:?}");
    assert!(
        errors.is_empty(),
        "{} acquires/releases failed: {:?}",
        errors.len(),
        &errors[..errors.len().min(3)]
    );
    // One waiter is woken by the owner's release, the other by the first
    // waiter's: both within a moment, far from the 20 s lease.
    assert!(
        woken
            .iter()
            .all(|(after, got)| got.is_ok() && *after < Duration::from_secs(2)),
        "a waiter of the moved lock was not woken by a release: {woken:?}"
    );
}
