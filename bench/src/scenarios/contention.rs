//! One contention run: workers in several processes take locks in turn
//! (S3: eight workers in two processes on one key; S8 and S9 other
//! [`Shape`]s).
//!
//! The parent re-executes this binary once per process with
//! `--worker contend`, waits for all to be `ready`, reads the lock server's
//! `INFO commandstats`, says `go`, PINGs alongside while they run, and
//! collects their records and counters. S3 (`handoff.rs`) and S4
//! (`commands.rs`) are two readings of the same runs; S8 and S9
//! (`crowd.rs`) read their own. The figures of a run, and their medians and
//! worst cases over runs, are in `figures.rs`.
//!
//! Each run puts the bodies' counters on the data server (the two-server
//! rows), or on the lock server itself ([`Placement::Shared`]: one Redis
//! for both, as most deployments run). The limit ([`Library::Serial`]) is a
//! run of the same body with no lock: one process with the shape's worker
//! tasks, on as many data connections as the shape has processes, each
//! key's bodies one at a time by an in-process token.
//!
//! On ZooKeeper (S13) the same runs are made by our worker or by Curator's
//! Java loop (`crate::curator`), which speaks the worker's lines; what S4
//! counts there is the requests the ZooKeeper server received (`mntr`),
//! not Redis commands.

use std::time::Duration;

use anyhow::{Context, Result};
use lock_testkit::{CommandStats, LineChild, RedisServer, ZooKeeperServer};
use redis::aio::MultiplexedConnection;

use super::figures::{Breakdown, Run};
use super::{commands, workers, Ctx};
use crate::config::Shape;
use crate::curator;
use crate::handoff::{Analysis, Record};
use crate::stats::Samples;
use crate::worker::{self, Library};

/// Where the bodies' data lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// On the data server, apart from the locks (the lock server's
    /// commands are lock traffic only).
    TwoServers,
    /// On the lock server: one Redis for the locks and the data.
    Shared,
}

/// PINGs (one per 5 ms) for `duration` on the connection type `library`
/// uses: the round trip as the loaded machine gives it during the run.
fn pings_during(
    ctx: &Ctx,
    library: Library,
    duration: Duration,
) -> impl std::future::Future<Output = Result<Samples>> + Send + 'static {
    let runtime = ctx.runtime.clone();
    let mut plain = ctx.plain.clone();
    async move {
        let end = tokio::time::Instant::now() + duration;
        let mut samples = Vec::new();
        while tokio::time::Instant::now() < end && samples.len() < 100_000 {
            let start = tokio::time::Instant::now();
            if library.is_ours() {
                runtime.ping().await?;
            } else {
                let _: String = redis::cmd("PING").query_async(&mut plain).await?;
            }
            samples.push(super::us(start.elapsed()));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(Samples::new(samples))
    }
}

/// The requests a ZooKeeper server has received so far (`mntr`'s
/// `zk_packets_received`: every request of every client, connects and
/// session pings included; four-letter commands are not counted).
pub(super) async fn requests_received(server: &ZooKeeperServer) -> Result<u64> {
    let port = server.port();
    let reply =
        tokio::task::spawn_blocking(move || lock_testkit::zookeeper::four_letter(port, "mntr"))
            .await??;
    reply
        .lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("no zk_packets_received in mntr: {reply:?}"))
}

/// One contention run of `library` in `shape`, the data on the data
/// server; `tag` and `run` name its keys apart from every other run's.
pub async fn contend(
    ctx: &Ctx,
    library: Library,
    shape: Shape,
    tag: &str,
    run: usize,
) -> Result<Run> {
    contend_on(ctx, library, shape, Placement::TwoServers, tag, run).await
}

/// One contention run of `library` in `shape`, the data placed as
/// `placement` says; `tag` and `run` name its keys apart from every other
/// run's. [`Library::Serial`] runs the limit: one process with all the
/// shape's workers (see the module docs).
pub async fn contend_on(
    ctx: &Ctx,
    library: Library,
    shape: Shape,
    placement: Placement,
    tag: &str,
    run: usize,
) -> Result<Run> {
    let duration = shape.duration;
    let prefix = format!("{tag}:{run}:{}:", library.name());
    let data_server = match placement {
        Placement::TwoServers => &ctx.data_server,
        Placement::Shared => &ctx.lock_server,
    };
    let mut workers = start(ctx, library, shape, data_server, &prefix)?;
    workers::ready(&mut workers).await?;
    let mut info = ctx.plain.clone();
    let mut data_info = redis::Client::open(ctx.data_server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let before = command_stats(&mut info).await?;
    let redis_cpu_before = servers_cpu(&mut info, &mut data_info).await?;
    let zookeeper_before = if library.on_zookeeper() {
        Some(requests_received(ctx.zookeeper()?).await?)
    } else {
        None
    };
    workers::go(&mut workers)?;
    let pinger = tokio::spawn(pings_during(ctx, library, duration));
    let lines = workers::collect(&mut workers, duration).await?;
    let mut delta = command_stats(&mut info).await?.since(&before);
    let redis_cpu_after = servers_cpu(&mut info, &mut data_info).await?;
    let zookeeper_requests = match zookeeper_before {
        Some(before) => Some(
            requests_received(ctx.zookeeper()?)
                .await?
                .saturating_sub(before),
        ),
        None => None,
    };
    drop(workers);
    let loaded_pings = pinger.await??;

    let mut records = Vec::new();
    let counts = workers::tally(&lines, &COUNTED, |line| {
        Ok(match Record::parse(line) {
            Some(record) => {
                records.push(record?);
                true
            }
            None => false,
        })
    })?;
    let breakdown = Breakdown::of(&records, shape.tasks);
    let analysis = Analysis::of(records, 0..shape.workers());
    if placement == Placement::Shared {
        // The bodies' GET and SET went to the lock server too: one of each
        // per recorded body, taken out so the rest is lock traffic (a body
        // that failed is not recorded; the exactness rows count it).
        let bodies = analysis.total as u64;
        for name in ["get", "set"] {
            if let Some(c) = delta.0.get_mut(name) {
                c.calls = c.calls.saturating_sub(bodies);
            }
        }
    }
    let counters = read_counters(data_server, shape, &prefix).await?;
    let counter_error = counters
        .iter()
        .enumerate()
        .map(|(k, &c)| {
            let taken = u32::try_from(k)
                .ok()
                .and_then(|k| analysis.per_key.get(&k))
                .map_or(0, |&n| n as u64);
            c.abs_diff(taken)
        })
        .sum();
    let commands = zookeeper_requests
        .unwrap_or_else(|| commands::sent(library, &delta, loaded_pings.len() as u64));
    Ok(Run {
        shape,
        loaded_ping: loaded_pings.p50(),
        commands_per_acquisition: commands as f64 / analysis.total as f64,
        failed_attempts: commands::failed_attempts(library, &delta, analysis.total) as f64
            / analysis.total as f64,
        analysis,
        counter: counters.iter().sum(),
        counter_error,
        timeouts: counts.get("timeouts"),
        errors: counts.get("errors"),
        passed_locally: counts.get("passed"),
        worker_cpu_us: counts.get("cpu_us"),
        switches: counts.get("switches"),
        redis_cpu_us: (redis_cpu_after - redis_cpu_before).max(0.0) * 1e6,
        delta,
        breakdown,
    })
}

/// The count lines a contention worker prints after its records.
const COUNTED: [&str; 5] = ["timeouts", "errors", "passed", "cpu_us", "switches"];

/// Starts the worker processes of a run of `library` in `shape`, their
/// keys named under `prefix`, their bodies' counters on `data_server`.
fn start(
    ctx: &Ctx,
    library: Library,
    shape: Shape,
    data_server: &RedisServer,
    prefix: &str,
) -> Result<Vec<LineChild>> {
    let lock_url = match library {
        Library::OursCluster => ctx.cluster()?.urls().join(","),
        Library::OursEtcd => ctx.etcd()?.endpoints().join(","),
        Library::OursZooKeeper | Library::Curator => ctx.zookeeper()?.connect_string(),
        _ => ctx.lock_server.url(),
    };
    let (processes, tasks, connections) = workers::layout(shape, library == Library::Serial);
    let mut started = Vec::new();
    for p in 0..processes {
        if library == Library::Curator {
            let data = format!("127.0.0.1:{}", data_server.port());
            let (out, first) = (&ctx.config.out_dir, p * shape.tasks);
            started.push(curator::contend(
                out, &lock_url, prefix, &data, shape, first,
            )?);
            continue;
        }
        let args = [
            "contend".to_owned(),
            library.name().to_owned(),
            lock_url.clone(),
            data_server.url(),
            prefix.to_owned(),
            tasks.to_string(),
            (p * tasks).to_string(),
            shape.duration.as_millis().to_string(),
            shape.keys.to_arg(),
            connections.to_string(),
        ];
        started.push(worker::start(&ctx.config.worker_exe, &args)?);
    }
    Ok(started)
}

/// Reads of a server's `INFO` around a run are tried this many times: on
/// this shared 2-core machine a reply sometimes misses the client's
/// response timeout (a full run once failed so), and the reads are taken
/// outside the measured window, so a later read is as good.
const INFO_TRIES: usize = 3;

/// The lock server's `INFO commandstats` (see [`INFO_TRIES`]).
pub(super) async fn command_stats(conn: &mut MultiplexedConnection) -> Result<CommandStats> {
    let mut tries = 0;
    loop {
        tries += 1;
        match CommandStats::read(conn).await {
            Err(e) if tries < INFO_TRIES => {
                eprintln!("lock-bench: INFO commandstats: {e:#}, again")
            }
            read => return read,
        }
    }
}

/// `INFO cpu` of a server (see [`INFO_TRIES`]).
async fn info_cpu(conn: &mut MultiplexedConnection) -> Result<String> {
    let mut tries = 0;
    loop {
        tries += 1;
        match redis::cmd("INFO").arg("cpu").query_async(conn).await {
            Err(e) if tries < INFO_TRIES => eprintln!("lock-bench: INFO cpu: {e}, again"),
            read => return Ok(read?),
        }
    }
}

/// CPU seconds the lock and the data server have used so far.
pub(super) async fn servers_cpu(
    lock: &mut MultiplexedConnection,
    data: &mut MultiplexedConnection,
) -> Result<f64> {
    Ok(redis_cpu(lock).await? + redis_cpu(data).await?)
}

/// CPU seconds a Redis server has used so far (`INFO cpu`: its
/// `used_cpu_sys` + `used_cpu_user`, all its threads).
pub(super) async fn redis_cpu(conn: &mut MultiplexedConnection) -> Result<f64> {
    let info = info_cpu(conn).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .with_context(|| format!("no {name} in INFO cpu: {info:?}"))
    };
    Ok(field("used_cpu_sys:")? + field("used_cpu_user:")?)
}

/// Slice `slice` of `slices` of a repetition's limit: [`Library::Serial`]
/// for `1/slices` of `shape`'s time, its keys named apart from the other
/// slices'. A repetition runs one slice before each contender and pools
/// them ([`Run::pool`]), so that the limit is measured over the same
/// stretch of time as the contenders, for as long as one of them, and a
/// change in the machine's load during the repetition weighs on both.
pub async fn limit_slice(
    ctx: &Ctx,
    (shape, placement): (Shape, Placement),
    tag: &str,
    run: usize,
    (slice, slices): (usize, u32),
) -> Result<Run> {
    let shape = Shape {
        duration: shape.duration / slices.max(1),
        ..shape
    };
    let tag = format!("{tag}-limit{slice}");
    contend_on(ctx, Library::Serial, shape, placement, &tag, run).await
}

/// Every key's counter on `server` (0 for a key never taken), in key order.
async fn read_counters(server: &RedisServer, shape: Shape, prefix: &str) -> Result<Vec<u64>> {
    let mut data = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let names: Vec<String> = (0..shape.keys.keys())
        .map(|k| shape.keys.counter(prefix, k))
        .collect();
    let values: Vec<Option<u64>> = redis::cmd("MGET")
        .arg(&names)
        .query_async(&mut data)
        .await?;
    Ok(values.into_iter().map(Option::unwrap_or_default).collect())
}
