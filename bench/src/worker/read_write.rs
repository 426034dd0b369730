//! The read-write worker (S14): a few tasks of one process reading and now
//! and then writing one key's counter, under a read-write lock, under the
//! exclusive lock, or under an in-process `tokio::sync::RwLock` (the limit).
//!
//! Each task draws every call's kind from its own generator, seeded from
//! the run's seed and the task's number ([`crate::keys::Rng`]), so every
//! contender of a run sees the same sequence of reads and writes per task.
//! A read's body GETs the counter, yields, and GETs it again: under a lock
//! that keeps writers out, the two values are equal, and a pair that is
//! not is a *torn read*, reported with its record. A write's body is S3's:
//! GET the counter and SET it one higher. The counter lives on the data
//! server, as in S3.
//!
//! Besides its records the worker tells the parent how its read and write
//! holds were served (`served fair` or `served plain`): a read-write
//! request that does not ask for a fair mode gets the runtime's default,
//! except on a backend that serves read-write holds in plain mode only
//! (Redis did before issue 28's step 5, and refused a read that asked
//! `fair(true)`). The worker finds out by asking a fair read hold once.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use lock_runtime::{with_lock, Cohort, LockError, LockRuntime};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::time::Instant;

use super::contend::{default_fair, WAIT_LIMIT};
use super::tasks::{self, cpu_seconds, now_us};
use crate::keys::Rng;
use crate::read_write::{Kind, RwRecord};

/// Upper bound on calls per task, whatever the duration.
const MAX_PER_TASK: usize = 1_000_000;
/// The contended key's lock name (the counter is `<prefix>counter`).
const KEY: &str = "contended";

/// Who excludes the writers, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// lock-runtime in plain mode (`fair(false)`), `.read()` / `.write()`.
    ReadWritePlain,
    /// lock-runtime as `LockRuntime::builder()` configures it,
    /// `.read()` / `.write()`: fair by default, where the backend serves
    /// fair read-write holds (the worker reports how they were served).
    ReadWriteDefault,
    /// lock-runtime as the builder configures it, every call exclusive.
    Exclusive,
    /// No distributed lock: one process, an in-process writer-preferring
    /// `tokio::sync::RwLock` (FIFO: once a writer waits, later readers
    /// queue behind it).
    Limit,
}

impl Contender {
    /// In report order.
    pub const ALL: [Contender; 4] = [
        Contender::ReadWritePlain,
        Contender::ReadWriteDefault,
        Contender::Exclusive,
        Contender::Limit,
    ];

    /// Name on the command line and in the results file.
    pub fn name(self) -> &'static str {
        match self {
            Contender::ReadWritePlain => "rw-plain",
            Contender::ReadWriteDefault => "rw-default",
            Contender::Exclusive => "exclusive",
            Contender::Limit => "limit",
        }
    }
}

/// `read-write` arguments.
pub struct Args {
    contender: Contender,
    run: super::Run,
    connections: u32,
    seed: u64,
    /// Writes per thousand calls.
    write_permille: u64,
    /// How long a body pauses after its first command (zero: no pause).
    pause: Duration,
}

impl Args {
    pub(super) fn parse(args: &[String]) -> Result<Self> {
        let [contender, lock_url, data_url, prefix, tasks, first_id, millis, connections, seed, writes, pause] =
            args
        else {
            bail!("usage: --worker read-write <contender> <lock-url> <data-url> <prefix> <tasks> <first-id> <millis> <connections> <seed> <writes-per-mille> <pause-us>");
        };
        Ok(Args {
            contender: tasks::named(Contender::ALL, Contender::name, "contender", contender)?,
            run: super::Run::parse([lock_url, data_url, prefix, tasks, first_id, millis])?,
            connections: super::parse("connections", connections)?,
            seed: super::parse("seed", seed)?,
            write_permille: super::parse("writes per mille", writes)?,
            pause: Duration::from_micros(super::parse("pause", pause)?),
        })
    }
}

/// What excludes the writers in this process.
#[derive(Clone)]
enum Guard {
    /// Our runtime; `rw` says whether calls ask `.read()` / `.write()`.
    Ours { runtime: LockRuntime, rw: bool },
    /// The limit's in-process lock.
    Local(Arc<tokio::sync::RwLock<()>>),
}

/// What one task did.
type TaskResult = tasks::TaskResult<RwRecord>;

/// The cohort limits to try instead of the default in every runtime of
/// S14 (joins of readers and passes of holds within a process both stop
/// at them): `LOCK_BENCH_S14_COHORT=<handoffs>:<budget-ms>`. For tuning;
/// unset in the figures BENCHMARKS.md reports unless they say otherwise.
pub fn cohort_tried() -> Option<Cohort> {
    let value = std::env::var("LOCK_BENCH_S14_COHORT").ok()?;
    let (handoffs, millis) = value.trim().split_once(':')?;
    Some(Cohort {
        handoffs: handoffs.parse().ok()?,
        budget: Duration::from_millis(millis.parse().ok()?),
    })
}

/// The generator of task `id`'s call kinds in a run seeded `seed`.
pub fn kinds(seed: u64, id: u32) -> Rng {
    Rng::new(seed.rotate_left(32) ^ u64::from(id))
}

pub(super) async fn run(args: Args) -> Result<()> {
    let data =
        tasks::data_connections(&args.run.data_url, args.connections, args.run.tasks).await?;
    let builder = || {
        let builder = LockRuntime::builder().redis(args.run.lock_url.as_str());
        match cohort_tried() {
            Some(c) => builder.cohort(c.handoffs, c.budget),
            None => builder,
        }
    };
    let guard = match args.contender {
        Contender::Limit => Guard::Local(Arc::new(tokio::sync::RwLock::new(()))),
        Contender::ReadWritePlain => Guard::Ours {
            runtime: builder()
                .fair(false)
                .key_prefix(args.run.prefix.as_str())
                .build()
                .await?,
            rw: true,
        },
        Contender::ReadWriteDefault | Contender::Exclusive => Guard::Ours {
            runtime: builder()
                .key_prefix(args.run.prefix.as_str())
                .build()
                .await?,
            rw: args.contender == Contender::ReadWriteDefault,
        },
    };
    // Warm up (connections, script cache) before the measured part, on a
    // key and a counter of this process's own.
    let warm = format!("warmup:{}", args.run.first_id);
    let warm_counter = format!("{}{warm}:counter", args.run.prefix);
    let mut scratch = TaskResult::default();
    for kind in [Kind::Write, Kind::Read] {
        let at = Call { worker: 0, kind };
        let names = (warm.as_str(), warm_counter.as_str(), args.pause);
        once(&guard, names, &data[0], at, &mut scratch, true).await?;
    }
    let served = served(args.contender, &guard, &warm).await?;

    let counter = format!("{}counter", args.run.prefix);
    super::emit(["ready".to_owned()])?;
    super::wait_for_go().await?;
    let passed_before = passed_locally(&guard);
    let joined_before = joined_locally(&guard);
    let cpu_before = cpu_seconds();
    let end = Instant::now() + args.run.duration;
    let mut running = tokio::task::JoinSet::new();
    for id in args.run.first_id..args.run.first_id + args.run.tasks {
        let guard = guard.clone();
        let data = tasks::connection_of(&data, id - args.run.first_id, args.run.tasks);
        let counter = counter.clone();
        let mut kinds = kinds(args.seed, id);
        let write_share = args.write_permille as f64 / 1000.0;
        let pause = args.pause;
        running.spawn(async move {
            let mut result = TaskResult::default();
            for _ in 0..MAX_PER_TASK {
                if Instant::now() >= end {
                    break;
                }
                let kind = if kinds.next_f64() < write_share {
                    Kind::Write
                } else {
                    Kind::Read
                };
                let at = Call { worker: id, kind };
                once(
                    &guard,
                    (KEY, &counter, pause),
                    &data,
                    at,
                    &mut result,
                    false,
                )
                .await?;
            }
            anyhow::Ok(result)
        });
    }
    let mut lines = tasks::lines_of(running, RwRecord::to_line).await?;
    lines.push(format!(
        "passed {}",
        passed_locally(&guard).saturating_sub(passed_before)
    ));
    lines.push(format!(
        "joined {}",
        joined_locally(&guard).saturating_sub(joined_before)
    ));
    lines.push(tasks::cpu_line(cpu_before));
    lines.push(format!("served {served}"));
    lines.push("done".to_owned());
    // (The last releases go out before the process exits: see `contend`.)
    if let Guard::Ours { runtime, .. } = &guard {
        runtime.shutdown().await?;
    }
    super::emit(lines)
}

/// How this process's holds are served: `fair` or `plain` (`local` for
/// the limit). Exclusive holds take the builder's default. A read-write
/// request that asks no mode takes that default too where the backend
/// serves fair read-write holds, and plain mode where it does not; such a
/// backend refuses a read that asks `fair(true)`, which is how this finds
/// out.
async fn served(contender: Contender, guard: &Guard, warm: &str) -> Result<&'static str> {
    let fair = match (contender, guard) {
        (Contender::Limit, _) | (_, Guard::Local(_)) => return Ok("local"),
        (Contender::ReadWritePlain, _) => false,
        (Contender::Exclusive, _) => default_fair(),
        (Contender::ReadWriteDefault, _) if !default_fair() => false,
        (Contender::ReadWriteDefault, Guard::Ours { runtime, .. }) => {
            match runtime.lock(warm).read().fair(true).try_acquire().await {
                Ok(Some(held)) => {
                    held.release().await?;
                    true
                }
                Ok(None) => bail!("the warm-up key {warm:?} is held by someone else"),
                Err(LockError::InvalidConfig(_)) => false,
                Err(e) => return Err(e.into()),
            }
        }
    };
    Ok(if fair { "fair" } else { "plain" })
}

/// Holds passed between tasks of this process without a round trip so far.
fn passed_locally(guard: &Guard) -> u64 {
    match guard {
        Guard::Ours { runtime, .. } => runtime.stats().passed_locally,
        Guard::Local(_) => 0,
    }
}

/// Reads that joined a read hold of this process without a round trip so
/// far.
fn joined_locally(guard: &Guard) -> u64 {
    match guard {
        Guard::Ours { runtime, .. } => runtime.stats().joined_locally,
        Guard::Local(_) => 0,
    }
}

/// Who makes the call, and what kind it is.
#[derive(Clone, Copy)]
struct Call {
    worker: u32,
    kind: Kind,
}

/// A read's or a write's body on `counter`: `(acquired, released, torn)`.
async fn body(
    data: &MultiplexedConnection,
    counter: &str,
    kind: Kind,
    pause: Duration,
) -> Result<(u64, u64, bool)> {
    let mut data = data.clone();
    let acquired = now_us();
    let first: Option<u64> = data.get(counter).await?;
    if !pause.is_zero() {
        // A body that works a while (tuning: where sharing pays off).
        tokio::time::sleep(pause).await;
    }
    let torn = match kind {
        Kind::Read => {
            // Give every other task of the process a turn between the two
            // reads: a writer let in beside this reader would run here.
            tokio::task::yield_now().await;
            let second: Option<u64> = data.get(counter).await?;
            second != first
        }
        Kind::Write => {
            let () = data.set(counter, first.unwrap_or(0) + 1).await?;
            false
        }
    };
    Ok((acquired, now_us(), torn))
}

/// One call on `key`, its body on `counter` pausing `pause`; recorded
/// under `at` unless `warmup` (which also turns every error into a
/// failure).
async fn once(
    guard: &Guard,
    (key, counter, pause): (&str, &str, Duration),
    data: &MultiplexedConnection,
    at: Call,
    result: &mut TaskResult,
    warmup: bool,
) -> Result<()> {
    let requested = now_us();
    let outcome = match guard {
        Guard::Ours { runtime, rw } => {
            let request = runtime.lock(key).wait(WAIT_LIMIT);
            let request = match (rw, at.kind) {
                (false, _) => request,
                (true, Kind::Read) => request.read(),
                (true, Kind::Write) => request.write(),
            };
            with_lock(request, body(data, counter, at.kind, pause)).await
        }
        Guard::Local(lock) => match at.kind {
            Kind::Read => {
                let _shared = lock.read().await;
                body(data, counter, at.kind, pause).await
            }
            Kind::Write => {
                let _alone = lock.write().await;
                body(data, counter, at.kind, pause).await
            }
        },
    };
    let record = |(acquired, released, torn)| RwRecord {
        worker: at.worker,
        kind: at.kind,
        requested,
        acquired,
        released,
        torn,
    };
    result.note(at.worker, outcome, warmup, record)
}
