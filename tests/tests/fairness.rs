//! Fair mode: first come, first served across processes, with direct
//! handoff; a queue place lives only as long as its process keeps it, so a
//! dead waiter costs at most its lease and an abandoned queue expires.
//!
//! Each runtime stands for a process (its own connection, waiters and place
//! in the key's Redis queue). The queue is inspected with a raw client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{with_lock, LockError, LockGuard, LockRuntime};
use lock_testkit::{CommandStats, RedisServer};
use lock_tests::spawn::Timed;
use lock_tests::{
    fair_runtime, on_every_backend, poll_every, queue_len, redis, spawn_acquire, unique,
    until_nothing_left, until_queued, wait_until, FaultProxy, Kind, Occupancy,
};
use redis::AsyncCommands;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a queue place lives without a refresh (the runtime's
/// `QUEUE_ENTRY_LIFE`): the queue keys expire at most this long after it.
const PLACE_LIFE: Duration = Duration::from_secs(3);
/// The fence window of the test that waits for everything to expire.
const WINDOW: Duration = Duration::from_secs(1);

on_every_backend!(
    fair_waiters_each_get_the_lock_once_and_exclude
        skip(redlock = "Redlock has no fair mode: a fair request is refused (redlock.rs)"),
);

/// A holder and a waiter (two fair runtimes: two processes) on `server`,
/// the backend name of key `k`, a raw connection for inspecting it, and
/// the prefix they share.
type Pair = (
    LockRuntime,
    LockRuntime,
    String,
    redis::aio::MultiplexedConnection,
    String,
);

async fn pair_on(server: &RedisServer, name: &str) -> Pair {
    let prefix = unique(name);
    let holder = fair_runtime(&server.url(), &prefix).await;
    let waiter = fair_runtime(&server.url(), &prefix).await;
    let hash = holder.backend_key("k");
    (holder, waiter, hash, server.connection().await, prefix)
}

/// Four waiters in four processes, queued one after the other, get the lock
/// in exactly that order: the plain mode's release races cannot reorder them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_different_processes_get_the_lock_in_arrival_order() {
    let prefix = unique("fair-order");
    let url = redis().url();
    let holder = fair_runtime(&url, &prefix).await;
    let hash = holder.backend_key("k");
    let mut con = redis().connection().await;
    let guard = holder.lock("k").acquire().await.unwrap();

    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let runtime = fair_runtime(&url, &prefix).await;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let request = runtime.lock("k").wait(Duration::from_secs(10));
            let g = request.acquire().await?;
            order.lock().unwrap().push(i);
            // Hold a little, so a late waiter would have every chance to barge.
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await?;
            Ok::<_, LockError>(())
        }));
        until_queued(&mut con, &hash, i + 1).await;
    }
    guard.release().await.unwrap();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(
        queue_len(&mut con, &hash).await,
        (0, 0),
        "queue left behind"
    );
}

/// Scripts the server has run since its stats were reset, and the stats.
async fn scripts_run(con: &mut redis::aio::MultiplexedConnection) -> (u64, String) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    let stats = CommandStats::parse(&info);
    (stats.calls("evalsha") + stats.calls("eval"), info)
}

/// On a private server where a holder took the lock (one script) and one
/// waiter queued: waits until the waiter has run both of its scripts, the
/// first attempt (which queued it) and the retry right after it subscribed.
async fn until_waiter_settled(con: &mut redis::aio::MultiplexedConnection) {
    for _ in 0..400 {
        if scripts_run(con).await.0 >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(scripts_run(con).await.0, 3, "holder 1 + waiter 2");
}

/// A release hands the lock over by itself: between the release and the
/// waiter holding the lock, Redis runs exactly one script (the release), not
/// the release plus an acquire. Own server, so no other test's traffic counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_costs_no_acquire_round_trip() {
    let server = RedisServer::start();
    let (holder, waiter, hash, mut con, _) = pair_on(&server, "fair-rt").await;
    let request = holder.lock("k").lease(Duration::from_secs(30));
    let guard = request.acquire().await.unwrap();
    let first_fence = guard.fence();
    let task = tokio::spawn(async move {
        let request = waiter.lock("k").wait(Duration::from_secs(10));
        let g = request.acquire().await.unwrap();
        let at = Instant::now();
        (g, at, waiter)
    });
    until_waiter_settled(&mut con).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut con)
        .await
        .unwrap();
    let released = Instant::now();
    guard.release().await.unwrap();
    let (g, acquired, _waiter) = task.await.unwrap();
    let (scripts, info) = scripts_run(&mut con).await;
    println!(
        "handoff took {:?}; scripts run: {scripts}",
        acquired - released
    );
    assert_eq!(scripts, 1, "more than the release ran:\n{info}");
    assert!(g.fence() > first_fence);
    assert_eq!(queue_len(&mut con, &hash).await, (0, 0));
    g.release().await.unwrap();
}

/// A waiter that queued and then died without a word: while its place is
/// alive a release hands it the lock, which then lasts that waiter's lease
/// (here 300 ms) and no more; a place that ran out is skipped at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_costs_at_most_its_lease() {
    let (holder, waiter, hash, mut con, _) = pair_on(redis(), "fair-dead").await;

    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    // Two ghosts ahead of the real waiter: one whose place ran out long ago,
    // one still alive with a 300 ms lease.
    let guard = holder.lock("k").acquire().await.unwrap();
    let _: () = redis::pipe()
        .rpush(format!("{hash}:queue"), "ghost-expired")
        .hset(
            format!("{hash}:queued"),
            "ghost-expired",
            format!("{}:30000", now_ms - 1),
        )
        .rpush(format!("{hash}:queue"), "ghost-alive")
        .hset(
            format!("{hash}:queued"),
            "ghost-alive",
            format!("{}:300", now_ms + 60_000),
        )
        .query_async(&mut con)
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let request = waiter.lock("k").wait(Duration::from_secs(10));
        let g = request.acquire().await.unwrap();
        (Instant::now(), g)
    });
    until_queued(&mut con, &hash, 3).await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let owner: Option<String> = con.hget(&hash, "ghost-alive").await.unwrap();
    assert_eq!(owner.as_deref(), Some("1"), "the live ghost was skipped");
    let (acquired, g) = task.await.unwrap();
    let waited = acquired - released;
    println!("waited {waited:?} behind a dead waiter with a 300 ms lease");
    assert!(
        waited >= Duration::from_millis(250),
        "took it early: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(2000),
        "took too long: {waited:?}"
    );
    g.release().await.unwrap();
    assert_eq!(queue_len(&mut con, &hash).await, (0, 0));
}

/// A handoff gives the lock with a short claim (at most the 3 s life of a
/// queue place), so a waiter that died just before its turn blocks the key
/// for seconds, not a whole lease; the new holder's watchdog then extends the
/// claim to its full lease (30 s here) well before the claim runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_claim_is_extended_to_the_full_lease() {
    let server = RedisServer::start();
    let (holder, waiter, hash, mut con, _) = pair_on(&server, "fair-claim").await;
    let guard = holder.lock("k").acquire().await.unwrap();
    let task = tokio::spawn(async move {
        let request = waiter.lock("k").lease(Duration::from_secs(30));
        let g = request.acquire().await.unwrap();
        (g, waiter)
    });
    until_queued(&mut con, &hash, 1).await;
    until_waiter_settled(&mut con).await;
    guard.release().await.unwrap();
    let (g, waiter) = task.await.unwrap();
    let claim: i64 = con.pttl(&hash).await.unwrap();
    assert!(
        (1..=3000).contains(&claim),
        "handed over with a {claim} ms TTL, expected a claim of at most 3 s"
    );
    let start = Instant::now();
    let mut ttl = claim;
    while ttl <= 3000 && start.elapsed() < Duration::from_millis(2500) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        ttl = con.pttl(&hash).await.unwrap();
    }
    println!(
        "claim {claim} ms extended to {ttl} ms after {:?}",
        start.elapsed()
    );
    assert!(ttl > 20_000, "the claim was not extended: TTL {ttl} ms");
    assert!(!g.is_lost());
    assert_eq!(waiter.stats().watchdog.lost, 0);
    g.release().await.unwrap();
}

/// A waiter with a short lease (300 ms, renewed) that waited for a long time
/// is handed the lock with a claim it can still use: the lock is not
/// declared lost on arrival, and the watchdog keeps it through 3 leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_handed_over_after_a_long_wait_is_kept() {
    let (holder, waiter, hash, mut con, _) = pair_on(redis(), "fair-short").await;
    let guard = holder.lock("k").acquire().await.unwrap();
    let task = tokio::spawn(async move {
        lock_runtime::with_lock(waiter.lock("k").lease(Duration::from_millis(300)), async {
            tokio::time::sleep(Duration::from_millis(900)).await;
            Ok::<_, LockError>(())
        })
        .await
    });
    until_queued(&mut con, &hash, 1).await;
    // Long enough for several refreshes of the waiter's place.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    guard.release().await.unwrap();
    task.await.unwrap().expect("the handed-over lock was lost");
}

/// The fair script only ever extends the TTL of a lock handed to a holder id
/// when that id claims it: a sibling's claim with a shorter lease must not
/// cut short the lease of the waiter that already took the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_never_shortens_the_lease() {
    let prefix = unique("fair-extend");
    let hash = format!("{prefix}{{k}}");
    let mut con = redis().connection().await;
    let _: () = redis::pipe()
        .hset(&hash, "place-1", 1)
        .pexpire(&hash, 10_000)
        .query_async(&mut con)
        .await
        .unwrap();
    let keys = [
        hash.clone(),
        format!("{hash}:fence"),
        format!("{hash}:queue"),
        format!("{hash}:queued"),
    ];
    let reply: Vec<i64> = redis::cmd("EVAL")
        .arg(include_str!("../../lock-runtime/src/scripts/fair.lua"))
        .arg(4)
        .arg(&keys)
        .arg(&["acquire", "place-1", "50", "1", "3000", "ch", "50", "60000"])
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(reply[0], 2, "a claim of a handed-over lock");
    let ttl: i64 = con.pttl(&hash).await.unwrap();
    assert!(ttl > 9_000, "the claim shortened the TTL to {ttl} ms");
}

/// Waiters that give up (deadline, cancellation) leave the Redis queue, and
/// a try-once never joins it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_leave_the_queue() {
    let (holder, waiter, hash, mut con, _) = pair_on(redis(), "fair-leave").await;
    let guard = holder.lock("k").acquire().await.unwrap();

    let busy = waiter.lock("k").try_acquire().await.unwrap();
    assert!(busy.is_none());
    assert_eq!(queue_len(&mut con, &hash).await, (0, 0), "try-once queued");

    let request = waiter.lock("k").wait(Duration::from_millis(300));
    let err = request.acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    until_queued(&mut con, &hash, 0).await;

    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        waiter.lock("k").wait(Duration::from_secs(10)).acquire(),
    )
    .await;
    assert!(cancelled.is_err());
    until_queued(&mut con, &hash, 0).await;
    assert_eq!(waiter.stats().waiting_keys, 0);

    // The lock still works normally for the next waiter.
    let w = waiter.clone();
    let task = tokio::spawn(async move { w.lock("k").acquire().await.map(|g| g.fence()) });
    until_queued(&mut con, &hash, 1).await;
    let fence = guard.fence();
    guard.release().await.unwrap();
    assert!(task.await.unwrap().unwrap() > fence);
}

/// A waiter queued longer than its place's life (3 s) keeps its place: the
/// head refreshes it while waiting, and gets the lock by handoff at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_wait_keeps_its_place() {
    let (holder, waiter, hash, mut con, prefix) = pair_on(redis(), "fair-long").await;
    let late = fair_runtime(&redis().url(), &prefix).await;
    let guard = holder.lock("k").acquire().await.unwrap();
    let first = tokio::spawn(async move {
        let g = waiter.lock("k").acquire().await.unwrap();
        (Instant::now(), g)
    });
    until_queued(&mut con, &hash, 1).await;
    tokio::time::sleep(Duration::from_millis(4000)).await;
    assert_eq!(queue_len(&mut con, &hash).await, (1, 1), "place ran out");
    let second = tokio::spawn(async move {
        let g = late.lock("k").acquire().await.unwrap();
        (Instant::now(), g)
    });
    until_queued(&mut con, &hash, 2).await;
    guard.release().await.unwrap();
    let (first_at, g1) = first.await.unwrap();
    let fence1 = g1.fence();
    g1.release().await.unwrap();
    let (second_at, g2) = second.await.unwrap();
    assert!(first_at < second_at, "the later waiter went first");
    assert!(g2.fence() > fence1);
    g2.release().await.unwrap();
}

/// Many fair waiters on two runtimes, with a non-atomic counter: exact total,
/// never two holders at once, everybody leaves the queue.
async fn fair_waiters_each_get_the_lock_once_and_exclude(kind: Kind) {
    let (a, b) = kind.two("fair-many").await;
    let counter = Arc::new(Mutex::new(0u64));
    let occupancy = Arc::new(lock_tests::Occupancy::default());
    let mut tasks = Vec::new();
    for i in 0..40 {
        let rt = if i % 2 == 0 { a.clone() } else { b.clone() };
        let counter = counter.clone();
        let occupancy = occupancy.clone();
        tasks.push(tokio::spawn(async move {
            let request = rt.lock("k").fair(true).wait(Duration::from_secs(20));
            let g = request.acquire().await?;
            let inside = occupancy.enter();
            let read = *counter.lock().unwrap();
            tokio::task::yield_now().await;
            *counter.lock().unwrap() = read + 1;
            drop(inside);
            g.release().await?;
            Ok::<_, LockError>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(*counter.lock().unwrap(), 40);
    assert_eq!(occupancy.max(), 1, "two holders at once");
    assert_eq!(a.stats().waiting_keys, 0);
    assert_eq!(b.stats().waiting_keys, 0);
    if let Some(mut con) = kind.connection_storing(&a.backend_key("k")).await {
        until_queued(&mut con, &a.backend_key("k"), 0).await;
    }
}

/// A process waiting for 1,000 keys in fair mode keeps its 1,000 queue
/// places alive with a few scripts per second (the watchdog's tick refreshes
/// them in batches), not one script per key per second; and the places are
/// alive: when the holder releases every key, each waiter is handed its
/// lock. Own server, so no other test's traffic counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_places_of_many_waiting_keys_cost_a_few_scripts_per_second() {
    const KEYS: usize = 1000;
    let server = RedisServer::start();
    let prefix = unique("fair-beat");
    let holder = fair_runtime(&server.url(), &prefix).await;
    let waiter = fair_runtime(&server.url(), &prefix).await;
    let lease = Duration::from_secs(60);
    let mut guards = Vec::new();
    for i in 0..KEYS {
        guards.push(
            holder
                .lock(format!("k{i}"))
                .lease(lease)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let mut waiting = Vec::new();
    for i in 0..KEYS {
        let waiter = waiter.clone();
        waiting.push(tokio::spawn(async move {
            let request = waiter.lock(format!("k{i}")).lease(lease);
            request.wait(Duration::from_secs(30)).acquire().await
        }));
    }
    for _ in 0..10 {
        if waiter.stats().waiting_keys == KEYS {
            break;
        }
        lock_tests::wait_until("every key has a waiter", || {
            waiter.stats().waiting_keys == KEYS
        })
        .await;
    }
    let mut con = server.connection().await;
    // Settled: the holder's acquisitions and every waiter's two attempts
    // (queued, then again once subscribed: the subscriptions go out one by
    // one, so on a busy machine the last retries come seconds later) have
    // run. (Polled: a server's counters send no event.)
    let settled = (3 * KEYS) as u64;
    for _ in 0..400 {
        let (scripts, _) = scripts_run(&mut con).await;
        if scripts >= settled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (scripts, _) = scripts_run(&mut con).await;
    assert!(
        scripts >= settled,
        "only {scripts} scripts ran: not settled"
    );
    let before = CommandStats::read(&mut con).await.unwrap();
    // Longer than a queue entry lives (3 s): places must have been refreshed.
    let span = Duration::from_millis(3500);
    tokio::time::sleep(span).await;
    let after = CommandStats::read(&mut con).await.unwrap();
    let delta = after.since(&before);
    let scripts = delta.get("evalsha") + delta.get("eval");
    eprintln!("{KEYS} waiting keys: {scripts} scripts in {span:?}: {delta:?}");
    assert!(
        scripts <= 20,
        "{scripts} scripts in {span:?} for {KEYS} waiting keys: refreshed one by one?"
    );
    let started = Instant::now();
    for guard in guards {
        guard.release().await.unwrap();
    }
    for task in waiting {
        let guard = task.await.unwrap().unwrap();
        guard.release().await.unwrap();
    }
    eprintln!("every waiter handed its lock in {:?}", started.elapsed());
}

/// Fair mode: a waiting process's place shows in the queue, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_fair_queue() {
    let prefix = unique("inspectq");
    let holder = Kind::Redis.runtime(&prefix).await;
    let waiter = Kind::Redis.runtime(&prefix).await;
    let guard = holder.lock("k").fair(true).acquire().await.unwrap();
    let request = waiter.lock("k").fair(true).wait(Duration::from_secs(10));
    let waiting = tokio::spawn(async move { request.acquire().await });
    let mut queue = Vec::new();
    for _ in 0..500 {
        queue = holder.inspect("k").await.unwrap().expect("held").queue;
        if !queue.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(queue.len(), 1, "the waiting process's place: {queue:?}");
    let handed_over = guard.fence();
    guard.release().await.unwrap();
    let next = waiting.await.unwrap().unwrap();
    assert!(next.fence() > handed_over);
    let after = holder
        .inspect("k")
        .await
        .unwrap()
        .expect("held by the waiter");
    assert_eq!(after.fence, Some(next.fence()));
    assert!(after.queue.is_empty(), "{after:?}");
    next.release().await.unwrap();
}

/// Eight fair waiters of one process on a busy key, with short waits: they
/// share one place, so all but one find it in use; each still returns
/// `Timeout` by its deadline plus the try timeout, and the place is given
/// back when the last one leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_sharing_a_place_keep_their_deadlines() {
    let (holder, waiter, hash, mut con, _) = pair_on(redis(), "rv-fair-deadline").await;
    let guard = holder.lock("k").acquire().await.unwrap();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..8u64 {
        let w = waiter.clone();
        set.spawn(async move {
            let wait = Duration::from_millis(200 + 50 * i);
            let start = Instant::now();
            let got = w.lock("k").wait(wait).acquire().await.map(drop);
            (got, start.elapsed(), wait)
        });
    }
    while let Some(joined) = set.join_next().await {
        let (got, took, wait) = joined.unwrap();
        assert!(matches!(got, Err(LockError::Timeout { .. })), "{got:?}");
        assert!(took >= wait, "gave up early: {took:?} < {wait:?}");
        assert!(
            took < wait + Duration::from_millis(250 + 200),
            "overslept: {took:?} for a wait of {wait:?}"
        );
    }
    until_queued(&mut con, &hash, 0).await;
    guard.release().await.unwrap();
}

/// Fair mode's queue is dropped with its last place: a waiter that gives up
/// leaves the queue at once, and one that dies leaves it to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_fair_queue_expires_with_its_last_place() {
    let prefix = unique("retain-queue");
    // A fence window of a second, so the key's counter is gone soon too.
    let fair = || {
        Kind::Redis
            .builder(&prefix)
            .fair(true)
            .fence_window(WINDOW)
            .build()
    };
    let holder = fair().await.unwrap();
    let waiter = fair().await.unwrap();
    let hash = holder.backend_key("k");
    let mut con = redis().connection().await;
    let guard = holder.lock("k").acquire().await.unwrap();
    // The waiter queues, then "dies": its runtime is dropped mid-wait.
    let waiting = tokio::spawn(async move {
        let request = waiter.lock("k").wait(Duration::from_secs(30));
        let _ = request.acquire().await;
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

async fn runtime(prefix: &str, fair: bool) -> LockRuntime {
    LockRuntime::builder()
        .redis(redis().url())
        .key_prefix(prefix)
        .fair(fair)
        .build()
        .await
        .expect("build the lock runtime")
}

/// Two fair processes and one plain process, two tasks each, take one key
/// in a loop for two seconds (each body a short await). The plain process
/// gets a fair share of the bodies (before, it got almost none: 0-4 against
/// ~1,700 each), and nobody overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_process_on_a_key_fair_processes_use_gets_its_turns() {
    let prefix = unique("mixed");
    let runtimes = [
        runtime(&prefix, true).await,
        runtime(&prefix, true).await,
        runtime(&prefix, false).await,
    ];
    let occupancy = Arc::new(Occupancy::new());
    let counts: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let end = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for (i, runtime) in runtimes.iter().enumerate() {
        for _ in 0..2 {
            let (runtime, occupancy, counts) = (runtime.clone(), occupancy.clone(), counts.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let request = runtime.lock("k").wait(Duration::from_secs(10));
                    with_lock(request, async {
                        let _inside = occupancy.enter();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        counts[i].fetch_add(1, Ordering::Relaxed);
                        Ok::<_, LockError>(())
                    })
                    .await
                    .unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let counts: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    assert_eq!(occupancy.max(), 1, "two holders at once");
    let fair_mean = (counts[0] + counts[1]) / 2;
    assert!(
        counts[2] * 4 >= fair_mean,
        "the plain process hardly got the key: {counts:?} (fair, fair, plain)"
    );
}

/// Waits (bounded: 5 s) until the proxy has dropped a connection at an
/// armed command `count` times.
async fn until_dropped(proxy: &FaultProxy, count: u64) {
    for _ in 0..5000 {
        if proxy.dropped_at_command() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "the proxy dropped {} connections, expected {count}",
        proxy.dropped_at_command()
    );
}

/// A server of the test's own with a fault proxy in front of it, and two
/// fair processes: the holder (direct) and the waiter (through the proxy),
/// with the backend name of `k`, a raw connection and the shared prefix.
struct Proxied {
    server: RedisServer,
    proxy: FaultProxy,
    prefix: String,
    _holder: LockRuntime,
    waiter: LockRuntime,
    hash: String,
    con: redis::aio::MultiplexedConnection,
}

impl Proxied {
    /// Starts the server, the proxy and both runtimes, under a prefix made
    /// from `name`; the holder takes `k` (its guard is returned).
    async fn start(name: &str) -> (Proxied, LockGuard) {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.port()).await;
        let prefix = unique(name);
        let holder = fair_runtime(&server.url(), &prefix).await;
        let waiter = fair_runtime(&proxy.url(), &prefix).await;
        let hash = holder.backend_key("k");
        let con = server.connection().await;
        let guard = holder.lock("k").acquire().await.unwrap();
        let scene = Proxied {
            server,
            proxy,
            prefix,
            _holder: holder,
            waiter,
            hash,
            con,
        };
        (scene, guard)
    }

    /// Another fair process, on the server directly.
    async fn direct(&self) -> LockRuntime {
        fair_runtime(&self.server.url(), &self.prefix).await
    }

    /// The one place queued for `k` (panics if there are others).
    async fn only_place(&mut self) -> String {
        let list = format!("{}:queue", self.hash);
        let queued: Vec<String> = self.con.lrange(list, 0, -1).await.unwrap();
        let [place] = &queued[..] else {
            panic!("expected one queued place: {queued:?}")
        };
        place.clone()
    }
}

/// Waits for the spawned acquire `task`, gives its hold back, and returns
/// how long after `since` it got the hold.
async fn got_after(task: JoinHandle<Timed>, since: Instant) -> Duration {
    let (acquired, got) = task.await.unwrap();
    got.unwrap().release().await.unwrap();
    acquired - since
}

/// Says how long after `since_what` the lock was taken (`waited`), and
/// checks it was within `bound`.
fn taken_within(waited: Duration, bound: Duration, since_what: &str) {
    println!("the lock was taken {waited:?} {since_what}");
    assert!(waited < bound, "waited {waited:?}");
}

/// `runtime`'s acquire of `k` (waiting up to 20 s), spawned.
fn spawn_wait(runtime: &LockRuntime) -> JoinHandle<Timed> {
    spawn_acquire(runtime.lock("k").wait(Duration::from_secs(20)))
}

/// Was a defect (issue 27). A fair waiter whose attempt fails (its
/// connection dropped) gives its queue place up and sends a release for it;
/// if that release is lost too (here each of the releaser's three tries
/// meets a dropped connection), the place stays queued in Redis for its
/// entry's life, and the next release hands it the lock. Nobody took it:
/// the process had forgotten the id, and the lock sat idle for the whole
/// claim (3 s), for every process. Now the process keeps the ids it gave
/// up for that long and gives them back again when Redis answers it, or
/// when a handoff names one: the lock goes on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_to_a_place_given_up_after_a_failed_attempt_is_passed_on_at_once() {
    let (mut p, guard) = Proxied::start("fair-retired").await;
    let task = spawn_wait(&p.waiter);
    // Its place was queued and confirmed just now (the retry after it
    // subscribed): the entry lives 3 s from here.
    until_waiter_settled(&mut p.con).await;
    let place = &p.only_place().await;
    let (proxy, hash) = (&p.proxy, &p.hash);

    // Every chunk takes 50 ms through the proxy: a reconnection (HELLO, then
    // the subscriptions) takes at least 200 ms, time enough to arm the next
    // drop before the next release goes out.
    proxy.slow(Some(Duration::from_millis(50)));
    // The waiter's next attempt (woken by the lost connection) fails: its
    // connection drops as the script goes out. It gives the place up.
    proxy.drop_at_command("acquire");
    proxy.drop_connections();
    until_dropped(proxy, 1).await;
    // The give-back of the place, and the releaser's two retries, each meet
    // a dropped connection: the releaser gives the release up.
    for drops in 2..=4 {
        proxy.drop_at_command(place);
        until_dropped(proxy, drops).await;
    }
    proxy.drop_at_command("no-such-command-is-ever-sent");
    proxy.slow(None);
    let still_queued: Vec<String> = p.con.lrange(format!("{hash}:queue"), 0, -1).await.unwrap();

    let first_fence = guard.fence();
    let released = Instant::now();
    guard.release().await.unwrap();
    let handed_to: Option<String> = p.con.hget(hash, place).await.unwrap();
    let (acquired, got) = task.await.unwrap();
    let next = got.unwrap();
    let waited = acquired - released;
    println!(
        "queue before the release {still_queued:?} (given up: {place}); handed to it: {}; \
         the waiter took the lock {waited:?} after the release",
        handed_to.is_some()
    );
    assert!(
        waited < Duration::from_secs(1),
        "the lock sat {waited:?} on a place its process had given up"
    );
    assert!(next.fence() > first_fence, "tokens went back");
    next.release().await.unwrap();
}

/// Was a defect (issue 27). A fair waiter's attempt takes the free lock for
/// its process's place (no handoff, so no message), and the waiter is
/// cancelled before the reply comes. The lock is held under the place,
/// which the process's next waiter shares, but nobody knew: that waiter
/// found the place busy with the attempt and slept until its next refresh
/// or alarm (up to a second). Now an attempt whose waiter went away wakes
/// the head when it is answered, and the head's attempt claims the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_for_a_waiter_that_went_away_goes_to_the_next_waiter_at_once() {
    let (mut p, guard) = Proxied::start("fair-gone").await;
    let admin = p.direct().await;
    let first = spawn_wait(&p.waiter);
    // Its place was just confirmed (the retry after it subscribed): the next
    // refresh is at least 750 ms away.
    until_waiter_settled(&mut p.con).await;
    let place = &p.only_place().await;
    let second = spawn_wait(&p.waiter);
    let waiter = &p.waiter;
    wait_until("the second waiter queues behind the first", || {
        waiter.stats().waiting == 2
    })
    .await;
    // Every chunk takes 100 ms through the proxy: the first waiter's
    // attempt is answered 100 ms after its script ran.
    p.proxy.slow(Some(Duration::from_millis(100)));
    // The lock is freed without a handoff: the first waiter (woken by the
    // message) takes it for the place.
    assert!(admin.force_unlock("k").await.unwrap());
    drop(guard);
    let (con, hash) = (&mut p.con, &p.hash);
    let taken = async || {
        con.hget::<_, _, Option<String>>(hash, place)
            .await
            .unwrap()
            .is_some()
    };
    let what = "the first waiter's attempt takes the lock";
    poll_every(
        Duration::from_millis(1),
        what,
        Duration::from_secs(1),
        taken,
    )
    .await;
    first.abort();
    let cancelled = Instant::now();
    assert!(first.await.unwrap_err().is_cancelled());
    let (acquired, got) = second.await.unwrap();
    let next = got.unwrap();
    let waited = acquired - cancelled;
    println!("the second waiter took the lock {waited:?} after the first was cancelled");
    // (Before: 1.2 s, the waiter's place alarm; a refresh could not have
    // found the place taken before about 0.9 s.)
    assert!(
        waited < Duration::from_millis(700),
        "the lock sat {waited:?} on the place of a cancelled waiter"
    );
    next.release().await.unwrap();
}

/// The place a waiter's first attempt queues is handed the lock before the
/// waiter has registered or subscribed (so its message reaches nobody): the
/// retry it makes once subscribed claims the lock, no claim runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_before_the_waiter_subscribed_is_taken_at_once() {
    let (mut p, guard) = Proxied::start("fair-early").await;
    // The waiter hears of its first attempt's reply 100 ms after the script
    // queued its place.
    p.proxy.slow(Some(Duration::from_millis(100)));
    let task = spawn_wait(&p.waiter);
    until_queued(&mut p.con, &p.hash, 1).await;
    assert_eq!(p.waiter.stats().waiting_keys, 0, "registered already");
    let released = Instant::now();
    guard.release().await.unwrap();
    let waited = got_after(task, released).await;
    taken_within(waited, Duration::from_millis(1500), "after the release");
}

/// A handoff whose message is lost with the waiter's connection (held in a
/// stalled proxy, then cut): the lost connection wakes the waiter, whose
/// attempt with its place claims the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_whose_message_was_lost_with_the_connection_is_taken_at_once() {
    let (mut p, guard) = Proxied::start("fair-lost-msg").await;
    let task = spawn_wait(&p.waiter);
    until_waiter_settled(&mut p.con).await;
    let proxy = &p.proxy;
    proxy.stall();
    let released = Instant::now();
    guard.release().await.unwrap();
    // The handoff message is held in the proxy, then dropped with it.
    proxy.drop_connections();
    proxy.resume();
    let (acquired, got) = task.await.unwrap();
    // (Its release may meet a connection the proxy's cut reached after the
    // claim: what is checked here is how soon the lock was taken; the key
    // is freed by its lease either way.)
    let _ = got.unwrap().release().await;
    let waited = acquired - released;
    taken_within(waited, Duration::from_millis(1500), "after the release");
}

/// The only waiter of a process is cancelled while a handoff to its place
/// is on its way (held in a stalled proxy): the place is given back when it
/// leaves, and the lock goes on to a waiter of another process as soon as
/// that give-back reaches Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_to_the_place_of_a_cancelled_waiter_goes_on_at_once() {
    let (mut p, guard) = Proxied::start("fair-cancel-handed").await;
    let cancelled = spawn_wait(&p.waiter);
    let other = p.direct().await;
    until_waiter_settled(&mut p.con).await;
    let next = spawn_wait(&other);
    until_queued(&mut p.con, &p.hash, 2).await;
    p.proxy.stall();
    guard.release().await.unwrap();
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    assert_eq!(p.waiter.stats().waiting_keys, 0);
    let resumed = Instant::now();
    p.proxy.resume();
    let waited = got_after(next, resumed).await;
    taken_within(
        waited,
        Duration::from_millis(1000),
        "after the proxy resumed",
    );
}

/// A process passes the lock to its only waiter (lock cohorting) while that
/// waiter's place is queued in Redis ahead of another process's: the unused
/// place is given back as the waiter leaves, so the process's next release
/// goes to the other process at once, not to a place nobody waits on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_left_unused_by_a_local_pass_does_not_keep_the_next_release() {
    let prefix = unique("fair-passed");
    // (A cohort budget longer than the test's steps.)
    let patient = Kind::Redis
        .builder(&prefix)
        .fair(true)
        .cohort(8, Duration::from_secs(30));
    let (a, b) = (
        patient.clone().build().await.unwrap(),
        patient.build().await.unwrap(),
    );
    let hash = a.backend_key("k");
    let mut con = redis().connection().await;
    let first = a.lock("k").acquire().await.unwrap();
    let local = spawn_wait(&a);
    until_queued(&mut con, &hash, 1).await;
    let other = spawn_wait(&b);
    until_queued(&mut con, &hash, 2).await;
    first.release().await.unwrap();
    let passed = local.await.unwrap().1.unwrap();
    assert_eq!(a.stats().passed_locally, 1, "not passed locally");
    let released = Instant::now();
    passed.release().await.unwrap();
    let waited = got_after(other, released).await;
    taken_within(waited, Duration::from_millis(500), "after the release");
}
