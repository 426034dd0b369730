//! S3's worker: a few tasks of one process taking one lock in turn.
//!
//! Each task loops: note the time, take the lock, run a tiny body (GET and
//! SET of a counter on the *data* server, so the lock server's command
//! counts show only lock traffic), release, until the run's time is up.
//! The same loop runs on our library (`with_lock`, the declarative path) or
//! on rslock (`acquire` with its default retry settings, then `release`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};
use lock_runtime::{with_lock, LockError, LockRuntime};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::handoff::Record;

/// How long one acquire may wait before it counts as a timeout. Generous:
/// a cancelled rslock acquire can leave its key behind for a whole TTL.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);
/// rslock's lease (it has no watchdog; the body is tiny).
const RSLOCK_TTL: Duration = Duration::from_secs(10);
/// Upper bound on acquisitions per task, whatever the duration.
const MAX_PER_TASK: usize = 1_000_000;
/// The contended key, under the run's prefix.
pub const KEY: &str = "contended";
/// The counter on the data server, under the run's prefix.
pub const COUNTER: &str = "counter";

/// Which lock library a worker uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// lock-runtime.
    Ours,
    /// lock-runtime in fair mode (Redis-side queue, direct handoff).
    OursFair,
    /// rslock (Redlock, one instance).
    Rslock,
    /// lock-runtime on a Redis Cluster (the lock URL lists its nodes,
    /// separated by commas).
    OursCluster,
}

impl Library {
    /// Name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Library::Ours => "ours",
            Library::OursFair => "ours-fair",
            Library::Rslock => "rslock",
            Library::OursCluster => "ours-cluster",
        }
    }
}

/// `contend` arguments.
pub struct Args {
    library: Library,
    lock_url: String,
    data_url: String,
    prefix: String,
    tasks: u32,
    first_id: u32,
    duration: Duration,
}

impl Args {
    pub(super) fn parse(args: &[String]) -> Result<Self> {
        let [library, lock_url, data_url, prefix, tasks, first_id, millis] = args else {
            bail!("usage: --worker contend <ours|ours-fair|ours-cluster|rslock> <lock-url> <data-url> <prefix> <tasks> <first-id> <millis>");
        };
        let library = match library.as_str() {
            "ours" => Library::Ours,
            "ours-fair" => Library::OursFair,
            "rslock" => Library::Rslock,
            "ours-cluster" => Library::OursCluster,
            other => bail!("unknown library {other:?}"),
        };
        Ok(Args {
            library,
            lock_url: lock_url.clone(),
            data_url: data_url.clone(),
            prefix: prefix.clone(),
            tasks: super::parse("tasks", tasks)?,
            first_id: super::parse("first id", first_id)?,
            duration: Duration::from_millis(super::parse("millis", millis)?),
        })
    }
}

/// The client of one process: ours or the peer's.
#[derive(Clone)]
enum Client {
    Ours(LockRuntime),
    /// The manager and the key prefix (rslock takes whole keys).
    Rslock(rslock::LockManager, Arc<str>),
}

/// What one task did.
#[derive(Default)]
struct TaskResult {
    records: Vec<Record>,
    timeouts: usize,
    errors: usize,
}

pub(super) async fn run(args: Args) -> Result<()> {
    let data = redis::Client::open(args.data_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let client = match args.library {
        Library::Ours | Library::OursFair => Client::Ours(
            LockRuntime::builder()
                .redis(args.lock_url.as_str())
                .key_prefix(args.prefix.as_str())
                .fair(args.library == Library::OursFair)
                .build()
                .await?,
        ),
        Library::OursCluster => Client::Ours(
            LockRuntime::builder()
                .redis_cluster(args.lock_url.split(','))
                .key_prefix(args.prefix.as_str())
                .fair(false)
                .build()
                .await?,
        ),
        Library::Rslock => Client::Rslock(
            rslock::LockManager::new(vec![args.lock_url.as_str()]),
            args.prefix.as_str().into(),
        ),
    };
    // Warm up (connections, script cache) before the measured part.
    let warm = format!("warmup:{}", args.first_id);
    let warm_counter = format!("{}{warm}", args.prefix);
    let mut scratch = TaskResult::default();
    once(
        &client,
        &warm,
        &warm_counter,
        &mut data.clone(),
        0,
        &mut scratch,
        true,
    )
    .await?;

    super::emit(["ready".to_owned()])?;
    super::wait_for_go().await?;
    let end = Instant::now() + args.duration;
    let counter: Arc<str> = format!("{}{COUNTER}", args.prefix).into();
    let mut tasks = tokio::task::JoinSet::new();
    for id in args.first_id..args.first_id + args.tasks {
        let client = client.clone();
        let mut data = data.clone();
        let counter = counter.clone();
        tasks.spawn(async move {
            let mut result = TaskResult::default();
            for _ in 0..MAX_PER_TASK {
                if Instant::now() >= end {
                    break;
                }
                once(&client, KEY, &counter, &mut data, id, &mut result, false).await?;
            }
            anyhow::Ok(result)
        });
    }
    let mut lines = Vec::new();
    let (mut timeouts, mut errors) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let result = done??;
        timeouts += result.timeouts;
        errors += result.errors;
        lines.extend(result.records.iter().map(Record::to_line));
    }
    lines.push(format!("timeouts {timeouts}"));
    lines.push(format!("errors {errors}"));
    lines.push("done".to_owned());
    super::emit(lines)
}

/// One acquisition of `key` with the GET/SET body on `counter`; records it
/// unless `warmup` (which also turns every error into a failure).
async fn once(
    client: &Client,
    key: &str,
    counter: &str,
    data: &mut MultiplexedConnection,
    worker: u32,
    result: &mut TaskResult,
    warmup: bool,
) -> Result<()> {
    let requested = now_us();
    let body = |data: &mut MultiplexedConnection| {
        let mut data = data.clone();
        async move {
            let acquired = now_us();
            let value: Option<u64> = data.get(counter).await?;
            let () = data.set(counter, value.unwrap_or(0) + 1).await?;
            anyhow::Ok((acquired, now_us()))
        }
    };
    let outcome = match client {
        Client::Ours(runtime) => with_lock(runtime.lock(key).wait(WAIT_LIMIT), body(data)).await,
        Client::Rslock(manager, prefix) => {
            let full = format!("{prefix}{key}");
            match tokio::time::timeout(WAIT_LIMIT, manager.acquire(full.as_bytes(), RSLOCK_TTL))
                .await
            {
                Err(_) => Err(LockError::Timeout {
                    key: full,
                    waited: WAIT_LIMIT,
                }
                .into()),
                Ok(Err(e)) => Err(anyhow::Error::new(e)),
                Ok(Ok(guard)) => {
                    let outcome = body(data).await;
                    guard.release().await;
                    outcome
                }
            }
        }
    };
    match outcome {
        Ok((acquired, released)) if !warmup => result.records.push(Record {
            worker,
            requested,
            acquired,
            released,
        }),
        Ok(_) => {}
        Err(e) if warmup => return Err(e),
        Err(e) => match e.downcast_ref::<LockError>() {
            Some(LockError::Timeout { .. }) => result.timeouts += 1,
            _ => {
                eprintln!("lock-bench worker {worker}: {e:#}");
                result.errors += 1;
            }
        },
    }
    Ok(())
}

/// Microseconds since the Unix epoch on the system clock. Unlike `Instant`,
/// it is comparable between processes of one machine, which is what the
/// cross-process handoff measurement needs.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
