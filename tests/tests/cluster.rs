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
use lock_tests::assert_token_above;
use lock_tests::on_cluster::{keys_by_master, spawn_slot_mover, ClusterTest, Load, Worker};
use lock_tests::spawn::Timed;
use lock_tests::stored::kill_clients;
use lock_tests::{cluster, spawn_waiting, until_listed, wait_until, Kind, Occupancy};
use redis::AsyncCommands;
use tokio::time::Instant;

/// Two runtimes (two processes) contend for keys on all three masters: each
/// key's counter is exact and no key ever has two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_locks_on_every_master_exclude_across_runtimes() {
    let (a, b) = Kind::Cluster.two("cl-excl").await;
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
        let rt = [&a, &b][worker % 2].clone();
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
    let (runtime, observer) = Kind::Cluster.two("cl-renew").await;
    let keys = keys_by_master(cluster(), &runtime, 10).concat();
    let lease = Duration::from_millis(1200);
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
    let test = ClusterTest::own("cl-move");
    let cluster = test.cluster;
    let (holder, waiter) = (test.runtime().await, test.runtime().await);
    let key = "order:7";
    let slot = cluster.slot_of(&holder.backend_key(key));
    // Long enough that a waiter retrying at the holder's lease end could not
    // be mistaken for one woken by the release.
    let lease = Duration::from_secs(4);
    let guard = holder.lock(key).lease(lease).acquire().await.unwrap();
    let first_token = guard.fence();

    let waiting = spawn_waiter(&waiter, key);
    lock_tests::wait_until("the waiter waits", || waiter.stats().waiting_keys == 1).await;

    let (from, to) = test.move_to_next(slot).await;
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
    assert_token_above(&second, first_token, "the hold before the move");
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
    let key = "order:9";
    // A cluster of its own: dropping connections would disturb the others.
    let test = ClusterTest::own("cl-reconnect");
    let cluster = test.cluster;
    let (holder, waiter) = (test.runtime().await, test.runtime().await);
    let channel = format!("{}:released", holder.backend_key(key));
    let node = cluster.owner_of(cluster.slot_of(&channel));
    let lease = Duration::from_secs(4);
    let guard = holder.lock(key).lease(lease).acquire().await.unwrap();
    let waiting = spawn_waiter(&waiter, key);
    until_subscribed(cluster, node, &channel).await;

    let mut admin = cluster.node(node).connection().await;
    let killed = kill_clients(&mut admin, &["pubsub"]).await;
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

/// The wait of a waiter that the test, not its deadline, ends.
const LONG: Duration = Duration::from_secs(30);

/// Locks `holder` takes for a freeze test: one on master 0 (the one to be
/// frozen) and one on master 1, with their keys, and the holder.
struct TwoHolds {
    _holder: LockRuntime,
    frozen_key: String,
    healthy_key: String,
    on_frozen: LockGuard,
    on_healthy: LockGuard,
}

/// A freeze test's start: a cluster of its own (in turn), a holder with
/// [`TwoHolds`], and another process (returned).
async fn holds_on_two_masters(name: &str) -> (ClusterTest, LockRuntime, TwoHolds) {
    let test = ClusterTest::own_in_turn(name).await;
    let (holder, other) = test.two_plain().await;
    let keys = keys_by_master(test.cluster, &holder, 1);
    let (frozen_key, healthy_key) = (keys[0][0].clone(), keys[1][0].clone());
    let lease = Duration::from_secs(10);
    let hold = |key: &str| holder.lock(key).lease(lease).acquire();
    let on_frozen = hold(&frozen_key).await.unwrap();
    let on_healthy = hold(&healthy_key).await.unwrap();
    let two = TwoHolds {
        _holder: holder.clone(),
        frozen_key,
        healthy_key,
        on_frozen,
        on_healthy,
    };
    (test, other, two)
}

/// Freezes master 0; returns when.
fn freeze_master_0(cluster: &RedisCluster) -> Instant {
    cluster.node(0).freeze();
    Instant::now()
}

/// Thaws master 0 at `froze_at` + 1.6 s: before the cluster would declare
/// it failed (node timeout 2 s).
fn thaw_in_time(cluster: &'static RedisCluster, froze_at: Instant) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep_until(froze_at + Duration::from_millis(1600)).await;
        cluster.node(0).thaw();
    })
}

/// Waits for the acquire `waiting` to end while master 0, frozen at
/// `froze_at`, is thawed in time ([`thaw_in_time`]); returns how long after
/// `released_at` it ended, and how.
async fn got_in_time(
    cluster: &'static RedisCluster,
    froze_at: Instant,
    waiting: tokio::task::JoinHandle<Timed>,
    released_at: Instant,
) -> (Duration, Result<LockGuard, lock_runtime::LockError>) {
    let thaw = thaw_in_time(cluster, froze_at);
    let (got_at, got) = waiting.await.unwrap();
    thaw.await.unwrap();
    (got_at.duration_since(released_at), got)
}

/// Keys that play with the hash tag: braces, a leading `}` or `\`, an
/// empty-ish key, a very long one. Every name of each lock (hash, counter,
/// channel, queue, queue places) must hash to one slot, and the lock must
/// work on the cluster (a script touching two slots is refused there with
/// CROSSSLOT), also in fair mode, which touches the queue names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_odd_keys_keep_every_lock_name_in_one_slot() {
    let test = ClusterTest::shared("rv-odd");
    let cluster = test.cluster;
    let (plain, fair) = (
        test.runtime_fair(false).await,
        test.runtime_fair(true).await,
    );
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
    let test = ClusterTest::own_in_turn("rv-freeze-renew").await;
    let cluster = test.cluster;
    let runtime = test.runtime_fair(false).await;
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
    let (test, waiter, two) = holds_on_two_masters("rv-freeze-wait").await;
    let what = "the waiter waits on the frozen master's key";
    let first_wait = spawn_waiting(&waiter, waiter.lock(&two.frozen_key).wait(LONG), what).await;
    let froze_at = freeze_master_0(test.cluster);
    // The first wait ends: its channel is unsubscribed, at the frozen master.
    first_wait.abort();
    let _ = first_wait.await;
    wait_until("the first wait is gone", || {
        waiter.stats().waiting_keys == 0
    })
    .await;

    let what = "the waiter waits on the healthy master's key";
    let second_wait = spawn_waiting(&waiter, waiter.lock(&two.healthy_key).wait(LONG), what).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    two.on_healthy.release().await.unwrap();
    eprintln!("the holder's release took {:?}", released_at.elapsed());
    let (after, second) = got_in_time(test.cluster, froze_at, second_wait, released_at).await;
    eprintln!("woken {after:?} after the release of the healthy key");
    second.unwrap().release().await.unwrap();
    drop(two.on_frozen);
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
    let (test, other, two) = holds_on_two_masters("rv-freeze-release").await;
    let what = "the other process waits";
    let waiting = spawn_waiting(&other, other.lock(&two.healthy_key).wait(LONG), what).await;

    let froze_at = freeze_master_0(test.cluster);
    drop(two.on_frozen);
    // Let the releaser take the frozen master's release as a batch of its own.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    drop(two.on_healthy);
    let (after, guard) = got_in_time(test.cluster, froze_at, waiting, released_at).await;
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
    let test = ClusterTest::own_in_turn("rv-fair-move").await;
    let cluster = test.cluster;
    let fair = || test.runtime_fair(true);
    let (holder, first, second) = (fair().await, fair().await, fair().await);
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
    until_listed(&mut from_con, &lock_key, 1, Duration::from_secs(2)).await;
    let second_task = spawn_waiter(second.clone());
    wait_until("the second waits", || second.stats().waiting_keys == 1).await;
    until_listed(&mut from_con, &lock_key, 2, Duration::from_secs(2)).await;
    let (_, to) = test.move_to_next(slot).await;
    let mut to_con = cluster.node(to).connection().await;
    let queued: Vec<String> = to_con.lrange(&queue, 0, -1).await.unwrap();
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
        if to_con.exists(&name).await.unwrap() {
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
    let test = ClusterTest::own_in_turn("rv-storm").await;
    let cluster = test.cluster;
    let (a, b) = test.two_plain().await;
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
    let load = Load::on(keys);
    let begun = Instant::now();
    let how = Worker {
        stride: 1,
        lease: Duration::from_secs(20),
        wait: Duration::from_secs(60),
        inside: Duration::from_millis(2),
    };
    // Until the slot has made all its moves (bounded by the mover).
    let tasks = load.spawn([&a, &b], 8, how);
    let pause = Duration::from_millis(150);
    let mover = spawn_slot_mover(cluster, slot, (6, pause, pause), load.stop.clone());
    let moves = mover.await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let took = begun.elapsed();
    let (total, holds) = (load.counted(), load.holds.load(Ordering::SeqCst));
    let max = load.occupancy.iter().map(|o| o.max()).max().unwrap();
    let errors = load.errors.lock().unwrap().clone();
    let longest_wait = load.longest_wait_ms.load(Ordering::SeqCst);
    eprintln!(
        "{} keys: {total} holds in {took:?}, longest wait {longest_wait} ms, moves {moves:?}, \
         errors {}",
        load.keys.len(),
        errors.len()
    );
    assert_eq!(max, 1, "two holders of one key at once");
    assert!(errors.is_empty(), "acquires or releases failed: {errors:?}");
    assert_eq!(total, holds, "lost updates");
    assert!(
        longest_wait < 10_000,
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
    let test = ClusterTest::own_in_turn("rv-restart").await;
    let (holder, waiter) = test.two_plain().await;
    let key = "order:restart";
    let master = test.master_of(&holder, key);
    let lease = Duration::from_secs(15);
    let guard = holder.lock(key).lease(lease).acquire().await.unwrap();
    let first = guard.fence();
    let request = waiter.lock(key).lease(lease).wait(Duration::from_secs(60));
    let waiting = spawn_waiting(&waiter, request, "the waiter waits").await;
    let restarted_at = Instant::now();
    test.restart_empty(master).await;
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
    assert_token_above(&got, first, "the hold before the restart");
    assert!(
        got_at.duration_since(restarted_at) < lease / 2,
        "the waiter waited for the old lease"
    );
    got.release().await.unwrap();
}

/// The master of a waited-for lock freezes: waiting must stay bounded ("a
/// bounded wait returns at its deadline … by the deadline plus the try
/// timeout at the latest"; "a try-once takes at most the try timeout … all
/// of this holds while Redis is down or the network stalls").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waits_on_a_frozen_master_stay_bounded() {
    let test = ClusterTest::own_in_turn("rv-frozen-wait").await;
    let cluster = test.cluster;
    let (holder, waiter) = test.two_plain().await;
    let key = "order:frozen";
    let master = test.master_of(&holder, key);
    let lease = Duration::from_secs(10);
    let guard = holder.lock(key).lease(lease).acquire().await.unwrap();
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
    let test = ClusterTest::own_in_turn("rv-push").await;
    let cluster = test.cluster;
    let owner = test.runtime_fair(false).await;
    let (a, b) = test.two_plain().await;
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

    let load = Load::on(keys_by_master(cluster, &a, 4).concat());
    let how = Worker {
        stride: 7,
        lease: Duration::from_secs(20),
        wait: Duration::from_secs(10),
        inside: Duration::ZERO,
    };
    let tasks = load.spawn([&a, &b], 16, how);
    let (pause, settle) = (Duration::from_millis(200), Duration::from_millis(300));
    let mover = spawn_slot_mover(cluster, slot, (9, pause, settle), load.stop.clone());
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
    let errors = load.errors.lock().unwrap().clone();
    let (doubled, unordered) = load.doubled_and_unordered();
    eprintln!(
        "{} holds; {} errors (first: {:?}); two holders: {doubled:?}; tokens out of order: \
         {unordered:?}; moved lock's waiters woken {woken:?} after its release",
        load.holds.load(Ordering::SeqCst),
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
