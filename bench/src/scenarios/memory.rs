//! S7: resident memory per held lock and per waiting task.
//!
//! Each measurement runs in a fresh worker process (`--worker memory`, see
//! `worker/memory.rs`), which reports its RSS before and after holding N
//! locks or parking N waiters on one lock; the figure is the difference over
//! N. It counts everything the client keeps: guards, table entries, watchdog
//! entries, and for waiters the task and its future.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use lock_runtime::{with_lock, LockError};
use serde_json::json;

use super::{Ctx, Output};
use crate::report::{Row, Target};
use crate::stats::median_of;
use crate::worker;

/// Figures of one run, bytes per item.
struct Run {
    per_held: f64,
    per_waiter: f64,
}

/// Bytes per item measured by one worker process in `mode`.
async fn measure(ctx: &Ctx, mode: &str, run: usize) -> Result<f64> {
    let n = ctx.scale().s7_items;
    let args = [
        "memory".to_owned(),
        mode.to_owned(),
        ctx.lock_server.url(),
        format!("s7:{run}:{mode}:"),
        n.to_string(),
    ];
    let mut worker = worker::start(&ctx.config.worker_exe, &args)?;
    worker.expect("ready", Duration::from_secs(60)).await?;
    let lines = worker
        .collect_until_done(Duration::from_secs(120), 10)
        .await?;
    let line = lines
        .iter()
        .find_map(|l| l.strip_prefix("mem "))
        .context("the memory worker reported nothing")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("bad memory line {line:?}"))?;
    let [before, after, count] = fields[..] else {
        bail!("bad memory line {line:?}");
    };
    Ok(after.saturating_sub(before) as f64 / count.max(1) as f64)
}

/// Runs S7.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let mut runs = Vec::new();
    for run in 0..ctx.runs() {
        runs.push(Run {
            per_held: measure(ctx, "held", run).await?,
            per_waiter: measure(ctx, "waiting", run).await?,
        });
    }
    let n = ctx.scale().s7_items;
    // Part of a waiter's cost is its future: the state machine is as large
    // as its largest suspension point, whichever it is parked at.
    let acquire_future = std::mem::size_of_val(&ctx.runtime.lock("size").acquire());
    let with_lock_future = std::mem::size_of_val(&with_lock(ctx.runtime.lock("size"), async {
        Ok::<(), LockError>(())
    }));
    let rows = vec![
        Row::new(
            "S7",
            format!("resident bytes per held lock ({n})"),
            median_of(&runs, |r| r.per_held),
        )
        .target(Target::Below(2048.0)),
        Row::new(
            "S7",
            format!("resident bytes per waiting task ({n})"),
            median_of(&runs, |r| r.per_waiter),
        )
        .target(Target::Below(2048.0)),
        Row::new(
            "S7",
            "size of an acquire() future (bytes)",
            acquire_future as f64,
        ),
        Row::new(
            "S7",
            "size of a with_lock() future (bytes)",
            with_lock_future as f64,
        ),
    ];
    let detail = json!({
        "items": n,
        "acquire_future_bytes": acquire_future,
        "with_lock_future_bytes": with_lock_future,
        "runs": runs.iter().map(|r| json!({
            "bytes_per_held_lock": r.per_held, "bytes_per_waiting_task": r.per_waiter,
        })).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows,
        detail,
        ..Output::default()
    })
}
