//! The contention worker (S3, S8, S9): a few tasks of one process taking
//! locks in turn.
//!
//! Each task loops: choose the key (always the same one, or a Zipf draw
//! from the task's seeded generator: [`crate::keys`]), note the time, take
//! the lock, run a tiny body (GET and SET of the key's counter on the *data*
//! server, so the lock server's command counts show only lock traffic),
//! release, until the run's time is up. The same loop runs on our library
//! (`with_lock`, the declarative path) in each of its modes, or on rslock
//! (`acquire` with its default retry settings, then `release`), or with no
//! lock at all ([`Library::Serial`], the limit): the key's turn is then an
//! in-process token, so one process runs the tasks of every process.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use lock_runtime::{
    with_lock, Cohort, LockError, LockRuntime, LockRuntimeBuilder, DEFAULT_COHORT, DEFAULT_FAIR,
};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::time::Instant;

use super::tasks::{self, cpu_seconds, now_us};
use crate::handoff::Record;
use crate::keys::KeyChoice;

/// How long one acquire may wait before it counts as a timeout. Generous:
/// a cancelled rslock acquire can leave its key behind for a whole TTL.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);
/// rslock's lease (it has no watchdog; the body is tiny).
const RSLOCK_TTL: Duration = Duration::from_secs(10);
/// Upper bound on acquisitions per task, whatever the duration.
const MAX_PER_TASK: usize = 1_000_000;

/// Which lock library a worker uses, and in which mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// lock-runtime, plain mode, cohorting off (every release goes to Redis).
    Ours,
    /// lock-runtime in fair mode (Redis-side queue, direct handoff),
    /// cohorting off.
    OursFair,
    /// lock-runtime, plain mode, cohorting on ([`DEFAULT_COHORT`]).
    OursCohort,
    /// lock-runtime, fair mode, cohorting on ([`DEFAULT_COHORT`]).
    OursFairCohort,
    /// lock-runtime as `LockRuntime::builder()` configures it by default.
    OursDefault,
    /// rslock (Redlock, one instance).
    Rslock,
    /// lock-runtime on a Redis Cluster (the lock URL lists its nodes,
    /// separated by commas), plain mode, cohorting off: S3's `Ours` there.
    OursCluster,
    /// lock-runtime on etcd (the lock URL lists its endpoints, separated
    /// by commas), as the builder configures it (always fair there).
    OursEtcd,
    /// lock-runtime on ZooKeeper (the lock URL is the connect string), as
    /// the builder configures it (always fair there: the recipe's queue).
    OursZooKeeper,
    /// Apache Curator's `InterProcessMutex` on ZooKeeper: the Java loop of
    /// `bench/java/CuratorLoop.java`, never this binary's worker.
    Curator,
    /// No lock: the limit. The bodies of one key run one at a time, each
    /// task waiting its turn on an in-process FIFO token of the key
    /// (`tokio::sync::Mutex`), which costs a task wake-up and no round
    /// trip. One process runs every worker task of the shape, on as many
    /// data connections as the shape has processes.
    Serial,
}

impl Library {
    /// Every variant, for parsing.
    const ALL: [Library; 11] = [
        Library::Ours,
        Library::OursFair,
        Library::OursCohort,
        Library::OursFairCohort,
        Library::OursDefault,
        Library::Rslock,
        Library::OursCluster,
        Library::OursEtcd,
        Library::OursZooKeeper,
        Library::Curator,
        Library::Serial,
    ];

    /// Name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Library::Ours => "ours",
            Library::OursFair => "ours-fair",
            Library::OursCohort => "ours-cohort",
            Library::OursFairCohort => "ours-fair-cohort",
            Library::OursDefault => "ours-default",
            Library::Rslock => "rslock",
            Library::OursCluster => "ours-cluster",
            Library::OursEtcd => "ours-etcd",
            Library::OursZooKeeper => "ours-zookeeper",
            Library::Curator => "curator",
            Library::Serial => "serial",
        }
    }

    /// Whether this is lock-runtime (in any mode) rather than a peer or
    /// the lock-free limit.
    pub fn is_ours(self) -> bool {
        !matches!(self, Library::Rslock | Library::Curator | Library::Serial)
    }

    /// Whether its locks live on ZooKeeper.
    pub fn on_zookeeper(self) -> bool {
        matches!(self, Library::OursZooKeeper | Library::Curator)
    }

    /// The key prefix of a lock-runtime on ZooKeeper whose keys are named
    /// under `prefix` (a ZooKeeper lock path starts with `/`); Curator is
    /// given the same paths.
    pub fn zookeeper_prefix(prefix: &str) -> String {
        format!("/bench/{prefix}")
    }

    /// The explicit mode that `LockRuntime::builder()` gives by default on
    /// one Redis server: cohorting as [`DEFAULT_COHORT`] says, fair as
    /// `LOCK_FAIR` says (`1` fair, `0` plain; the builder reads it), else
    /// [`DEFAULT_FAIR`].
    pub fn default_mode() -> Library {
        match (default_fair(), DEFAULT_COHORT.is_on()) {
            (false, false) => Library::Ours,
            (true, false) => Library::OursFair,
            (false, true) => Library::OursCohort,
            (true, true) => Library::OursFairCohort,
        }
    }

    /// `builder` set to this library's mode (the default builder is left
    /// as it is for [`Library::OursDefault`]).
    fn configure(self, builder: LockRuntimeBuilder) -> LockRuntimeBuilder {
        let cohort_on = cohort_tried().unwrap_or(DEFAULT_COHORT);
        let (fair, cohort) = match self {
            Library::Ours | Library::OursCluster => (false, Cohort::OFF),
            Library::OursFair => (true, Cohort::OFF),
            Library::OursCohort => (false, cohort_on),
            Library::OursFairCohort => (true, cohort_on),
            Library::OursDefault => {
                return match cohort_tried() {
                    Some(cohort) => builder.cohort(cohort.handoffs, cohort.budget),
                    None => builder,
                };
            }
            Library::Rslock
            | Library::OursEtcd
            | Library::OursZooKeeper
            | Library::Curator
            | Library::Serial => return builder,
        };
        builder.fair(fair).cohort(cohort.handoffs, cohort.budget)
    }
}

/// Whether `LockRuntime::builder()` makes locks on one Redis server fair
/// by default: as `LOCK_FAIR` says (`1` fair, `0` plain; the builder reads
/// it), else [`DEFAULT_FAIR`].
pub fn default_fair() -> bool {
    match std::env::var("LOCK_FAIR").as_deref().map(str::trim) {
        Ok("1") => true,
        Ok("0") => false,
        _ => DEFAULT_FAIR,
    }
}

/// The cohort to try instead of [`DEFAULT_COHORT`] in the rows that
/// cohort (and in the default builder's): `LOCK_BENCH_COHORT=<handoffs>`,
/// with the default's time budget. For tuning the default; unset in the
/// figures BENCHMARKS.md reports unless they say otherwise.
fn cohort_tried() -> Option<Cohort> {
    let handoffs = std::env::var("LOCK_BENCH_COHORT")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Cohort {
        handoffs,
        budget: DEFAULT_COHORT.budget,
    })
}

/// `contend` arguments.
pub struct Args {
    library: Library,
    run: super::Run,
    keys: KeyChoice,
    connections: u32,
}

impl Args {
    pub(super) fn parse(args: &[String]) -> Result<Self> {
        let [library, lock_url, data_url, prefix, tasks, first_id, millis, keys, connections] =
            args
        else {
            bail!("usage: --worker contend <library> <lock-url> <data-url> <prefix> <tasks> <first-id> <millis> <one|zipf:N:S> <connections>");
        };
        Ok(Args {
            library: tasks::named(Library::ALL, Library::name, "library", library)?,
            run: super::Run::parse([lock_url, data_url, prefix, tasks, first_id, millis])?,
            keys: KeyChoice::parse(keys)?,
            connections: super::parse("connections", connections)?,
        })
    }
}

/// The client of one process: ours or the peer's.
#[derive(Clone)]
enum Client {
    Ours(LockRuntime),
    /// The manager and the key prefix (rslock takes whole keys).
    Rslock(rslock::LockManager, Arc<str>),
    /// No lock: one FIFO token per key number, taken for the body.
    Serial(Arc<Vec<tokio::sync::Mutex<()>>>),
}

/// What one task did.
type TaskResult = tasks::TaskResult<Record>;

pub(super) async fn run(args: Args) -> Result<()> {
    let data =
        tasks::data_connections(&args.run.data_url, args.connections, args.run.tasks).await?;
    let client = match args.library {
        Library::Serial => Client::Serial(Arc::new(
            (0..args.keys.keys())
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        )),
        Library::Rslock => Client::Rslock(
            rslock::LockManager::new(vec![args.run.lock_url.as_str()]),
            args.run.prefix.as_str().into(),
        ),
        Library::OursCluster => Client::Ours(
            Library::OursCluster
                .configure(LockRuntime::builder().redis_cluster(args.run.lock_url.split(',')))
                .key_prefix(args.run.prefix.as_str())
                .build()
                .await?,
        ),
        Library::OursEtcd => Client::Ours(
            LockRuntime::builder()
                .etcd(args.run.lock_url.split(','))
                .key_prefix(args.run.prefix.as_str())
                .build()
                .await?,
        ),
        Library::OursZooKeeper => Client::Ours(
            LockRuntime::builder()
                .zookeeper(args.run.lock_url.as_str())
                .key_prefix(Library::zookeeper_prefix(&args.run.prefix))
                .build()
                .await?,
        ),
        Library::Curator => {
            bail!("Curator runs as bench/java/CuratorLoop.java, not as this worker")
        }
        library => Client::Ours(
            library
                .configure(LockRuntime::builder().redis(args.run.lock_url.as_str()))
                .key_prefix(args.run.prefix.as_str())
                .build()
                .await?,
        ),
    };
    // Warm up (connections, script cache) before the measured part.
    let warm = format!("warmup:{}", args.run.first_id);
    // Not the lock's own name: with the data on the lock server it would be
    // the lock's key.
    let warm_counter = format!("{}{warm}:counter", args.run.prefix);
    let mut scratch = TaskResult::default();
    once(
        &client,
        &warm,
        &warm_counter,
        &mut data[0].clone(),
        Slot { worker: 0, key: 0 },
        &mut scratch,
        true,
    )
    .await?;

    // Every key's lock and counter name, made once, indexed by key number.
    let names: Arc<Vec<(String, String)>> = Arc::new(
        (0..args.keys.keys())
            .map(|k| (args.keys.key(k), args.keys.counter(&args.run.prefix, k)))
            .collect(),
    );
    super::emit(["ready".to_owned()])?;
    super::wait_for_go().await?;
    let passed_before = passed_locally(&client);
    let (cpu_before, switches_before) = (cpu_seconds(), context_switches());
    let end = Instant::now() + args.run.duration;
    let mut running = tokio::task::JoinSet::new();
    for id in args.run.first_id..args.run.first_id + args.run.tasks {
        let client = client.clone();
        let mut data = tasks::connection_of(&data, id - args.run.first_id, args.run.tasks);
        let names = names.clone();
        let mut picker = args.keys.picker(id);
        running.spawn(async move {
            let mut result = TaskResult::default();
            for _ in 0..MAX_PER_TASK {
                if Instant::now() >= end {
                    break;
                }
                let k = picker.next_key();
                let (key, counter) = &names[k as usize];
                let at = Slot { worker: id, key: k };
                once(&client, key, counter, &mut data, at, &mut result, false).await?;
            }
            anyhow::Ok(result)
        });
    }
    let mut lines = tasks::lines_of(running, Record::to_line).await?;
    lines.push(format!(
        "passed {}",
        passed_locally(&client).saturating_sub(passed_before)
    ));
    lines.push(tasks::cpu_line(cpu_before));
    lines.push(format!(
        "switches {}",
        context_switches().saturating_sub(switches_before)
    ));
    lines.push("done".to_owned());
    // The last calls' releases may still be behind them (a locked call
    // returns before its release is answered): shutdown sends them before
    // the process exits. An exit would leave those keys taken until their
    // lease ends, and another worker's last acquire waited for that (30 s).
    if let Client::Ours(runtime) = &client {
        runtime.shutdown().await?;
    }
    super::emit(lines)
}

/// Context switches of all this process's threads so far, voluntary (a
/// thread blocked: parked, waiting for a socket) and not (preempted), from
/// `/proc/self/task/*/status`; a thread that ended meanwhile is not counted.
fn context_switches() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Holds passed between tasks of this process without a round trip so far
/// (lock cohorting; 0 for rslock).
fn passed_locally(client: &Client) -> u64 {
    match client {
        Client::Ours(runtime) => runtime.stats().passed_locally,
        Client::Rslock(..) | Client::Serial(_) => 0,
    }
}

/// Who takes which key, as the record names them.
#[derive(Clone, Copy)]
struct Slot {
    worker: u32,
    key: u32,
}

/// One acquisition of `key` with the GET/SET body on `counter`; records it
/// under `at` unless `warmup` (which also turns every error into a failure).
async fn once(
    client: &Client,
    key: &str,
    counter: &str,
    data: &mut MultiplexedConnection,
    at: Slot,
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
                    cause: Default::default(),
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
        Client::Serial(tokens) => match tokens.get(at.key as usize) {
            Some(token) => {
                let _turn = token.lock().await;
                body(data).await
            }
            None => Err(anyhow::anyhow!("no token for key {}", at.key)),
        },
    };
    result.note(at.worker, outcome, warmup, |(acquired, released)| Record {
        worker: at.worker,
        key: at.key,
        requested,
        acquired,
        released,
    })
}
