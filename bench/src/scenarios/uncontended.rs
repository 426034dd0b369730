//! S1 and S1b: one task, uncontended.
//!
//! S1 is an explicit acquire and an awaited release (`acquire().await`,
//! `guard.release().await`): two round trips (acquire script, release
//! script), so it is compared with two sequential PINGs on the runtime's
//! own connection, and with rslock doing the same (SET NX, then its unlock
//! script) on a plain connection. S1b is a locked call of an empty body
//! (`with_lock`, what `#[distributed_lock]` expands to), which returns
//! without waiting for its release's answer: one round trip, compared with
//! one PING. The kinds are measured in interleaved blocks so that drift in
//! the machine's load hits all of them alike.

use anyhow::Result;
use lock_runtime::{with_lock, LockError};
use lock_testkit::{CommandStats, Delta};
use serde_json::json;

use super::baseline::{plain_pings, runtime_pings, timed};
use super::{Ctx, Output};
use crate::report::{commands_json, Row, Target};
use crate::stats::median_of;

/// Operations per kind in one block.
const BLOCK: usize = 100;
/// Unmeasured operations per kind before each run.
const WARMUP: usize = 50;
/// rslock's lease for these locks.
const PEER_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// p50s of one run, and Redis's own time per operation, µs.
struct Run {
    /// Explicit acquire + awaited release.
    guard: f64,
    /// A locked call (`with_lock`).
    call: f64,
    ping1: f64,
    ping2: f64,
    peer: f64,
    plain_ping2: f64,
    server_guard: f64,
    server_call: f64,
    server_ping2: f64,
    /// Commands (with server time) of `BLOCK` acquire+release operations.
    server_detail: Delta,
}

/// Server time (µs, from `INFO commandstats`) per operation of `op`,
/// counting the commands named in `names`; and every command's counters.
async fn server_time<F, Fut>(ctx: &Ctx, names: &[&str], op: F) -> Result<(f64, Delta)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut info = ctx.plain.clone();
    let before = CommandStats::read(&mut info).await?;
    timed(BLOCK, op).await?;
    let delta = CommandStats::read(&mut info).await?.since(&before);
    let usec: u64 = names.iter().map(|n| delta.usec(n)).sum();
    Ok((usec as f64 / BLOCK as f64, delta))
}

/// Runs S1 and S1b.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let blocks = ctx.scale().s1_ops.div_ceil(BLOCK).max(1);
    let mut runs = Vec::new();
    for run in 0..ctx.runs() {
        let key = format!("s1:{run}");
        let peer_key = format!("peer:s1:{run}");
        let (key, peer_key) = (key.as_str(), peer_key.as_bytes());
        let guard_op = move || async move {
            let guard = ctx.runtime.lock(key).acquire().await?;
            guard.release().await?;
            anyhow::Ok(())
        };
        let call_op = move || async move {
            with_lock(ctx.runtime.lock(key), async { Ok::<_, LockError>(()) }).await?;
            anyhow::Ok(())
        };
        let peer_op = move || async move {
            let lock = ctx.peer.lock(peer_key, PEER_TTL).await?;
            ctx.peer.unlock(&lock).await;
            anyhow::Ok(())
        };
        timed(WARMUP, guard_op).await?;
        timed(WARMUP, call_op).await?;
        timed(WARMUP, peer_op).await?;
        runtime_pings(&ctx.runtime, WARMUP, 2).await?;
        plain_pings(&ctx.plain, WARMUP, 2).await?;

        let mut guard = vec![];
        let mut call = vec![];
        let (mut ping1, mut ping2, mut peer, mut plain2) = (vec![], vec![], vec![], vec![]);
        for _ in 0..blocks {
            guard.extend_from_slice(timed(BLOCK, guard_op).await?.sorted());
            ping2.extend_from_slice(runtime_pings(&ctx.runtime, BLOCK, 2).await?.sorted());
            call.extend_from_slice(timed(BLOCK, call_op).await?.sorted());
            ping1.extend_from_slice(runtime_pings(&ctx.runtime, BLOCK, 1).await?.sorted());
            peer.extend_from_slice(timed(BLOCK, peer_op).await?.sorted());
            plain2.extend_from_slice(plain_pings(&ctx.plain, BLOCK, 2).await?.sorted());
        }
        let runtime = &ctx.runtime;
        let (server_guard, server_detail) =
            server_time(ctx, &["evalsha", "eval"], guard_op).await?;
        let (server_call, _) = server_time(ctx, &["evalsha", "eval"], call_op).await?;
        let (server_ping2, _) = server_time(ctx, &["ping"], move || async move {
            runtime.ping().await?;
            runtime.ping().await?;
            anyhow::Ok(())
        })
        .await?;
        let p50 = |v: Vec<f64>| crate::stats::Samples::new(v).p50();
        runs.push(Run {
            guard: p50(guard),
            call: p50(call),
            ping1: p50(ping1),
            ping2: p50(ping2),
            peer: p50(peer),
            plain_ping2: p50(plain2),
            server_guard,
            server_call,
            server_ping2,
            server_detail,
        });
    }
    let guard = median_of(&runs, |r| r.guard);
    let call = median_of(&runs, |r| r.call);
    let ping1 = median_of(&runs, |r| r.ping1);
    let ping2 = median_of(&runs, |r| r.ping2);
    let peer = median_of(&runs, |r| r.peer);
    let plain2 = median_of(&runs, |r| r.plain_ping2);
    let rows = vec![
        Row::new("S1", "acquire+release p50 (us)", guard)
            .vs("2 PINGs, runtime conn", ping2)
            .target(Target::RatioAtMost(1.15)),
        Row::new(
            "S1",
            "Redis server time per acquire+release (us)",
            median_of(&runs, |r| r.server_guard),
        )
        .vs("2 PINGs", median_of(&runs, |r| r.server_ping2)),
        Row::new("S1 peer", "rslock lock+unlock p50 (us)", peer).vs("2 PINGs, plain conn", plain2),
        Row::new("S1 vs peer", "ours / rslock, p50", guard)
            .vs("rslock", peer)
            .target(Target::RatioAtMost(1.0)),
        Row::new("S1b", "locked call p50 (us)", call)
            .vs("1 PING, runtime conn", ping1)
            .target(Target::RatioAtMost(1.2)),
        Row::new(
            "S1b",
            "Redis server time per locked call (us)",
            median_of(&runs, |r| r.server_call),
        )
        .vs("2 PINGs", median_of(&runs, |r| r.server_ping2)),
        Row::new("S1b vs peer", "ours / rslock, p50", call).vs("rslock", peer),
    ];
    let detail = json!({
        "ops_per_kind_per_run": blocks * BLOCK,
        "server_block_ops": BLOCK,
        "runs_p50_us": runs.iter().map(|r| json!({
            "acquire_release": r.guard, "locked_call": r.call,
            "one_ping_runtime": r.ping1, "two_pings_runtime": r.ping2,
            "rslock": r.peer, "two_pings_plain": r.plain_ping2,
            "server_us_acquire_release": r.server_guard,
            "server_us_locked_call": r.server_call, "server_us_two_pings": r.server_ping2,
            "server_commands_per_block": commands_json(&r.server_detail),
        })).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows,
        detail,
        ..Output::default()
    })
}
