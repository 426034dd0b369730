//! S13: S1, S3/S4 and S5 on ZooKeeper (one standalone server of
//! lock-testkit), beside Redis in the same run, against ZooKeeper's own
//! round trip, with Apache Curator's `InterProcessMutex` (the lock the JVM
//! services around ZooKeeper take) as the peer.
//!
//! - **S1**: an uncontended lock + unlock is two round trips on ZooKeeper
//!   (the create of our node, pipelined with the listing of its siblings;
//!   then the delete), so it is compared with two sequential `exists` on
//!   the runtime's own session (`LockRuntime::ping` on ZooKeeper), and with
//!   a create + delete of an ephemeral node on a plain `zookeeper-client`
//!   (the two writes any lock on ZooKeeper makes). Curator's acquire +
//!   release is compared with two `checkExists` on its own client, in a JVM
//!   warmed up first (its recipe sends three requests one after the other:
//!   create, list, delete).
//! - **S3/S4**: eight workers in two processes on one key (S3's worker and
//!   body), ours, then Curator's Java loop, then Redis with the default
//!   builder, once per run. Wait p99 is compared with ten ZooKeeper round
//!   trips, as S12 does on etcd; S4 is the requests the server received
//!   per acquisition (`mntr`'s `zk_packets_received`, session pings of the
//!   few idle clients included).
//! - **S5**: 64 tasks over 10,000 keys for S5's time, against the recipe's
//!   requests sent with no library around them (create + list pipelined,
//!   the lock path made on `NoNode`, delete: what our backend sends) on one
//!   plain client at the same concurrency, and against Curator with 64
//!   threads.
//!
//! The server is lock-testkit's: a JVM with a small heap and the C1
//! compiler only (quick to start), a 200 ms tick, the data directory in
//! memory (`/dev/shm`, so a write's fsync costs nothing). A production
//! server writes its log to a disk and waits for its fsync on every write.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use lock_runtime::{with_lock, LockError, LockRuntime};
use lock_testkit::ZooKeeperServer;
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode};

use super::baseline::{runtime_pings, timed};
use super::contention::{self, median, worst, Run};
use super::many_keys::{KEYS, TASKS};
use super::{Ctx, Output};
use crate::curator;
use crate::keys::Rng;
use crate::report::{Row, Target};
use crate::stats::{median_of, Samples};
use crate::worker::Library;

/// Operations per kind in one block.
const BLOCK: usize = 100;
/// Unmeasured operations per kind before each run.
const WARMUP: usize = 50;
/// Unmeasured Curator pairs before its S1 (the JIT compiles the hot paths).
const CURATOR_WARMUP: usize = 200;
/// Upper bound on S5 operations per task, whatever the duration.
const MAX_PER_TASK: u64 = 10_000_000;
/// The key prefix of this scenario's runtime (a ZooKeeper path).
const PREFIX: &str = "/bench/";

/// The requests the server has received so far (`mntr`'s
/// `zk_packets_received`: every request of every client, connects and
/// session pings included; four-letter commands are not counted).
pub async fn requests_received(server: &ZooKeeperServer) -> Result<u64> {
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

/// The figures of one run's S1 and S5 (µs, and operations per second).
#[derive(Default)]
struct Uncontended {
    lock_p50: f64,
    lock_p99: f64,
    rtt2_p50: f64,
    rtt2_p99: f64,
    rtt_p50: f64,
    writes_p50: f64,
    curator_p50: f64,
    curator_p99: f64,
    curator_rtt2_p50: f64,
    acquire_p50: f64,
    release_p50: f64,
    s5_ours: f64,
    s5_raw: f64,
    s5_raw_busy: u64,
    s5_curator: f64,
    s5_curator_errors: u64,
}

impl Uncontended {
    fn to_json(&self) -> serde_json::Value {
        json!({
            "s1_p50_us": self.lock_p50, "s1_p99_us": self.lock_p99,
            "two_exists_p50_us": self.rtt2_p50, "two_exists_p99_us": self.rtt2_p99,
            "exists_p50_us": self.rtt_p50, "create_delete_p50_us": self.writes_p50,
            "curator_s1_p50_us": self.curator_p50, "curator_s1_p99_us": self.curator_p99,
            "curator_two_exists_p50_us": self.curator_rtt2_p50,
            "acquire_p50_us": self.acquire_p50, "release_p50_us": self.release_p50,
            "s5_ours_ops_per_s": self.s5_ours, "s5_raw_ops_per_s": self.s5_raw,
            "s5_raw_busy": self.s5_raw_busy, "s5_curator_ops_per_s": self.s5_curator,
            "s5_curator_errors": self.s5_curator_errors,
        })
    }
}

/// Lock + unlock of `key` on `runtime`, `n` times.
async fn lock_unlock(runtime: &LockRuntime, key: &str, n: usize) -> Result<Samples> {
    timed(n, || async {
        with_lock(runtime.lock(key), async { Ok::<_, LockError>(()) }).await?;
        anyhow::Ok(())
    })
    .await
}

/// `acquire()` and `release()` of `key` timed apart, `n` times each (where
/// S1's time goes).
async fn acquire_release(runtime: &LockRuntime, key: &str, n: usize) -> Result<(f64, f64)> {
    let (mut acquires, mut releases) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let start = Instant::now();
        let guard = runtime.lock(key).acquire().await?;
        let acquired = Instant::now();
        guard.release().await?;
        acquires.push(super::us(acquired - start));
        releases.push(super::us(acquired.elapsed()));
    }
    Ok((Samples::new(acquires).p50(), Samples::new(releases).p50()))
}

/// A create and a delete of the ephemeral node `path` (the two writes any
/// lock on ZooKeeper makes), `n` times.
async fn create_delete(client: &Client, path: &str, n: usize) -> Result<Samples> {
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    timed(n, || async {
        client.create(path, &[], &ephemeral).await?;
        client.delete(path, None).await?;
        anyhow::Ok(())
    })
    .await
}

/// S1 of one run: ours, the round trips and the writes in interleaved
/// blocks, then Curator's in its own process.
async fn s1(ctx: &Ctx, runtime: &LockRuntime, plain: &Client, run: usize) -> Result<Uncontended> {
    let blocks = ctx.scale().s13_ops.div_ceil(BLOCK).max(1);
    let key = format!("s13:{run}");
    let plain_path = format!("/s13-plain:{run}");
    lock_unlock(runtime, &key, WARMUP).await?;
    runtime_pings(runtime, WARMUP, 2).await?;
    create_delete(plain, &plain_path, WARMUP).await?;
    let (mut locked, mut two, mut one, mut writes) = (vec![], vec![], vec![], vec![]);
    for _ in 0..blocks {
        locked.extend_from_slice(lock_unlock(runtime, &key, BLOCK).await?.sorted());
        two.extend_from_slice(runtime_pings(runtime, BLOCK, 2).await?.sorted());
        one.extend_from_slice(runtime_pings(runtime, BLOCK, 1).await?.sorted());
        writes.extend_from_slice(create_delete(plain, &plain_path, BLOCK).await?.sorted());
    }
    let (locked, two) = (Samples::new(locked), Samples::new(two));
    let (acquire_p50, release_p50) = acquire_release(runtime, &key, BLOCK).await?;
    let connect = ctx.zookeeper()?.connect_string();
    let path = format!("{PREFIX}s13-curator:{run}");
    let out = &ctx.config.out_dir;
    let (curator, exists2) =
        curator::uncontended(out, &connect, &path, CURATOR_WARMUP, blocks, BLOCK).await?;
    Ok(Uncontended {
        lock_p50: locked.p50(),
        lock_p99: locked.p99(),
        rtt2_p50: two.p50(),
        rtt2_p99: two.p99(),
        rtt_p50: Samples::new(one).p50(),
        writes_p50: Samples::new(writes).p50(),
        curator_p50: curator.p50(),
        curator_p99: curator.p99(),
        curator_rtt2_p50: exists2.p50(),
        acquire_p50,
        release_p50,
        ..Uncontended::default()
    })
}

/// Our S5 on ZooKeeper: lock operations per second.
async fn s5_ours(runtime: &LockRuntime, duration: Duration, run: usize) -> Result<f64> {
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|k| format!("s13-s5:{run}:{k}")).collect());
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let (runtime, keys) = (runtime.clone(), keys.clone());
        tasks.spawn(async move {
            let mut rng = Rng::new(t + 1);
            let mut ops = 0u64;
            while ops < MAX_PER_TASK && Instant::now() < end {
                let key = &keys[(rng.next_u64() % KEYS) as usize];
                with_lock(runtime.lock(key.as_str()), async { anyhow::Ok(()) }).await?;
                ops += 1;
            }
            anyhow::Ok(ops)
        });
    }
    let mut total = 0;
    while let Some(ops) = tasks.join_next().await {
        total += ops??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// One acquire + release of the lock path `lock` by the recipe's requests
/// alone: our node `node` (a protected-mode name ending in `lock-`) created
/// and the siblings listed in one round trip (the lock path made first when
/// missing), then the node deleted. `false` when another node was first
/// (the lock was busy: the baseline does not wait).
async fn raw_pair(client: &Client, lock: &str, node: &str) -> Result<bool> {
    let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let full = format!("{lock}/{node}");
    for _attempt in 0..3 {
        let creating = client.create(&full, &[], &ephemeral);
        let listing = client.list_children(lock);
        let (created, listed) = tokio::join!(creating, listing);
        match created {
            Ok((_, sequence)) => {
                let ours = format!("{node}{sequence}");
                let sequence_of = |c: &String| c.rsplit("lock-").next().map(str::to_owned);
                let first = listed?.iter().min_by_key(|c| sequence_of(c)).cloned();
                client.delete(&format!("{lock}/{ours}"), Some(0)).await?;
                return Ok(first.as_deref() == Some(ours.as_str()));
            }
            Err(zookeeper_client::Error::NoNode) => {
                let parents = CreateMode::Container.with_acls(Acls::anyone_all());
                client.mkdir(lock, &parents).await?;
            }
            Err(error) => return Err(error.into()),
        }
    }
    anyhow::bail!("the lock path {lock} kept vanishing")
}

/// The S5 baseline: the recipe's requests on one plain client, at S5's
/// concurrency. Operations per second, and attempts that found a key busy.
async fn s5_raw(client: &Client, duration: Duration, run: usize) -> Result<(f64, u64)> {
    let locks: Arc<Vec<String>> = Arc::new(
        (0..KEYS)
            .map(|k| format!("{PREFIX}s13-raw:{run}:{k}"))
            .collect(),
    );
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let (client, locks) = (client.clone(), locks.clone());
        // Curator's protected-mode name: `_c_<uuid>-lock-`.
        let node = format!(
            "_c_{:08x}-0000-4000-8000-{t:012x}-lock-",
            std::process::id()
        );
        tasks.spawn(async move {
            let mut rng = Rng::new(TASKS + t + 1);
            let (mut ops, mut busy) = (0u64, 0u64);
            while ops < MAX_PER_TASK && Instant::now() < end {
                let lock = &locks[(rng.next_u64() % KEYS) as usize];
                if raw_pair(&client, lock, &node).await? {
                    ops += 1;
                } else {
                    busy += 1;
                }
            }
            anyhow::Ok((ops, busy))
        });
    }
    let (mut total, mut busy) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let (ops, b) = done??;
        total += ops;
        busy += b;
    }
    Ok((total as f64 / start.elapsed().as_secs_f64(), busy))
}

/// S5 of one run (ours, the raw requests, Curator), into `figures`.
async fn s5(
    ctx: &Ctx,
    (runtime, plain): (&LockRuntime, &Client),
    run: usize,
    figures: &mut Uncontended,
) -> Result<()> {
    let duration = ctx.scale().s5_duration;
    let ours = s5_ours(runtime, duration, run).await?;
    let (raw, raw_busy) = s5_raw(plain, duration, run).await?;
    let connect = ctx.zookeeper()?.connect_string();
    let prefix = format!("{PREFIX}s13-curator-s5:{run}:");
    let out = &ctx.config.out_dir;
    let (curator, errors) = curator::many(out, &connect, &prefix, (TASKS, KEYS), duration).await?;
    figures.s5_ours = ours;
    (figures.s5_raw, figures.s5_raw_busy) = (raw, raw_busy);
    (figures.s5_curator, figures.s5_curator_errors) = (curator, errors);
    Ok(())
}

/// Runs S13.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let connect = ctx.zookeeper()?.connect_string();
    let runtime = LockRuntime::builder()
        .zookeeper(connect.as_str())
        .key_prefix(PREFIX)
        .build()
        .await?;
    let plain = Client::connect(&connect)
        .await
        .context("connect a plain zookeeper-client")?;
    let shape = ctx.scale().s13;
    let (mut figures, mut ours, mut peer, mut redis) = (vec![], vec![], vec![], vec![]);
    for run in 0..ctx.runs() {
        let mut uncontended = s1(ctx, &runtime, &plain, run).await?;
        s5(ctx, (&runtime, &plain), run, &mut uncontended).await?;
        figures.push(uncontended);
        ours.push(contention::contend(ctx, Library::OursZooKeeper, shape, "s13", run).await?);
        peer.push(contention::contend(ctx, Library::Curator, shape, "s13", run).await?);
        redis.push(contention::contend(ctx, Library::OursDefault, shape, "s13", run).await?);
    }
    let f = |field: fn(&Uncontended) -> f64| median_of(&figures, field);
    let rtt_ms = f(|u| u.rtt_p50) / 1000.0;
    let mut rows = vec![
        Row::new(
            "S13",
            "S1 lock+unlock p50 on ZooKeeper (us)",
            f(|u| u.lock_p50),
        )
        .vs("2 exists, runtime session", f(|u| u.rtt2_p50))
        .target(Target::RatioAtMost(1.3)),
        Row::new(
            "S13",
            "S1 lock+unlock p99 on ZooKeeper (us)",
            f(|u| u.lock_p99),
        )
        .vs("2 exists, p99", f(|u| u.rtt2_p99)),
        Row::new("S13", "S1 on ZooKeeper (us), vs writes", f(|u| u.lock_p50))
            .vs("a create + a delete", f(|u| u.writes_p50)),
        Row::new("S13", "ZooKeeper round trip p50 (us)", f(|u| u.rtt_p50)),
        Row::new("S13", "S1 ours / Curator, p50", f(|u| u.lock_p50))
            .vs("Curator", f(|u| u.curator_p50))
            .target(Target::RatioAtMost(1.0)),
        Row::new("S13 peer", "Curator S1 p50 (us)", f(|u| u.curator_p50))
            .vs("2 checkExists, its client", f(|u| u.curator_rtt2_p50)),
        Row::new("S13 peer", "Curator S1 p99 (us)", f(|u| u.curator_p99)),
    ];
    rows.extend(s3_rows(&ours, &peer, &redis, rtt_ms));
    rows.extend([
        Row::new(
            "S13",
            "S5 lock ops/s on ZooKeeper, 64 x 10k",
            f(|u| u.s5_ours),
        )
        .vs("the recipe's requests, plain client", f(|u| u.s5_raw))
        .target(Target::RatioAtLeast(0.6)),
        Row::new(
            "S13",
            "S5 ours / Curator, 64 tasks x 10k keys",
            f(|u| u.s5_ours),
        )
        .vs("Curator, 64 threads", f(|u| u.s5_curator)),
    ]);
    let detail = json!({
        "server": "standalone, lock-testkit (C1 JIT, -Xmx128m, tick 200 ms, data in /dev/shm)",
        "runs": figures.iter().map(Uncontended::to_json).collect::<Vec<_>>(),
        "s3_zookeeper": ours.iter().map(Run::to_json).collect::<Vec<_>>(),
        "s3_curator": peer.iter().map(Run::to_json).collect::<Vec<_>>(),
        "s3_redis": redis.iter().map(Run::to_json).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows,
        detail,
        ..Output::default()
    })
}

/// The S3 and S4 rows: ours on ZooKeeper against its round trip, Curator
/// and Redis.
fn s3_rows(ours: &[Run], peer: &[Run], redis: &[Run], rtt_ms: f64) -> Vec<Row> {
    let m = median;
    let (rate, spread) = (Run::rate, Run::spread);
    let (wait_p99, wait_max) = (Run::wait_p99_ms, Run::wait_max_ms);
    let requests = |r: &Run| r.commands_per_acquisition;
    let failures = |r: &Run| r.counter_error() + r.failures();
    vec![
        Row::new("S13", "S3 acquisitions/s on ZooKeeper", m(ours, rate))
            .vs("Curator", m(peer, rate)),
        Row::new(
            "S13",
            "S3 acquisitions/s on ZooKeeper, vs Redis",
            m(ours, rate),
        )
        .vs("Redis, default builder", m(redis, rate)),
        Row::new(
            "S13",
            "S3 handoff p50 on ZooKeeper (us)",
            m(ours, Run::handoff_p50),
        )
        .vs("Curator", m(peer, Run::handoff_p50)),
        Row::new("S13", "S3 wait p99 on ZooKeeper (ms)", m(ours, wait_p99))
            .vs("10 ZooKeeper round trips", 10.0 * rtt_ms)
            .target(Target::RatioAtMost(1.0)),
        Row::new("S13", "S3 wait p99 ours / Curator (ms)", m(ours, wait_p99))
            .vs("Curator", m(peer, wait_p99)),
        Row::new("S13", "S3 wait max on ZooKeeper (ms)", m(ours, wait_max))
            .vs("Curator", m(peer, wait_max)),
        Row::new("S13", "S3 busiest / idlest on ZooKeeper", m(ours, spread))
            .vs("Curator", m(peer, spread)),
        Row::new(
            "S13",
            "S3 |counter - acq| + failures, ZooKeeper, worst",
            worst(ours, failures),
        )
        .target(Target::Exactly(0.0)),
        Row::new(
            "S13 peer",
            "S3 |counter - acq| + failures, Curator, worst",
            worst(peer, failures),
        ),
        Row::new(
            "S13",
            "S4 requests per acquisition on ZooKeeper",
            m(ours, requests),
        )
        .vs("Curator", m(peer, requests)),
    ]
}
