//! The scenarios of the issue, and what they share.
//!
//! Every scenario runs `config.runs` times against the same private servers
//! and reports medians over the runs. [`Ctx`] holds what they share: the lock
//! server and a second *data* server (S3's workers keep their counter there,
//! so the lock server's `INFO commandstats` counts lock traffic only), our
//! runtime, a plain redis-rs connection, and the peer's lock manager.
//!
//! Files are named by the behaviour measured; the ids of BENCHMARKS.md map
//! to them as S1 `uncontended`, S2 `reentry`, S3 `handoff`, S4 `commands`
//! (both from the runs of `contention`, read through `figures`), S5
//! `many_keys`, S6 `watchdog`, S7 `memory`, S8 and S9 `crowd` (many
//! workers, contention runs of other shapes), S10 `retention`, S11 `cluster` (S1 and S3 again on a 3-master
//! Redis Cluster), S12 `etcd` (S1 and S3 on etcd), S13 `zookeeper` (S1,
//! S3/S4 and S5 on ZooKeeper, with Curator as the peer; its S5 baseline in
//! `zookeeper_keys`), S14 `read_write` (a read-heavy key under read-write
//! locks, the exclusive lock and an in-process read-write lock), S15
//! `transfers` (two accounts a transfer under a multi-key lock, one global
//! lock, or two nested locks), S16 `flash_sale` (a stock split into
//! segments behind the permits of one lock); `measured` is the run of
//! worker processes on the lock server that S15 and S16 share;
//! `baseline` measures the round-trip limit, and `limit` holds S3's, S8's
//! and S9's contenders against their limit (the body alone, with no lock).

pub mod baseline;
pub mod cluster;
pub mod commands;
pub mod contention;
pub mod crowd;
pub mod etcd;
pub mod figures;
pub mod flash_sale;
pub mod handoff;
pub mod limit;
pub mod many_keys;
pub mod measured;
pub mod memory;
pub mod read_write;
pub mod reentry;
pub mod retention;
pub mod transfers;
pub mod uncontended;
pub mod watchdog;
pub mod workers;
pub mod zookeeper;
pub mod zookeeper_keys;

use anyhow::{Context, Result};
use lock_runtime::LockRuntime;
use lock_testkit::{EtcdCluster, RedisCluster, RedisServer, ZooKeeperServer};
use redis::aio::MultiplexedConnection;
use serde_json::Value;

use crate::config::{Config, Scale};
use crate::report::Row;
use crate::stats::Samples;
use crate::worker::Library;

/// Key prefix of the bench process's own runtime.
pub const PREFIX: &str = "bench:";

/// What all scenarios share.
pub struct Ctx {
    /// The invocation.
    pub config: Config,
    /// The server all locks live on.
    pub lock_server: RedisServer,
    /// The server the contention runs' bodies write their counters to.
    pub data_server: RedisServer,
    /// Our runtime, on the lock server.
    pub runtime: LockRuntime,
    /// A plain multiplexed connection to the lock server.
    pub plain: MultiplexedConnection,
    /// The peer's lock manager, on the lock server.
    pub peer: rslock::LockManager,
    /// A 3-master Redis Cluster, started when a scenario first asks.
    cluster: std::sync::OnceLock<RedisCluster>,
    /// One etcd member, started when a scenario first asks.
    etcd: std::sync::OnceLock<EtcdCluster>,
    /// One standalone ZooKeeper server, started when a scenario first asks.
    zookeeper: std::sync::OnceLock<ZooKeeperServer>,
}

impl Ctx {
    /// Starts both servers and connects everything.
    pub async fn start(config: Config) -> Result<Ctx> {
        let lock_server = RedisServer::try_start().context("start the lock redis-server")?;
        let data_server = RedisServer::try_start().context("start the data redis-server")?;
        let runtime = LockRuntime::builder()
            .redis(lock_server.url())
            .key_prefix(PREFIX)
            .build()
            .await?;
        let plain = redis::Client::open(lock_server.url())?
            .get_multiplexed_async_connection()
            .await?;
        let peer = rslock::LockManager::new(vec![lock_server.url()]);
        Ok(Ctx {
            config,
            lock_server,
            data_server,
            runtime,
            plain,
            peer,
            cluster: std::sync::OnceLock::new(),
            etcd: std::sync::OnceLock::new(),
            zookeeper: std::sync::OnceLock::new(),
        })
    }

    /// The bench's Redis Cluster (3 masters), started on first use.
    pub fn cluster(&self) -> Result<&RedisCluster> {
        if self.cluster.get().is_none() {
            let started = RedisCluster::try_start(3).context("start the Redis Cluster")?;
            let _ = self.cluster.set(started);
        }
        self.cluster.get().context("the Redis Cluster")
    }

    /// The one-member etcd, started on first use.
    pub fn etcd(&self) -> Result<&EtcdCluster> {
        if self.etcd.get().is_none() {
            let started = EtcdCluster::try_start(1).context("start etcd")?;
            let _ = self.etcd.set(started);
        }
        self.etcd.get().context("etcd")
    }

    /// The standalone ZooKeeper server, started on first use.
    pub fn zookeeper(&self) -> Result<&ZooKeeperServer> {
        if self.zookeeper.get().is_none() {
            let started = ZooKeeperServer::try_start().context("start ZooKeeper")?;
            let _ = self.zookeeper.set(started);
        }
        self.zookeeper.get().context("ZooKeeper")
    }

    /// Counts of this variant.
    pub fn scale(&self) -> Scale {
        self.config.scale()
    }

    /// Runs per scenario.
    pub fn runs(&self) -> usize {
        self.config.runs
    }
}

/// S3 samples of each library and mode, in the order they are drawn, µs.
pub type Curves = Vec<(Library, Samples)>;

/// One contender against its scenario's limit (the limit chart).
#[derive(Clone, Debug)]
pub struct LimitBar {
    /// Who (ours as the mode it ran in).
    pub library: Library,
    /// Its acquisitions/s over the limit's, medians over the repetitions.
    pub fraction: f64,
    /// The same in each repetition.
    pub runs: Vec<f64>,
}

/// A scenario's contenders against its limit.
#[derive(Clone, Debug)]
pub struct LimitGroup {
    /// The scenario (`S3`, `S3 shared`, ...).
    pub scenario: &'static str,
    /// Its contenders, in report order.
    pub bars: Vec<LimitBar>,
}

/// What one scenario hands to the report.
#[derive(Default)]
pub struct Output {
    /// Table rows.
    pub rows: Vec<Row>,
    /// Per-run figures and anything else worth keeping, for results.json.
    pub detail: Value,
    /// Handoff latencies of all runs (our modes, peer), for the chart.
    pub handoffs: Option<Curves>,
    /// Waits to acquire of all runs (our modes, peer), for the second chart.
    pub waits: Option<Curves>,
    /// PING p50 measured alongside, µs (a marker on the chart).
    pub ping_p50: Option<f64>,
    /// Contenders against the limit, for the limit chart.
    pub limits: Vec<LimitGroup>,
    /// Charts of the scenario's own: file name and SVG text.
    pub svgs: Vec<(&'static str, String)>,
}

/// Microseconds in a `Duration`.
pub fn us(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
