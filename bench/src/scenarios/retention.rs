//! S10: what locking many distinct keys leaves in Redis.
//!
//! The flagship use is a lock per order id: every key is locked once and
//! never again. Each run locks and releases `s10_keys` distinct keys (64
//! tasks) on a private server of its own, so that nothing else allocates or
//! expires there, and reads the server three times: before, right after the
//! last release (within the fence window), and once every key has expired.
//! It reports the keys left, the keys without a TTL, and `used_memory` growth
//! per locked key at the last two points. The fence window is shortened to
//! `s10_window` so that "after the window" comes in seconds; within it the
//! figures do not depend on its length. Plain and fair mode run alike.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use lock_runtime::{with_lock, LockRuntime};
use lock_testkit::{CommandStats, RedisServer};
use redis::aio::MultiplexedConnection;
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Ctx, Output};
use crate::report::{Row, Target};
use crate::stats::median_of;

/// Concurrent tasks locking keys.
const TASKS: u64 = 64;
/// Most bytes per locked key allowed to stay once the window has passed.
const RETAINED_BYTES_TARGET: f64 = 10.0;

/// What the server holds at one point.
#[derive(Clone, Copy, Debug, Default)]
struct Snapshot {
    keys: u64,
    without_ttl: u64,
    used_memory: i64,
}

/// Figures of one run of one mode.
struct Run {
    within: Snapshot,
    after: Snapshot,
    before: Snapshot,
    keys: u64,
    /// Server time of the lock scripts per lock+unlock, µs.
    server_us: f64,
    /// How long locking all the keys took (keys locked earlier than the
    /// window before the end have expired by the first reading).
    locking: Duration,
    /// How long the keys took to expire after the last release.
    expired_after: Duration,
}

impl Run {
    fn per_key(&self, at: Snapshot) -> f64 {
        (at.used_memory - self.before.used_memory) as f64 / self.keys as f64
    }
}

async fn used_memory(con: &mut MultiplexedConnection) -> Result<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(con).await?;
    match info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
    {
        Some(bytes) => Ok(bytes),
        None => bail!("INFO memory has no used_memory"),
    }
}

/// Keys, keys without a TTL (one SCAN pass, PTTLs pipelined) and memory.
async fn snapshot(con: &mut MultiplexedConnection) -> Result<Snapshot> {
    let mut without_ttl = 0;
    let mut cursor = 0u64;
    // Bounded: one step per 1,000 keys, and the keys are far fewer.
    for _ in 0..1_000_000 {
        let (next, names): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await?;
        if !names.is_empty() {
            let mut pipe = redis::pipe();
            for name in &names {
                pipe.pttl(name);
            }
            let ttls: Vec<i64> = pipe.query_async(con).await?;
            without_ttl += ttls.iter().filter(|&&t| t == -1).count() as u64;
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let keys: u64 = redis::cmd("DBSIZE").query_async(con).await?;
    Ok(Snapshot {
        keys,
        without_ttl,
        used_memory: used_memory(con).await?,
    })
}

/// Locks and releases `n` distinct keys from `TASKS` tasks.
async fn lock_distinct_keys(runtime: &LockRuntime, n: u64) -> Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..TASKS {
        let (runtime, next) = (runtime.clone(), next.clone());
        tasks.spawn(async move {
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= n {
                    return anyhow::Ok(());
                }
                let key = format!("order:{k}");
                with_lock(runtime.lock(key.as_str()), async { anyhow::Ok(()) }).await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// One run in one mode, on a server of its own.
async fn measure(ctx: &Ctx, fair: bool) -> Result<Run> {
    let scale = ctx.scale();
    let server = RedisServer::try_start()?;
    let mut con = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let runtime = LockRuntime::builder()
        .redis(server.url())
        .key_prefix(super::PREFIX)
        .fair(fair)
        .fence_window(scale.s10_window)
        .build()
        .await?;
    // One lock first, so that the connection and the server's structures
    // are warm; then an empty keyspace (the scripts stay cached).
    with_lock(runtime.lock("warm-up"), async { anyhow::Ok(()) }).await?;
    let () = redis::cmd("FLUSHALL").query_async(&mut con).await?;
    let before = snapshot(&mut con).await?;
    let stats_before = CommandStats::read(&mut con).await?;
    let started = Instant::now();
    lock_distinct_keys(&runtime, scale.s10_keys).await?;
    let released_at = Instant::now();
    let stats = CommandStats::read(&mut con).await?.since(&stats_before);
    let within = snapshot(&mut con).await?;
    let deadline = released_at + scale.s10_window + Duration::from_secs(30);
    let mut after = snapshot(&mut con).await?;
    while after.keys > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = snapshot(&mut con).await?;
    }
    let script_us = stats.usec("evalsha") + stats.usec("eval");
    Ok(Run {
        within,
        after,
        before,
        keys: scale.s10_keys,
        server_us: script_us as f64 / scale.s10_keys as f64,
        locking: released_at - started,
        expired_after: released_at.elapsed(),
    })
}

/// The rows of one mode.
fn rows(scenario: &'static str, runs: &[Run], n: u64) -> Vec<Row> {
    vec![
        Row::new(
            scenario,
            format!("keys left within the window ({n} keys)"),
            median_of(runs, |r| r.within.keys as f64),
        ),
        Row::new(
            scenario,
            "keys without a TTL, worst run",
            runs.iter()
                .map(|r| r.within.without_ttl.max(r.after.without_ttl) as f64)
                .fold(0.0, f64::max),
        )
        .target(Target::Exactly(0.0)),
        Row::new(
            scenario,
            "used_memory growth per key, within the window (B)",
            median_of(runs, |r| r.per_key(r.within)),
        ),
        Row::new(
            scenario,
            "keys left after the window, worst run",
            runs.iter().map(|r| r.after.keys as f64).fold(0.0, f64::max),
        )
        .target(Target::Exactly(0.0)),
        Row::new(
            scenario,
            "used_memory growth per key, after the window (B)",
            median_of(runs, |r| r.per_key(r.after)),
        )
        .target(Target::AtMost(RETAINED_BYTES_TARGET)),
        Row::new(
            scenario,
            "Redis server time per lock+unlock, distinct keys (us)",
            median_of(runs, |r| r.server_us),
        ),
    ]
}

/// Runs S10.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let n = ctx.scale().s10_keys;
    let (mut plain, mut fair) = (Vec::new(), Vec::new());
    for _ in 0..ctx.runs() {
        plain.push(measure(ctx, false).await?);
        fair.push(measure(ctx, true).await?);
    }
    let mut all = rows("S10", &plain, n);
    all.extend(rows("S10 fair", &fair, n));
    let runs_json = |runs: &[Run]| {
        runs.iter()
            .map(|r| {
                json!({
                    "keys_before": r.before.keys, "used_memory_before": r.before.used_memory,
                    "keys_within": r.within.keys, "without_ttl_within": r.within.without_ttl,
                    "used_memory_within": r.within.used_memory,
                    "keys_after": r.after.keys, "without_ttl_after": r.after.without_ttl,
                    "used_memory_after": r.after.used_memory,
                    "locking_s": r.locking.as_secs_f64(),
                    "expired_after_s": r.expired_after.as_secs_f64(),
                    "server_us_per_lock_unlock": r.server_us,
                })
            })
            .collect::<Vec<_>>()
    };
    let detail = json!({
        "keys": n, "tasks": TASKS,
        "fence_window_s": ctx.scale().s10_window.as_secs_f64(),
        "plain": runs_json(&plain), "fair": runs_json(&fair),
    });
    Ok(Output {
        rows: all,
        detail,
        ..Output::default()
    })
}
