//! S5: 64 tasks over 10,000 keys — throughput against the raw scripts.
//!
//! Our side: 64 tasks, each taking a pseudo-random key of 10,000 with
//! `with_lock` and an empty body, for a fixed time. The baseline sends the
//! very same acquire and release scripts (`include_str!` of the runtime's
//! `.lua` files) by `EVALSHA` from a plain redis-rs multiplexed connection at
//! the same concurrency: what the scripts cost with no library around them.
//! The figure is lock operations (acquire + release pairs) per second.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use lock_runtime::{with_lock, LockRuntime};
use redis::aio::MultiplexedConnection;
use redis::Script;
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Ctx, Output};
use crate::keys::Rng;
use crate::report::{Row, Target};
use crate::stats::median_of;

/// Concurrent tasks.
pub const TASKS: u64 = 64;
/// Distinct keys.
pub const KEYS: u64 = 10_000;
/// Upper bound on operations per task, whatever the duration.
pub(super) const MAX_PER_TASK: u64 = 10_000_000;
/// The runtime's acquire script, as it loads it: behind Redlock's boot check
/// (a no-op without a marker key).
const ACQUIRE: &str = concat!(
    include_str!("../../../lock-runtime/src/scripts/redlock_boot_check.lua"),
    include_str!("../../../lock-runtime/src/scripts/acquire.lua"),
);
/// The fence counter's TTL, ms (the runtime's default).
const WINDOW_MS: u128 = lock_runtime::DEFAULT_FENCE_WINDOW.as_millis();
/// The runtime's release script.
const RELEASE: &str = include_str!("../../../lock-runtime/src/scripts/release.lua");

/// Operations per second of one run: (ours, raw).
struct Run {
    ours: f64,
    raw: f64,
    raw_busy: u64,
}

/// Our side: operations per second.
async fn ours(ctx: &Ctx, run: usize) -> Result<f64> {
    let duration = ctx.scale().s5_duration;
    lock_ops_per_second(&ctx.runtime, &format!("s5:{run}"), duration).await
}

/// S5's load on `runtime` (here and on ZooKeeper, S13): [`TASKS`] tasks,
/// each taking a pseudo-random key of the [`KEYS`] named `<name>:<k>` with
/// `with_lock` and an empty body, for `duration`. Operations per second.
pub(super) async fn lock_ops_per_second(
    runtime: &LockRuntime,
    name: &str,
    duration: Duration,
) -> Result<f64> {
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|k| format!("{name}:{k}")).collect());
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let (runtime, keys) = (runtime.clone(), keys.clone());
        tasks.spawn(async move {
            let mut rng = Rng::new(t + 1);
            let mut ops = 0u64;
            while ops < MAX_PER_TASK && Instant::now() < end {
                let key = &keys[(rng.next_u64() % KEYS) as usize];
                with_lock(runtime.lock(key.as_str()), async { anyhow::Ok(()) }).await?;
                ops += 1;
            }
            anyhow::Ok((ops, 0))
        });
    }
    Ok(per_second(tasks, start).await?.0)
}

/// The tasks' operations per second since `start`, and the attempts they
/// found busy, once all have ended.
pub(super) async fn per_second(
    mut tasks: JoinSet<Result<(u64, u64)>>,
    start: Instant,
) -> Result<(f64, u64)> {
    let (mut total, mut busy) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let (ops, b) = done??;
        total += ops;
        busy += b;
    }
    Ok((total as f64 / start.elapsed().as_secs_f64(), busy))
}

/// The baseline: the same scripts by EVALSHA on a plain connection.
/// Returns (operations per second, acquires that found the key busy).
async fn raw(ctx: &Ctx, run: usize) -> Result<(f64, u64)> {
    let duration = ctx.scale().s5_duration;
    let acquire = Script::new(ACQUIRE).get_hash().to_owned();
    let release = Script::new(RELEASE).get_hash().to_owned();
    let mut con = ctx.plain.clone();
    for source in [ACQUIRE, RELEASE] {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(source)
            .query_async(&mut con)
            .await?;
    }
    let names: Arc<Vec<[String; 3]>> = Arc::new(
        (0..KEYS)
            .map(|k| {
                let hash = format!("raw:{{s5:{run}:{k}}}");
                [format!("{hash}:fence"), format!("{hash}:released"), hash]
            })
            .collect(),
    );
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let (mut con, names) = (con.clone(), names.clone());
        let (acquire, release) = (acquire.clone(), release.clone());
        tasks.spawn(async move {
            let mut rng = Rng::new(TASKS + t + 1);
            let (mut ops, mut busy) = (0u64, 0u64);
            let mut n = 0u64;
            while ops < MAX_PER_TASK && Instant::now() < end {
                let [fence, channel, hash] = &names[(rng.next_u64() % KEYS) as usize];
                n += 1;
                let holder = format!("raw-{}:{t}:{n}", std::process::id());
                let scripts = [acquire.as_str(), release.as_str()];
                let keys = [hash.as_str(), fence.as_str(), channel.as_str()];
                if raw_pair(&mut con, scripts, keys, &holder).await? {
                    ops += 1;
                } else {
                    busy += 1;
                }
            }
            anyhow::Ok((ops, busy))
        });
    }
    per_second(tasks, start).await
}

/// One acquire + release by EVALSHA; `false` when the key was busy.
async fn raw_pair(
    con: &mut MultiplexedConnection,
    [acquire, release]: [&str; 2],
    [hash, fence, channel]: [&str; 3],
    holder: &str,
) -> Result<bool> {
    // {1, fence, upto} held, {0, pttl} busy; no tokens reserved for local
    // holders (ARGV[4] = 0): the baseline has no cohort to pass to.
    let reply: Vec<i64> = redis::cmd("EVALSHA")
        .arg(acquire)
        .arg(2)
        .arg(hash)
        .arg(fence)
        .arg(holder)
        .arg(30_000)
        .arg(WINDOW_MS)
        .arg(0)
        .query_async(con)
        .await?;
    if reply.first() != Some(&1) {
        return Ok(false);
    }
    let _: i64 = redis::cmd("EVALSHA")
        .arg(release)
        .arg(1)
        .arg(hash)
        .arg(holder)
        .arg(channel)
        .query_async(con)
        .await?;
    Ok(true)
}

/// Runs S5.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let mut runs = Vec::new();
    for run in 0..ctx.runs() {
        let ours = ours(ctx, run).await?;
        let (raw, raw_busy) = raw(ctx, run).await?;
        runs.push(Run {
            ours,
            raw,
            raw_busy,
        });
    }
    let rows = vec![Row::new(
        "S5",
        "lock ops/s, 64 tasks x 10k keys",
        median_of(&runs, |r| r.ours),
    )
    .vs("raw EVALSHA, plain conn", median_of(&runs, |r| r.raw))
    .target(Target::RatioAtLeast(0.6))];
    let detail = json!({
        "tasks": TASKS, "keys": KEYS,
        "seconds_per_side": ctx.scale().s5_duration.as_secs_f64(),
        "runs": runs.iter().map(|r| json!({
            "ours_ops_per_s": r.ours, "raw_ops_per_s": r.raw, "raw_busy": r.raw_busy,
        })).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows,
        detail,
        ..Output::default()
    })
}
