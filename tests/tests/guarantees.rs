#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The README's guarantees under the faults that once broke them: a renewal
//! stuck on a stalled socket, a restart from an older snapshot, a replica
//! promoted before it saw the last tokens, a waiter queued behind others
//! when the lock ends by expiry, a SUBSCRIBE lost with its connection, a try
//! on a stalled network, and duration inputs at their extremes.
//!
//! Each case drives a real `redis-server` (some through a [`FaultProxy`])
//! and takes its turn: several measure timing, and the machine has few cores.

use std::time::Duration;

use lock_runtime::{LockError, LockRuntime};
use lock_testkit::RedisServer;
use lock_tests::{on_every_backend, redis, unique, FaultProxy, Kind};
use tokio::time::Instant;

/// One timing case at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Scheduling slack allowed on top of every computed bound.
const SLACK: Duration = Duration::from_millis(150);

async fn runtime_at(url: &str, prefix: &str) -> LockRuntime {
    LockRuntime::builder()
        .redis(url)
        .key_prefix(prefix)
        .build()
        .await
        .expect("build the lock runtime")
}

/// Defect: a renewal stuck on a stalled connection delayed the lost check of
/// every other hold until it timed out, so a fixed-lease lock ran out, was
/// taken by another runtime, and its old holder still believed it held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hold_is_told_lost_by_its_own_lease_end_while_a_renewal_hangs() {
    let _turn = SERIAL.lock().await;
    let prefix = unique("stuck-renewal");
    let proxy = FaultProxy::start(redis().port()).await;
    let stalled = runtime_at(&proxy.url(), &prefix).await;
    let other = runtime_at(&redis().url(), &prefix).await;

    let begun = Instant::now();
    let renewed = stalled
        .lock("a")
        .lease(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let fixed = stalled
        .lock("b")
        .lease(Duration::from_millis(1500))
        .watchdog(false)
        .acquire()
        .await
        .unwrap();
    // The renewal of "a" falls due at 1 s and hangs on the stalled socket.
    tokio::time::sleep_until(begun + Duration::from_millis(900)).await;
    proxy.stall();

    let taken = other
        .lock("b")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let taken_at = begun.elapsed();
    assert!(
        fixed.is_lost(),
        "another runtime took \"b\" at {taken_at:?} while its old holder was not told"
    );
    tokio::time::timeout(Duration::from_secs(1), fixed.lost())
        .await
        .unwrap();
    let lost_b = begun.elapsed();
    tokio::time::timeout(Duration::from_secs(5), renewed.lost())
        .await
        .expect("the renewed hold was never declared lost");
    let lost_a = begun.elapsed();
    eprintln!("fixed lease lost at {lost_b:?}, taken over at {taken_at:?}; renewed lease lost at {lost_a:?}");
    // Each by its own lease end, counted from before its acquire was sent.
    assert!(lost_b <= Duration::from_millis(1500) + SLACK, "{lost_b:?}");
    assert!(lost_a <= Duration::from_millis(3000) + SLACK, "{lost_a:?}");
    proxy.resume();
    drop(taken);
}

async fn token_of(runtime: &LockRuntime, key: &str) -> u64 {
    let guard = runtime
        .lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let token = guard.fence();
    guard.release().await.unwrap();
    token
}

/// Defect: the counter was only moved to the clock when it started over, so
/// a Redis restored from an older snapshot handed out tokens already used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_past_a_restart_from_an_older_snapshot() {
    let _turn = SERIAL.lock().await;
    let mut server = RedisServer::start_with_snapshots();
    let prefix = unique("snap");
    let before = {
        let runtime = runtime_at(&server.url(), &prefix).await;
        let first = token_of(&runtime, "k").await;
        server.snapshot().await;
        let mut last = first;
        for _ in 0..3 {
            last = token_of(&runtime, "k").await;
        }
        assert!(last > first);
        last
    };
    server.restart_from_snapshot().await;
    let runtime = runtime_at(&server.url(), &prefix).await;
    let after = token_of(&runtime, "k").await;
    eprintln!("snapshot restore: last token before {before}, first after {after}");
    assert!(after > before, "token went back: {after} <= {before}");
}

/// Defect: a replica promoted while replication was paused holds an older
/// counter, and handed out tokens lower than and equal to ones in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_past_a_failover_to_a_lagging_replica() {
    let _turn = SERIAL.lock().await;
    let primary = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    // The replica follows the primary through a proxy, so replication can be
    // paused for real (a frozen replica would still buffer the stream).
    let link = FaultProxy::start(primary.port()).await;
    let link_port = link.port().to_string();
    // (A replica stores the primary's snapshot in its directory.)
    let dir = std::env::temp_dir().to_string_lossy().into_owned();
    let dbfile = format!("{}.rdb", unique("replica"));
    let replica = RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &link_port,
        "--dir",
        &dir,
        "--dbfilename",
        &dbfile,
    ]);
    let prefix = unique("failover");
    let runtime = runtime_at(&primary.url(), &prefix).await;
    let first = token_of(&runtime, "k").await;
    // Wait (bounded) until the replica has the counter.
    let fence_key = format!("{}:fence", runtime.backend_key("k"));
    let mut rcon = replica
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut synced = None;
    for _ in 0..500 {
        let seen: Option<u64> = redis::cmd("GET")
            .arg(&fence_key)
            .query_async(&mut rcon)
            .await
            .unwrap();
        // (The counter ends the block of tokens reserved with the first:
        // lock cohorting.)
        if seen.is_some_and(|seen| seen >= first) {
            synced = seen;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let synced = synced.expect("the replica never saw the first token");
    // Replication pauses; the primary goes on handing out tokens.
    link.stall();
    let mut last = first;
    for _ in 0..3 {
        last = token_of(&runtime, "k").await;
    }
    drop(runtime);
    drop(primary); // the primary dies before the replica caught up
    drop(link);
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut rcon)
        .await
        .unwrap();
    let stale: Option<u64> = redis::cmd("GET")
        .arg(&fence_key)
        .query_async(&mut rcon)
        .await
        .unwrap();
    assert_eq!(stale, Some(synced), "the replica was not behind");
    let promoted = runtime_at(&replica.url(), &prefix).await;
    let after = token_of(&promoted, "k").await;
    eprintln!(
        "failover: last token on the old primary {last}, first on the promoted replica {after}"
    );
    assert!(after > last, "token went back: {after} <= {last}");
    drop(replica);
    let _ = std::fs::remove_file(std::env::temp_dir().join(dbfile));
}

/// Defect: a waiter that queued behind other waiters of its process slept
/// on its own lease or deadline; when the key's holder (a local waiter that
/// had taken it) let it end by expiry, nobody was woken, and the waiters
/// timed out with the key free.
async fn a_queued_waiter_tries_when_the_holder_lease_ends(kind: Kind) {
    let _turn = SERIAL.lock().await;
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
    wait_until(|| runtime.stats().waiting_keys == 1).await;
    // Two more queue behind it.
    let second = spawn_waiter(Duration::from_secs(30), false);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let third = spawn_waiter(Duration::from_secs(30), false);
    tokio::time::sleep(Duration::from_millis(50)).await;
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
    assert!(waited <= Duration::from_millis(600) + SLACK, "{waited:?}");
    assert!(head_guard.is_lost());
    drop(second_guard);
    let (third_guard, _) = third.await.unwrap();
    drop(third_guard.expect("the third waiter"));
}

on_every_backend!(a_queued_waiter_tries_when_the_holder_lease_ends);

async fn wait_until(mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met within 5 s");
}

/// A bounded wait whose deadline passes while it sleeps tries once more:
/// here the lock vanished without a release message (deleted by hand), and
/// the holder's lease was far away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_makes_a_last_try_at_its_deadline() {
    let _turn = SERIAL.lock().await;
    let prefix = unique("last-try");
    let holder = runtime_at(&redis().url(), &prefix).await;
    let waiter = runtime_at(&redis().url(), &prefix).await;
    let held = holder.lock("k").acquire().await.unwrap();
    let begun = Instant::now();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .lock("k")
                .wait(Duration::from_millis(600))
                .acquire()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut con = redis().connection().await;
    let _: () = redis::cmd("DEL")
        .arg(holder.backend_key("k"))
        .query_async(&mut con)
        .await
        .unwrap();
    let got = waiting.await.unwrap();
    let took = begun.elapsed();
    assert!(got.is_ok(), "{got:?}: no last try before the timeout");
    assert!(
        took >= Duration::from_millis(600),
        "{took:?}: woken before its deadline"
    );
    assert!(took <= Duration::from_millis(600) + SLACK, "{took:?}");
    drop(held);
}

/// Defect: a SUBSCRIBE lost to a dropped connection was never sent again;
/// waiters then learned of releases only from the holder's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_subscribe_is_retried_and_waiters_are_woken_promptly() {
    let _turn = SERIAL.lock().await;
    let prefix = unique("lost-subscribe");
    let proxy = FaultProxy::start(redis().port()).await;
    let holder = runtime_at(&redis().url(), &prefix).await;
    let waiter = runtime_at(&proxy.url(), &prefix).await;
    let held = holder.lock("k").acquire().await.unwrap();
    proxy.drop_at_command("SUBSCRIBE");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let guard = waiter
                .lock("k")
                .wait(Duration::from_secs(20))
                .acquire()
                .await;
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

/// A try-once takes at most the try timeout (250 ms by default), however
/// the network behaves; no answer in time is a backend error, not "busy".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_once_answers_within_the_try_timeout_when_the_network_stalls() {
    let _turn = SERIAL.lock().await;
    let prefix = unique("try-once");
    let proxy = FaultProxy::start(redis().port()).await;
    let runtime = runtime_at(&proxy.url(), &prefix).await;
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
    let short = runtime
        .lock("k")
        .wait(Duration::from_millis(50))
        .acquire()
        .await;
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

/// Every duration setter takes 0, 1 ns, `MAX` and values around its
/// documented limits without a panic: the result is a runtime, a hold, or
/// `InvalidConfig`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_duration_input_panics() {
    let nanos = Duration::from_nanos;
    let extremes = [
        Duration::ZERO,
        nanos(1),
        Duration::from_millis(1) - nanos(1),
        Duration::from_millis(1),
        lock_runtime::MIN_LEASE - nanos(1),
        lock_runtime::MIN_LEASE,
        lock_runtime::MAX_LEASE,
        lock_runtime::MAX_LEASE + nanos(1),
        Duration::from_secs(3600),
        Duration::from_secs(3600) + nanos(1),
        Duration::MAX - nanos(1),
        Duration::MAX,
    ];
    let url = redis().url();
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for d in extremes {
        let builders = [
            (
                "connect_timeout",
                LockRuntime::builder().redis(&url).connect_timeout(d),
            ),
            (
                "response_timeout",
                LockRuntime::builder().redis(&url).response_timeout(d),
            ),
            (
                "try_timeout",
                LockRuntime::builder().redis(&url).try_timeout(d),
            ),
            (
                "default_lease",
                LockRuntime::builder().memory().default_lease(d),
            ),
            (
                "default_wait",
                LockRuntime::builder().memory().default_wait(Some(d)),
            ),
        ];
        for (setter, builder) in builders {
            let outcome = match builder.build().await {
                Ok(runtime) => {
                    // A runtime that started must still answer: with a lock,
                    // or (timeouts of a millisecond) with an error.
                    let guard = runtime
                        .lock(unique("k"))
                        .wait(Duration::from_millis(500))
                        .acquire()
                        .await;
                    if d >= Duration::from_millis(100) || !setter.ends_with("timeout") {
                        assert!(guard.is_ok(), "{setter}({d:?}): {guard:?}");
                    }
                    "ok"
                }
                Err(LockError::InvalidConfig(message)) => {
                    assert!(message.contains(setter), "{setter}({d:?}): {message}");
                    "invalid"
                }
                // A timeout of a few milliseconds may run out while the
                // runtime connects or loads its scripts (a busy machine):
                // an error, not a panic.
                Err(LockError::Backend(_))
                    if d < Duration::from_millis(100) && setter.ends_with("timeout") =>
                {
                    "backend error"
                }
                Err(other) => panic!("{setter}({d:?}): {other:?}"),
            };
            *outcomes.entry(format!("{setter} {outcome}")).or_default() += 1;
        }
        let runtime = LockRuntime::builder().memory().build().await.unwrap();
        for (what, request) in [
            ("lease", runtime.lock("r").lease(d)),
            ("wait", runtime.lock("r").wait(d)),
        ] {
            match request.acquire().await {
                Ok(guard) => guard.release().await.unwrap(),
                Err(LockError::InvalidConfig(message)) => {
                    assert!(message.contains(what), "{what}({d:?}): {message}")
                }
                Err(other) => panic!("{what}({d:?}): {other:?}"),
            }
        }
    }
    eprintln!("duration extremes: {outcomes:?}");
}
