//! S7's worker: resident memory per held lock or per waiting task.
//!
//! Measured in a fresh process, because a process that has already
//! allocated and freed a lot (every earlier scenario) reuses its free heap
//! without growing, which would hide the cost. The worker connects, warms
//! up, reads its RSS, then either takes `n` locks and keeps the guards, or
//! parks `n` tasks waiting for one held lock, and reads its RSS again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use lock_runtime::{LockGuard, LockRuntime};
use lock_testkit::usage::rss_bytes;
use lock_testkit::CommandStats;
use tokio::time::Instant;

/// How long parking all the waiters may take.
const PARK_LIMIT: Duration = Duration::from_secs(60);
/// Waiters spawned at a time.
const BURST: usize = 100;
/// Polls in a row (100 ms apart) with no new acquire attempt: all parked.
const QUIET_POLLS: u32 = 3;
/// Settling time before reading RSS.
const SETTLE: Duration = Duration::from_millis(300);

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Held,
    Waiting,
}

/// `memory` arguments.
pub struct Args {
    mode: Mode,
    lock_url: String,
    prefix: String,
    n: usize,
}

impl Args {
    pub(super) fn parse(args: &[String]) -> Result<Self> {
        let [mode, lock_url, prefix, n] = args else {
            bail!("usage: --worker memory <held|waiting> <lock-url> <prefix> <n>");
        };
        let mode = match mode.as_str() {
            "held" => Mode::Held,
            "waiting" => Mode::Waiting,
            other => bail!("unknown memory mode {other:?}"),
        };
        Ok(Args {
            mode,
            lock_url: lock_url.clone(),
            prefix: prefix.clone(),
            n: super::parse("n", n)?,
        })
    }
}

pub(super) async fn run(args: Args) -> Result<()> {
    let runtime = LockRuntime::builder()
        .redis(args.lock_url.as_str())
        .key_prefix(args.prefix.as_str())
        .build()
        .await?;
    // Warm up the code paths and the runtime's tables.
    for i in 0..100 {
        runtime
            .lock(format!("warm:{i}"))
            .acquire()
            .await?
            .release()
            .await?;
    }
    super::emit(["ready".to_owned()])?;
    let (before, after) = match args.mode {
        Mode::Held => held(&runtime, args.n).await?,
        Mode::Waiting => waiting(&runtime, &args.lock_url, args.n).await?,
    };
    super::emit([
        format!("mem {before} {after} {}", args.n),
        "done".to_owned(),
    ])
}

/// RSS before and after taking `n` locks (guards kept in a Vec).
async fn held(runtime: &LockRuntime, n: usize) -> Result<(u64, u64)> {
    tokio::time::sleep(SETTLE).await;
    let before = rss_bytes()?;
    let mut guards: Vec<LockGuard> = Vec::with_capacity(n);
    for i in 0..n {
        guards.push(runtime.lock(format!("held:{i}")).acquire().await?);
    }
    tokio::time::sleep(SETTLE).await;
    let after = rss_bytes()?;
    if runtime.stats().held != n {
        bail!(
            "expected {n} held locks, the runtime has {}",
            runtime.stats().held
        );
    }
    drop(guards); // released in the background
    Ok((before, after))
}

/// RSS before and after parking `n` tasks on one held lock.
async fn waiting(runtime: &LockRuntime, url: &str, n: usize) -> Result<(u64, u64)> {
    let mut info = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let holder = runtime.lock("waited").acquire().await?;
    let start = CommandStats::read(&mut info).await?;
    tokio::time::sleep(SETTLE).await;
    let before = rss_bytes()?;
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(n);
    // In bursts, as callers arrive in a service: what stays resident is the
    // parked waiters, not the transient buffers of n first attempts at once.
    for burst in 0..n.div_ceil(BURST) {
        for _ in burst * BURST..n.min((burst + 1) * BURST) {
            let (runtime, started) = (runtime.clone(), started.clone());
            tasks.push(tokio::spawn(async move {
                started.fetch_add(1, Ordering::Relaxed);
                runtime.lock("waited").acquire().await
            }));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Parked: every task has started, and the acquire attempts the waiters
    // send (one or two each, or none when they queue behind a local waiter)
    // have stopped coming for a few polls in a row.
    let deadline = Instant::now() + PARK_LIMIT;
    let (mut last, mut quiet) = (u64::MAX, 0);
    while quiet < QUIET_POLLS {
        if Instant::now() >= deadline {
            bail!("{n} waiters did not settle within {PARK_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let sent = CommandStats::read(&mut info).await?.since(&start);
        let acquires = sent.get("evalsha") + sent.get("eval");
        let all_started = started.load(Ordering::Relaxed) == n;
        quiet = if all_started && acquires == last {
            quiet + 1
        } else {
            0
        };
        last = acquires;
    }
    if tasks.iter().any(|t| t.is_finished()) {
        bail!("a waiter finished while the lock was held");
    }
    tokio::time::sleep(SETTLE).await;
    let after = rss_bytes()?;
    for task in &tasks {
        task.abort();
    }
    holder.release().await.context("release the waited lock")?;
    Ok((before, after))
}
