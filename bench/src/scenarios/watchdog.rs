//! S6: the watchdog with 10,000 held locks.
//!
//! Takes N locks with a short lease, holds them for three leases, and
//! reads: renewal round trips per watchdog tick (the runtime's counters),
//! the process's CPU time over the holding period minus its idle rate
//! measured just before (so only what holding the locks costs remains), and
//! whether every lock survived — no guard lost, every hash still in Redis.

use std::time::Duration;

use anyhow::{Context, Result};
use lock_runtime::LockGuard;
use lock_testkit::usage::cpu_seconds;
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Ctx, Output};
use crate::report::{Row, Target};
use crate::stats::median_of;

/// Tasks taking (and giving back) the locks.
const TASKS: usize = 64;
/// Leases the locks are held for.
const LEASES: u32 = 3;

/// Figures of one run.
struct Run {
    round_trips_per_tick: f64,
    renewal_cpu_percent: f64,
    idle_cpu_percent: f64,
    lost: u64,
    lost_guards: usize,
    missing_in_redis: usize,
    ticks: u64,
    round_trips: u64,
    acquire_seconds: f64,
}

/// Process CPU as a share of one core over `period`, and the elapsed time.
async fn cpu_over(period: Duration) -> Result<(f64, f64)> {
    let cpu = cpu_seconds()?;
    let start = Instant::now();
    tokio::time::sleep(period).await;
    let elapsed = start.elapsed().as_secs_f64();
    Ok(((cpu_seconds()? - cpu) / elapsed, elapsed))
}

/// Takes `n` locks `s6:<run>:<i>` with `lease`, 64 at a time.
async fn acquire_all(ctx: &Ctx, run: usize, n: usize, lease: Duration) -> Result<Vec<LockGuard>> {
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let runtime = ctx.runtime.clone();
        tasks.spawn(async move {
            let mut guards = Vec::new();
            for i in (t..n).step_by(TASKS) {
                let request = runtime.lock(format!("s6:{run}:{i}")).lease(lease);
                guards.push(request.acquire().await?);
            }
            anyhow::Ok(guards)
        });
    }
    let mut all = Vec::with_capacity(n);
    while let Some(guards) = tasks.join_next().await {
        all.extend(guards??);
    }
    Ok(all)
}

/// Releases every guard, 64 at a time; returns how many releases failed.
async fn release_all(guards: Vec<LockGuard>) -> Result<usize> {
    let mut tasks = JoinSet::new();
    let mut chunks: Vec<Vec<LockGuard>> = (0..TASKS).map(|_| Vec::new()).collect();
    for (i, g) in guards.into_iter().enumerate() {
        chunks[i % TASKS].push(g);
    }
    for chunk in chunks {
        tasks.spawn(async move {
            let mut failed = 0;
            for g in chunk {
                failed += usize::from(g.release().await.is_err());
            }
            failed
        });
    }
    let mut failed = 0;
    while let Some(f) = tasks.join_next().await {
        failed += f?;
    }
    Ok(failed)
}

/// How many of the run's lock hashes are missing from Redis.
async fn missing_in_redis(ctx: &Ctx, run: usize, n: usize) -> Result<usize> {
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("EXISTS")
            .arg(ctx.runtime.backend_key(&format!("s6:{run}:{i}")));
    }
    let exists: Vec<i64> = pipe
        .query_async(&mut ctx.plain.clone())
        .await
        .context("check the held locks in Redis")?;
    Ok(exists.iter().filter(|e| **e != 1).count())
}

/// Runs S6.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let (n, lease) = (ctx.scale().s6_locks, ctx.scale().s6_lease);
    let mut runs = Vec::new();
    for run in 0..ctx.runs() {
        let (idle_rate, _) = cpu_over(lease).await?;
        let start = Instant::now();
        let guards = acquire_all(ctx, run, n, lease).await?;
        let acquire_seconds = start.elapsed().as_secs_f64();
        let before = ctx.runtime.stats().watchdog;
        let (hold_rate, _) = cpu_over(lease * LEASES).await?;
        let after = ctx.runtime.stats().watchdog;
        let lost_guards = guards.iter().filter(|g| g.is_lost()).count();
        let missing = missing_in_redis(ctx, run, n).await?;
        let failed = release_all(guards).await?;
        let ticks = after.ticks - before.ticks;
        let round_trips = after.round_trips - before.round_trips;
        runs.push(Run {
            round_trips_per_tick: round_trips as f64 / ticks as f64,
            renewal_cpu_percent: ((hold_rate - idle_rate) * 100.0).max(0.0),
            idle_cpu_percent: idle_rate * 100.0,
            lost: after.lost - before.lost + failed as u64,
            lost_guards,
            missing_in_redis: missing,
            ticks,
            round_trips,
            acquire_seconds,
        });
    }
    let worst_lost = runs
        .iter()
        .map(|r| (r.lost as usize).max(r.lost_guards).max(r.missing_in_redis))
        .max()
        .unwrap_or(0);
    let rows = vec![
        Row::new(
            "S6",
            format!("renewal round trips per tick, {n} locks"),
            median_of(&runs, |r| r.round_trips_per_tick),
        )
        .target(Target::AtMost(10.0)),
        Row::new(
            "S6",
            "renewal CPU, % of one core",
            median_of(&runs, |r| r.renewal_cpu_percent),
        )
        .target(Target::AtMost(5.0)),
        Row::new(
            "S6",
            format!("locks lost over {LEASES} leases, worst run"),
            worst_lost as f64,
        )
        .target(Target::Exactly(0.0)),
    ];
    let detail = json!({
        "locks": n, "lease_s": lease.as_secs_f64(), "leases_held": LEASES,
        "runs": runs.iter().map(|r| json!({
            "round_trips_per_tick": r.round_trips_per_tick,
            "ticks": r.ticks, "round_trips": r.round_trips,
            "renewal_cpu_percent": r.renewal_cpu_percent,
            "idle_cpu_percent": r.idle_cpu_percent,
            "lost_or_failed_release": r.lost, "lost_guards": r.lost_guards,
            "missing_in_redis": r.missing_in_redis,
            "acquire_seconds": r.acquire_seconds,
        })).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows,
        detail,
        ..Output::default()
    })
}
