//! Fencing tokens: every new holder's token is larger than every earlier
//! one of the key (across runtimes, restarts from older snapshots,
//! failovers to a lagging replica, and the fence window after which the
//! key's counter expires), nested holds see their outer token, and an
//! ended lock leaves nothing permanent behind (the counter lives for the
//! fence window, a fair queue as long as a place in it).
//!
//! The window is shortened to a second here
//! (`LockRuntimeBuilder::fence_window`) so that the waits are short.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{fence, with_lock, LockError, LockRuntime};
use lock_testkit::RedisServer;
use lock_tests::{
    names_left, on_every_backend, redis, runtime_at, timing_turn, unique, until_nothing_left,
    FaultProxy, Kind,
};
use redis::AsyncCommands;
use tokio::task::JoinSet;

on_every_backend!(
    fencing_tokens_increase_across_holders_and_match_in_nests,
    tokens_grow_across_the_window,
);

/// The shortened fence window of these tests.
const WINDOW: Duration = Duration::from_secs(1);
/// How long a fair-mode queue place lives without a refresh (the runtime's
/// `QUEUE_ENTRY_LIFE`): the queue keys expire at most this long after it.
const PLACE_LIFE: Duration = Duration::from_secs(3);
/// Distinct keys locked per test.
const KEYS: usize = 2000;
/// Keys in flight at once (each contended by two runtimes).
const IN_FLIGHT: usize = 50;

/// Every new holder's token is greater than the last one; nested holds see
/// the outer token.
async fn fencing_tokens_increase_across_holders_and_match_in_nests(kind: Kind) {
    let (first, second) = kind.two("fence").await;
    let mut last = 0;
    for round in 0..10 {
        let rt = if round % 2 == 0 { &first } else { &second };
        let (outer, inner) = with_lock(rt.lock("ledger"), async {
            let outer = fence().unwrap();
            let inner = with_lock(rt.lock("ledger"), async {
                Ok::<_, LockError>(fence().unwrap())
            })
            .await?;
            Ok::<_, LockError>((outer, inner))
        })
        .await
        .unwrap();
        assert_eq!(outer, inner, "nested hold saw another token");
        assert!(outer > last, "token {outer} not above previous {last}");
        last = outer;
    }
    // Tokens are per key: another key has its own sequence, also increasing.
    let g = first.lock("other").acquire().await.unwrap();
    assert!(g.fence() > 0);
}

async fn token_of(runtime: &LockRuntime, key: &str) -> u64 {
    let request = runtime.lock(key).wait(Duration::from_secs(5));
    let guard = request.acquire().await.unwrap();
    let token = guard.fence();
    guard.release().await.unwrap();
    token
}

/// Defect: the counter was only moved to the clock when it started over, so
/// a Redis restored from an older snapshot handed out tokens already used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_past_a_restart_from_an_older_snapshot() {
    let _turn = timing_turn().await;
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
    let _turn = timing_turn().await;
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

// ---------------------------------------------------------------------------
// The fence window: counters expire, tokens still grow
// ---------------------------------------------------------------------------

/// A runtime on the test server with the shortened fence window.
async fn windowed(prefix: &str, fair: bool) -> LockRuntime {
    LockRuntime::builder()
        .redis(redis().url())
        .key_prefix(prefix)
        .fair(fair)
        .fence_window(WINDOW)
        .build()
        .await
        .expect("build the lock runtime")
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

/// A hold that outlasts the window keeps its token (a re-entry through the
/// backend, or a claim, reads it from the lock hash) while the key's counter
/// expires on time; the next hold's token is still larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_longer_than_the_window_keeps_its_token_and_the_counter_expires() {
    let prefix = unique("retain-held");
    let runtime = windowed(&prefix, false).await;
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

/// A counter left without a TTL by an earlier version: tokens continue above
/// it (even when it is ahead of the clock), and it gets a TTL on first use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_counter_of_an_earlier_version_keeps_counting_and_expires() {
    a_counter_ahead_of_the_clock_keeps_counting(false).await;
}

/// The same in fair mode, whose uncontended acquire takes its own path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_counter_of_an_earlier_version_keeps_counting_and_expires_in_fair_mode() {
    a_counter_ahead_of_the_clock_keeps_counting(true).await;
}

async fn a_counter_ahead_of_the_clock_keeps_counting(fair: bool) {
    let prefix = unique(if fair {
        "retain-upgrade-fair"
    } else {
        "retain-upgrade"
    });
    let runtime = windowed(&prefix, fair).await;
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

/// Two runtimes (two processes) take each of `KEYS` distinct keys in turn
/// and release it; then every name left has a TTL within its bound, and
/// after the bound nothing is left.
async fn distinct_keys_leave_nothing_behind(fair: bool) {
    let prefix = unique(if fair { "retain-fair" } else { "retain" });
    let a = windowed(&prefix, fair).await;
    let b = windowed(&prefix, fair).await;
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
