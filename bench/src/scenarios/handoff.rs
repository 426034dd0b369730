//! S3: contended handoff, ours against rslock.
//!
//! Runs the contention runs (`contention.rs`: eight workers in two processes,
//! one key, a GET + SET body on the data server), alternating our library and
//! rslock, with the idle PING measured before each; then reads handoff
//! latency, waits, shares, barging, exclusion and the counter from the
//! workers' records ([`crate::handoff`]). S4's rows come from the same runs.

use anyhow::Result;
use serde_json::json;

use super::baseline::{plain_ping_p50, runtime_ping_p50};
use super::contention::{self, Run, PROCESSES, TASKS};
use super::{commands, Ctx, Output};
use crate::handoff::Analysis;
use crate::report::{Row, Target};
use crate::stats::{median, median_of, Samples};
use crate::worker::Library;

fn handoffs_of(a: &Analysis) -> &Samples {
    &a.handoffs
}

fn waits_of(a: &Analysis) -> &Samples {
    &a.waits
}

/// Runs S3 and S4 (the same runs), keeping the rows asked for.
pub async fn run(ctx: &Ctx, show_s3: bool, show_s4: bool) -> Result<Output> {
    let (mut ours, mut fair, mut peer) = (Vec::new(), Vec::new(), Vec::new());
    // The idle round trip is measured right before every run (it moves with
    // the machine's state), and its median taken like every other figure.
    let (mut pings, mut plain_pings) = (Vec::new(), Vec::new());
    for run in 0..ctx.runs() {
        pings.push(runtime_ping_p50(&ctx.runtime, ctx.scale().pings).await?);
        ours.push(contention::contend(ctx, Library::Ours, run).await?);
        fair.push(contention::contend(ctx, Library::OursFair, run).await?);
        plain_pings.push(plain_ping_p50(&ctx.plain, ctx.scale().pings).await?);
        peer.push(contention::contend(ctx, Library::Rslock, run).await?);
    }
    let (ping, plain_ping) = (median(pings.clone()), median(plain_pings.clone()));
    let m = |runs: &[Run], f: fn(&Analysis) -> f64| median_of(runs, |r| f(&r.analysis));
    let worst = |runs: &[Run], f: fn(&Run) -> f64| runs.iter().map(f).fold(0.0, f64::max);
    let handoff = |a: &Analysis| a.handoffs.p50();
    let rate = |a: &Analysis| a.per_second;
    let wait_p99 = |a: &Analysis| a.waits.p99() / 1e3;
    let wait_max = |a: &Analysis| a.waits.max() / 1e3;
    let spread = |a: &Analysis| a.share_spread();
    let handed = |a: &Analysis| a.handoff_share() * 100.0;
    let barged = |a: &Analysis| a.barged as f64 * 100.0 / a.total.max(1) as f64;

    // The rows with targets, for each of our two modes.
    let ours_rows = |group: &'static str, runs: &[Run]| {
        vec![
            Row::new(group, "handoff p50 (us)", m(runs, handoff))
                .vs("1 PING, runtime conn", ping)
                .target(Target::RatioAtMost(3.0)),
            Row::new(group, "handoff p99 (us)", m(runs, |a| a.handoffs.p99()))
                .vs("1 PING, runtime conn", ping),
            Row::new(
                group,
                "handoff p50 vs PING p50 under load (us)",
                m(runs, handoff),
            )
            .vs("PING during run", median_of(runs, |r| r.loaded_ping)),
            Row::new(group, "acquisitions/s", m(runs, rate)).vs("rslock", m(&peer, rate)),
            Row::new(group, "wait to acquire p99 (ms)", m(runs, wait_p99))
                .target(Target::AtMost(5.0)),
            Row::new(group, "wait to acquire max (ms)", m(runs, wait_max))
                .target(Target::AtMost(50.0)),
            Row::new(group, "busiest / idlest worker", m(runs, spread)).target(Target::AtMost(2.0)),
            Row::new(
                group,
                "acquisitions handed to a waiter (%)",
                m(runs, handed),
            ),
            Row::new(
                group,
                "acquisitions barging past a waiter (%)",
                m(runs, barged),
            ),
            Row::new(
                group,
                "|counter - acquisitions|, worst run",
                worst(runs, Run::counter_error),
            )
            .target(Target::Exactly(0.0)),
            Row::new(
                group,
                "overlaps+timeouts+errors, worst run",
                worst(runs, Run::failures),
            )
            .target(Target::Exactly(0.0)),
        ]
    };

    let mut rows = Vec::new();
    if show_s3 {
        rows.extend(ours_rows("S3", &ours));
        rows.extend(ours_rows("S3 fair", &fair));
        rows.extend([
            Row::new("S3 peer", "rslock handoff p50 (us)", m(&peer, handoff))
                .vs("1 PING, plain conn", plain_ping),
            Row::new("S3 peer", "rslock wait p99 (ms)", m(&peer, wait_p99)),
            Row::new("S3 peer", "rslock wait max (ms)", m(&peer, wait_max)),
            Row::new(
                "S3 peer",
                "rslock busiest / idlest worker",
                m(&peer, spread),
            ),
            Row::new("S3 peer", "rslock acquisitions/s", m(&peer, rate)),
            Row::new("S3 peer", "rslock handed to a waiter (%)", m(&peer, handed)),
            Row::new(
                "S3 peer",
                "rslock barging past a waiter (%)",
                m(&peer, barged),
            ),
            Row::new(
                "S3 peer",
                "rslock |counter - acq|, worst run",
                worst(&peer, Run::counter_error),
            ),
            Row::new("S3 vs peer", "handoff p50 ours / rslock", m(&ours, handoff))
                .vs("rslock", m(&peer, handoff)),
            Row::new("S3 vs peer", "wait p99 ours / rslock", m(&ours, wait_p99))
                .vs("rslock", m(&peer, wait_p99)),
        ]);
    }
    if show_s4 {
        rows.extend(commands::rows(&ours, &fair, &peer));
    }
    let pool = |runs: &[Run], pick: fn(&Analysis) -> &Samples| {
        Samples::new(
            runs.iter()
                .flat_map(|r| pick(&r.analysis).sorted().iter().copied())
                .collect(),
        )
    };
    let detail = json!({
        "processes": PROCESSES,
        "tasks_per_process": TASKS,
        "seconds_per_run": ctx.scale().s3_duration.as_secs_f64(),
        "ping_p50_us_runtime_conn": pings,
        "ping_p50_us_plain_conn": plain_pings,
        "ours": ours.iter().map(Run::to_json).collect::<Vec<_>>(),
        "ours_fair": fair.iter().map(Run::to_json).collect::<Vec<_>>(),
        "rslock": peer.iter().map(Run::to_json).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows,
        detail,
        handoffs: Some((
            pool(&ours, handoffs_of),
            pool(&fair, handoffs_of),
            pool(&peer, handoffs_of),
        )),
        waits: Some((
            pool(&ours, waits_of),
            pool(&fair, waits_of),
            pool(&peer, waits_of),
        )),
        ping_p50: Some(ping),
    })
}
