#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A separate OS process that competes for locks, for the cross-process tests.
//!
//! ```text
//! Usage:
//!   contender <redis-url> <prefix> count <key> <counter-key> <n>
//!       n times: lock <key>, GET <counter-key>, SET it to value + 1, unlock;
//!       prints `done` at the end.
//!   contender <redis-url> <prefix> hold <key> <lease-ms>
//!       takes <key> with that lease, prints `held <fence>`, then `lost` if
//!       the hold is lost, and waits forever (the test kills it). The URL
//!       may be `etcd://host:port[,host:port…]` (the etcd backend), or
//!       `zookeeper://host:port[,host:port…]` (ZooKeeper; the prefix a path).
//!   contender <redis-url> <prefix> herd <key> <n-waiters> <wait-ms> <hold-ms>
//!       prints `ready` once n tasks are queued on <key>; each task acquires
//!       <key> once (waiting up to <wait-ms>), checks `INCR <prefix>occ:<key>`
//!       is 1 (else prints `overlap <n>`), holds <hold-ms> (0: one yield),
//!       DECRs, releases and prints `ok <fence>` (or `timeout`, `error <e>`).
//!       Then prints `done held=<n> waiting=<n> tracked=<n>` and waits for its
//!       stdin to close before exiting (so the test can inspect Redis first).
//!   With `LOCK_FAIR=1` in the environment (the builder's default reads it),
//!   every lock is taken in fair mode.
//!
//!   contender <redis-url> <prefix> soak <n-tasks> <n-keys> <secs>
//!       n tasks loop for <secs>, each time locking a random key `soak-<i>`
//!       (i < n-keys): `INCR <prefix>occ:soak-<i>` must be 1, then a
//!       non-atomic GET/yield/SET +1 of `<prefix>count:soak-<i>`, DECR the
//!       occupancy. Prints `key <i> <count>` per key, `violations <n>`, `done`.
//! ```

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{with_lock, LockError, LockRuntime};
use redis::AsyncCommands;

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    #[error(
        "usage: contender <url> <prefix> (count <key> <counter> <n> | hold <key> <lease-ms> \
         | herd <key> <n> <wait-ms> <hold-ms> | soak <tasks> <keys> <secs>)"
    )]
    Usage,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, prefix, mode, rest @ ..] = args.as_slice() else {
        return Err(Error::Usage);
    };
    // `etcd://host:port[,host:port…]`: the etcd backend; `zookeeper://` and
    // a connect string: ZooKeeper (hold mode).
    let builder = if let Some(endpoints) = url.strip_prefix("etcd://") {
        LockRuntime::builder().etcd(endpoints.split(','))
    } else if let Some(connect) = url.strip_prefix("zookeeper://") {
        LockRuntime::builder().zookeeper(connect)
    } else {
        LockRuntime::builder().redis(url.as_str())
    };
    let runtime = builder.key_prefix(prefix.as_str()).build().await?;
    match (mode.as_str(), rest) {
        ("count", [key, counter, n]) => {
            let n: u64 = n.parse().map_err(|_| Error::Usage)?;
            let client = redis::Client::open(url.as_str())?;
            let con = counter_connection(&client).await?;
            for _ in 0..n {
                let mut con = con.clone();
                with_lock(runtime.lock(key.as_str()), async {
                    let value: u64 = con
                        .get::<_, Option<u64>>(counter.as_str())
                        .await?
                        .unwrap_or(0);
                    tokio::task::yield_now().await;
                    let () = con.set(counter.as_str(), value + 1).await?;
                    Ok::<_, Error>(())
                })
                .await?;
            }
            // (Its last call returned before its release was answered:
            // shutdown sends it, as a process that exits must.)
            runtime.shutdown().await?;
            println!("done");
            Ok(())
        }
        ("hold", [key, lease_ms]) => {
            let lease: u64 = lease_ms.parse().map_err(|_| Error::Usage)?;
            let guard = runtime
                .lock(key.as_str())
                .lease(Duration::from_millis(lease))
                .acquire()
                .await?;
            println!("held {}", guard.fence());
            guard.lost().await;
            println!("lost");
            std::future::pending::<()>().await;
            Ok(())
        }
        ("herd", [key, n, wait_ms, hold_ms]) => {
            let n: usize = n.parse().map_err(|_| Error::Usage)?;
            let wait: u64 = wait_ms.parse().map_err(|_| Error::Usage)?;
            let hold: u64 = hold_ms.parse().map_err(|_| Error::Usage)?;
            herd(&runtime, url, prefix, key, n, wait, hold).await
        }
        ("soak", [tasks, keys, secs]) => {
            let tasks: usize = tasks.parse().map_err(|_| Error::Usage)?;
            let keys: usize = keys.parse().map_err(|_| Error::Usage)?;
            let secs: u64 = secs.parse().map_err(|_| Error::Usage)?;
            soak(&runtime, url, prefix, tasks, keys, secs).await
        }
        _ => Err(Error::Usage),
    }
}

/// `herd` mode: n waiters on one key, one acquisition each.
async fn herd(
    runtime: &LockRuntime,
    url: &str,
    prefix: &str,
    key: &str,
    n: usize,
    wait_ms: u64,
    hold_ms: u64,
) -> Result<(), Error> {
    let client = redis::Client::open(url)?;
    let con = counter_connection(&client).await?;
    let occ_key = format!("{prefix}occ:{key}");
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let runtime = runtime.clone();
        let key = key.to_owned();
        let occ_key = occ_key.clone();
        let mut con = con.clone();
        let started = started.clone();
        tasks.push(tokio::spawn(async move {
            let request = runtime
                .lock(key)
                .wait(Duration::from_millis(wait_ms))
                .acquire();
            started.fetch_add(1, Ordering::SeqCst);
            let line = match request.await {
                Ok(guard) => {
                    let inside: i64 = con.incr(&occ_key, 1).await?;
                    if inside != 1 {
                        println!("overlap {inside}");
                    }
                    if hold_ms == 0 {
                        tokio::task::yield_now().await;
                    } else {
                        tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                    }
                    let _: i64 = con.decr(&occ_key, 1).await?;
                    let fence = guard.fence();
                    guard.release().await?;
                    format!("ok {fence}")
                }
                Err(LockError::Timeout { .. }) => "timeout".to_owned(),
                Err(e) => format!("error {e}"),
            };
            println!("{line}");
            Ok::<_, Error>(())
        }));
    }
    // Ready: every task asked, and the key has local waiters (subscribed).
    let asked = Instant::now();
    while asked.elapsed() < Duration::from_secs(30)
        && (started.load(Ordering::SeqCst) < n || runtime.stats().waiting_keys == 0)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("ready");
    for task in tasks {
        if let Err(e) = task
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            println!("error {e}");
        }
    }
    // Background bookkeeping settles (bounded), then report it.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(2) {
        let stats = runtime.stats();
        if stats.held == 0 && stats.waiting_keys == 0 && stats.watchdog.tracked == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = runtime.stats();
    println!(
        "done held={} waiting={} tracked={}",
        stats.held, stats.waiting_keys, stats.watchdog.tracked
    );
    // Stay connected until the test has looked at Redis (stdin closes).
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    })
    .await;
    Ok(())
}

/// `soak` mode: many tasks, many keys, a non-atomic counter per key.
async fn soak(
    runtime: &LockRuntime,
    url: &str,
    prefix: &str,
    tasks: usize,
    keys: usize,
    secs: u64,
) -> Result<(), Error> {
    let client = redis::Client::open(url)?;
    let con = counter_connection(&client).await?;
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..keys).map(|_| AtomicU64::new(0)).collect());
    let violations = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(secs);
    let seed = u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let runtime = runtime.clone();
        let con = con.clone();
        let counts = counts.clone();
        let violations = violations.clone();
        let prefix = prefix.to_owned();
        let mut rng = (seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
        handles.push(tokio::spawn(async move {
            while Instant::now() < end {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let i = (rng % keys as u64) as usize;
                let key = format!("soak-{i}");
                let occ_key = format!("{prefix}occ:{key}");
                let counter_key = format!("{prefix}count:{key}");
                let mut con = con.clone();
                let violations = &violations;
                let locked = with_lock(
                    runtime.lock(key.as_str()).wait(Duration::from_secs(30)),
                    async {
                        let inside: i64 = con.incr(&occ_key, 1).await?;
                        if inside != 1 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        let value: u64 =
                            con.get::<_, Option<u64>>(&counter_key).await?.unwrap_or(0);
                        tokio::task::yield_now().await;
                        let () = con.set(&counter_key, value + 1).await?;
                        let _: i64 = con.decr(&occ_key, 1).await?;
                        Ok::<_, Error>(())
                    },
                )
                .await;
                if let Err(Error::Lock(LockError::Timeout { .. })) = &locked {
                    // A wait this long in a 5 s run is a defect: say who
                    // held the key and what this process was doing then.
                    eprintln!("{}", stuck(&runtime, &mut con.clone(), &key).await);
                }
                locked?;
                counts[i].fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, Error>(())
        }));
    }
    for handle in handles {
        match handle.await {
            Ok(result) => result?,
            Err(e) => panic!("soak task failed: {e}"),
        }
    }
    for (i, count) in counts.iter().enumerate() {
        println!("key {i} {}", count.load(Ordering::SeqCst));
    }
    println!("violations {}", violations.load(Ordering::SeqCst));
    // A locked call returns before its release is answered: a process that
    // exits without `shutdown` leaves its last key taken until the lease
    // ends (30 s), and another contender's wait for it ran out.
    runtime.shutdown().await?;
    println!("done");
    Ok(())
}

/// What a soak task that waited its whole wait found: the key as
/// `inspect` reads it, the lock's names in Redis, and this runtime's
/// counters.
async fn stuck(
    runtime: &LockRuntime,
    con: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> String {
    let hash = runtime.backend_key(key);
    let info = runtime.inspect(key).await;
    let held: Vec<(String, String)> = con.hgetall(&hash).await.unwrap_or_default();
    let ttl: i64 = con.pttl(&hash).await.unwrap_or(-3);
    let queue: Vec<String> = con
        .lrange(format!("{hash}:queue"), 0, -1)
        .await
        .unwrap_or_default();
    let queued: Vec<(String, String)> = con
        .hgetall(format!("{hash}:queued"))
        .await
        .unwrap_or_default();
    format!(
        "stuck on {key}: inspect {info:?}; {hash} = {held:?} (pttl {ttl}); queue {queue:?}; \
         queued {queued:?}; stats {:?}",
        runtime.stats()
    )
}

/// The connection a contender keeps its counters on. Its commands are the
/// test's own bookkeeping, not the lock's: a loaded machine (two cores,
/// four contenders, a server) may keep one waiting past the client's
/// default response timeout, which would end the contender with a Redis
/// error that says nothing about the lock; it waits 10 s.
async fn counter_connection(
    client: &redis::Client,
) -> Result<redis::aio::MultiplexedConnection, Error> {
    let mut con = client.get_multiplexed_async_connection().await?;
    con.set_response_timeout(Duration::from_secs(10));
    Ok(con)
}
