//! The child side: what `lock-bench --worker ...` does.
//!
//! ```text
//! --worker contend <library> <lock-url> <data-url> <prefix> <tasks> <first-id> <millis> <keys> <connections>
//!     S3, S8, S9: <tasks> workers take locks over and over for <millis> after
//!     `go`, each on one key (<keys> = `one`) or a Zipf draw (`zipf:<n>:<s>`);
//!     body: GET + SET of the key's counter on the data server, on one of
//!     <connections> multiplexed connections (the tasks split in order).
//!     <library> is ours, ours-fair, ours-cohort, ours-fair-cohort,
//!     ours-default, ours-cluster, ours-etcd, ours-zookeeper, rslock, or
//!     serial (no lock: the limit; Curator's worker is
//!     `bench/java/CuratorLoop.java`, speaking the same lines).
//!     Prints `rec` lines, then `timeouts`, `errors`, `passed` (holds
//!     passed locally, lock cohorting), `cpu_us` (the process's CPU time
//!     during the run) and `switches` (its threads' context switches).
//! --worker read-write <contender> <lock-url> <data-url> <prefix> <tasks> <first-id> <millis> <connections> <seed> <writes-per-mille> <pause-us>
//!     S14: <tasks> workers read (GET, yield, GET) and now and then write
//!     (GET + SET) one key's counter on the data server for <millis> after
//!     `go`, each call's kind drawn from the task's generator seeded from
//!     <seed>; <contender> is rw-plain, rw-default, exclusive, or limit (an
//!     in-process `tokio::sync::RwLock`); a body pauses <pause-us> after
//!     its first command (0: not at all). Prints `rw` lines, then
//!     `timeouts`, `errors`, `passed`, `joined` (reads that joined a read
//!     hold of the process), `cpu_us` and `served` (fair, plain or local:
//!     how its holds were served).
//! --worker transfers <variant> <lock-url> <prefix> <tasks> <first-id> <millis> <seed> <accounts>
//!     S15: <tasks> workers move 1 between two distinct accounts of
//!     <accounts>, drawn from the task's generator seeded from <seed>, for
//!     <millis> after `go`; body: GET both balances, SET both, on the lock
//!     server. <variant> is multi (`with_locks(lock_many([from, to]))`),
//!     global (one lock `bank`) or nested-sorted (two nested `with_lock`,
//!     keys sorted by hand). Prints `tx` lines, then `timeouts`, `errors`,
//!     `passed` and `cpu_us`.
//! --worker flashsale <locking> <lock-url> <prefix> <tasks> <first-id> <millis> <segments>
//!     S16: <tasks> workers buy one unit at a time from a stock split into
//!     <segments> counters on the lock server until every segment is empty
//!     (or <millis> after `go`); <locking> is permits (under
//!     `lock("stock").permits(<segments>)`, on segment `permit()`) or
//!     unlocked (the limit). Prints `sale` lines, then `timeouts`,
//!     `errors`, `passed` and `cpu_us`.
//! --worker memory <held|waiting> <lock-url> <prefix> <n>
//!     S7: resident bytes before/after holding n locks or parking n waiters.
//! ```
//!
//! All print `ready` once set up (all but memory then
//! wait for `go` on stdin), and `done` at the end; [`start`] is the
//! parent's side.

mod contend;
pub mod flash_sale;
mod memory;
pub mod read_write;
mod tasks;
pub mod transfers;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use lock_testkit::LineChild;

pub use contend::{Library, WAIT_LIMIT};

/// Starts `exe --worker <args...>` (the parent's side), to be driven by lines.
pub fn start(exe: &Path, args: &[String]) -> Result<LineChild> {
    let name = format!("worker {}", args.first().map_or("", String::as_str));
    LineChild::spawn(Command::new(exe).arg("--worker").args(args), &name)
}

/// Runs the worker described by `args` (what follows `--worker`).
pub async fn main(args: &[String]) -> Result<()> {
    match args {
        [mode, rest @ ..] if mode == "contend" => contend::run(contend::Args::parse(rest)?).await,
        [mode, rest @ ..] if mode == "memory" => memory::run(memory::Args::parse(rest)?).await,
        [mode, rest @ ..] if mode == "read-write" => {
            read_write::run(read_write::Args::parse(rest)?).await
        }
        [mode, rest @ ..] if mode == "transfers" => {
            transfers::run(transfers::Args::parse(rest)?).await
        }
        [mode, rest @ ..] if mode == "flashsale" => {
            flash_sale::run(flash_sale::Args::parse(rest)?).await
        }
        _ => {
            bail!("usage: lock-bench --worker (contend|memory|read-write|transfers|flashsale) ...")
        }
    }
}

/// Prints lines and flushes (the parent reads them through a pipe).
fn emit(lines: impl IntoIterator<Item = String>) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for line in lines {
        writeln!(out, "{line}")?;
    }
    out.flush().context("write to the parent")
}

/// Blocks (off the async threads) until the parent sends a line.
async fn wait_for_go() -> Result<()> {
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await??;
    if line.trim() != "go" {
        bail!("expected `go` from the parent, got {line:?}");
    }
    Ok(())
}

/// What the contention and the read-write workers are both given first, in this
/// order: where the locks and the data live, the key prefix, how many tasks from
/// which task id, and how long they run after `go`.
struct Run {
    lock_url: String,
    data_url: String,
    prefix: String,
    tasks: u32,
    first_id: u32,
    duration: Duration,
}

impl Run {
    /// Parses `<lock-url> <data-url> <prefix> <tasks> <first-id> <millis>`.
    fn parse([lock_url, data_url, prefix, tasks, first_id, millis]: [&String; 6]) -> Result<Run> {
        Ok(Run {
            lock_url: lock_url.clone(),
            data_url: data_url.clone(),
            prefix: prefix.clone(),
            tasks: parse("tasks", tasks)?,
            first_id: parse("first id", first_id)?,
            duration: Duration::from_millis(parse("millis", millis)?),
        })
    }
}

/// What the workers whose data lives on the lock server (transfers,
/// flashsale) are given after their variant, in this order: the server,
/// the key prefix, how many tasks from which task id, and how long they
/// run after `go`.
struct OnLockServer {
    /// The lock server, which holds the data too.
    lock_url: String,
    /// The run's key prefix.
    prefix: String,
    /// Tasks in this process.
    tasks: u32,
    /// The number of its first task (unique across processes).
    first_id: u32,
    /// How long the tasks run after `go` (at most).
    duration: Duration,
}

impl OnLockServer {
    /// Parses `<lock-url> <prefix> <tasks> <first-id> <millis>`.
    fn parse([lock_url, prefix, tasks, first_id, millis]: [&String; 5]) -> Result<Self> {
        Ok(OnLockServer {
            lock_url: lock_url.clone(),
            prefix: prefix.clone(),
            tasks: parse("tasks", tasks)?,
            first_id: parse("first id", first_id)?,
            duration: Duration::from_millis(parse("millis", millis)?),
        })
    }
}

fn parse<T: std::str::FromStr>(what: &str, s: &str) -> Result<T> {
    s.parse().map_err(|_| anyhow::anyhow!("bad {what}: {s:?}"))
}
