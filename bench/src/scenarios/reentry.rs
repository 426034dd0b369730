//! S2: nested re-entry of a held key.
//!
//! Inside an outer `with_lock` on a key, the same owner scope takes and
//! gives back the same key many times. The runtime re-enters from its own
//! table, so the limit is 0 round trips; the target is at most 1 (one PING)
//! per nested acquire + release. The lock server's `INFO commandstats` is
//! read before and after the nested loop to show that nothing was sent.

use anyhow::Result;
use lock_runtime::with_lock;
use lock_testkit::CommandStats;
use serde_json::json;

use super::baseline::{runtime_ping_p50, timed};
use super::{Ctx, Output};
use crate::report::{Row, Target};
use crate::stats::median_of;

/// Figures of one run.
struct Run {
    nested_p50: f64,
    ping_p50: f64,
    commands: u64,
    pairs: usize,
}

/// Runs S2.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let pairs = ctx.scale().s2_pairs;
    let mut runs = Vec::new();
    for run in 0..ctx.runs() {
        let ping_p50 = runtime_ping_p50(&ctx.runtime, ctx.scale().pings).await?;
        let key = format!("s2:{run}");
        let key = key.as_str();
        let mut info = ctx.plain.clone();
        let (nested, delta) = with_lock(ctx.runtime.lock(key), async {
            let before = CommandStats::read(&mut info).await?;
            let nested = timed(pairs, move || async move {
                with_lock(ctx.runtime.lock(key), async { anyhow::Ok(()) }).await
            })
            .await?;
            let after = CommandStats::read(&mut info).await?;
            anyhow::Ok((nested, after.since(&before)))
        })
        .await?;
        runs.push(Run {
            nested_p50: nested.p50(),
            ping_p50,
            commands: delta.executed(),
            pairs,
        });
    }
    let nested = median_of(&runs, |r| r.nested_p50);
    let ping = median_of(&runs, |r| r.ping_p50);
    let per_pair = median_of(&runs, |r| r.commands as f64 / r.pairs as f64);
    let rows = vec![
        Row::new("S2", "nested acquire+release p50 (us)", nested)
            .vs("1 PING, runtime conn", ping)
            .target(Target::RatioAtMost(1.0)),
        Row::new("S2", "Redis commands per nested pair", per_pair).target(Target::AtMost(0.01)),
    ];
    let detail = json!({
        "pairs_per_run": pairs,
        "runs": runs.iter().map(|r| json!({
            "nested_p50_us": r.nested_p50, "ping_p50_us": r.ping_p50,
            "commands_during_nested_loop": r.commands,
        })).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows,
        detail,
        ..Output::default()
    })
}
