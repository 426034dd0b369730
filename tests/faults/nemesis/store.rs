//! Where the workers' locks live: one Redis server, an etcd cluster of
//! three members or a ZooKeeper ensemble of three; each worker's own way to
//! it (a fault proxy per server); and, after the run, what is left of the
//! run's locks in it.

use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_testkit::{EtcdCluster, RedisServer, ZooKeeperEnsemble};
use lock_tests::FaultProxy;
use tokio::time::Instant;

use super::check::Violation;
use super::members::Cluster;
use super::Backend;
use crate::{channels, keys};

/// The servers of a run.
pub(super) enum Store {
    /// One `redis-server` that can snapshot (for the restarts from one).
    Redis(RedisServer),
    /// An etcd cluster or a ZooKeeper ensemble (each member keeps its data
    /// directory across a kill and a restart, as a machine that reboots
    /// does).
    Cluster(Cluster),
}

impl Store {
    /// Starts the servers of `backend`.
    pub(super) fn start(backend: Backend) -> Store {
        match backend {
            Backend::Redis => Store::Redis(RedisServer::start_with_snapshots()),
            Backend::Etcd => Store::Cluster(Cluster::Etcd(EtcdCluster::start(super::MEMBERS))),
            Backend::ZooKeeper => Store::Cluster(Cluster::ZooKeeper(ZooKeeperEnsemble::start())),
        }
    }

    /// The Redis server, for the faults only Redis has.
    pub(super) fn redis(&mut self) -> &mut RedisServer {
        match self {
            Store::Redis(server) => server,
            Store::Cluster(_) => panic!("a Redis-only fault on a cluster"),
        }
    }

    /// A lock runtime of the test's own, straight to the servers (no proxy)
    /// with the workers' key prefix, that only asks who holds a key
    /// (`inspect`): a fault can then wait for the moment a given worker's
    /// acquire was answered. `None` when it does not start.
    pub(super) async fn inspector(&self, prefix: &str) -> Option<LockRuntime> {
        let builder = match self {
            Store::Redis(server) => LockRuntime::builder().redis(server.url()),
            Store::Cluster(Cluster::Etcd(cluster)) => {
                LockRuntime::builder().etcd(cluster.endpoints())
            }
            Store::Cluster(Cluster::ZooKeeper(ensemble)) => {
                LockRuntime::builder().zookeeper(ensemble.connect_string())
            }
        };
        builder
            .key_prefix(prefix)
            .connect_timeout(super::TIMEOUT)
            .response_timeout(super::TIMEOUT)
            .build()
            .await
            .ok()
    }

    /// The loopback port of each server, in order.
    fn ports(&self) -> Vec<u16> {
        match self {
            Store::Redis(server) => vec![server.port()],
            Store::Cluster(cluster) => cluster.ports(),
        }
    }

    /// Waits (bounded by `limit`) until nothing of the run (its keys under
    /// `prefix`) is left on the servers; what is still there at the limit
    /// is a violation. Redis: no lock hash, queue or subscribed channel.
    /// etcd: no key under the prefix (a lock's holder and queue are keys).
    /// ZooKeeper: no ephemeral node under the prefix (a lock's holder and
    /// queue are its contenders' nodes; the lock paths are containers, which
    /// the server reaps in its own time).
    pub(super) async fn leftovers(
        &self,
        prefix: &str,
        limit: Duration,
        violations: &mut Vec<Violation>,
    ) {
        let limit_at = Instant::now() + limit;
        // Bounded by `limit_at` (and a count): leases and queue places run
        // out on their own.
        for _ in 0..1000 {
            // A read may fail while etcd or ZooKeeper elects (a short
            // election timeout on a loaded machine): read again, until the
            // limit.
            let (left, subscribed) = match self.left(prefix).await {
                Ok(found) => found,
                Err(error) if Instant::now() < limit_at => {
                    tracing::debug!(%error, "leftover check: read again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(error) => {
                    violations.push(Violation::plain(
                        "leftover check failed",
                        format!("no answer from the servers at the limit: {error}"),
                    ));
                    return;
                }
            };
            if left.is_empty() && subscribed.is_empty() {
                return;
            }
            // etcd renews every lease's TTL when a new leader takes over
            // (elections are frequent with a 100 ms election timeout on a
            // loaded machine), so a key may outlive the limit on a lease
            // nobody keeps alive: wait for those leases (up to a cap). A key
            // on no lease would never go: that is not waited for.
            let leased = match self {
                Store::Cluster(Cluster::Etcd(_)) => self.all_leased(prefix).await.unwrap_or(false),
                Store::Cluster(Cluster::ZooKeeper(_)) | Store::Redis(_) => false,
            };
            let limit_at = if leased {
                limit_at + ETCD_LEADER_EXTENSIONS
            } else {
                limit_at
            };
            if Instant::now() >= limit_at {
                let place = match self {
                    Store::Redis(_) => "Redis",
                    Store::Cluster(Cluster::Etcd(_)) => "etcd",
                    Store::Cluster(Cluster::ZooKeeper(_)) => "ZooKeeper",
                };
                if !left.is_empty() {
                    violations.push(Violation::plain(
                        "leftover keys",
                        format!(
                            "{left:?} still in {place} {} s after the workers exited",
                            limit.as_secs()
                        ),
                    ));
                }
                if !subscribed.is_empty() {
                    violations.push(Violation::plain(
                        "leftover channels",
                        format!("{subscribed:?} still subscribed after the workers exited"),
                    ));
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether every key under `prefix` in etcd is on a lease (so it goes
    /// when that lease runs out: the workers that kept leases are gone).
    async fn all_leased(&self, prefix: &str) -> Result<bool, etcd_client::Error> {
        let Store::Cluster(Cluster::Etcd(cluster)) = self else {
            return Ok(false);
        };
        let mut client = etcd_client::Client::connect(cluster.endpoints(), None).await?;
        let all = etcd_client::GetOptions::new().with_prefix();
        let found = client.get(prefix, Some(all)).await?;
        Ok(found.kvs().iter().all(|kv| kv.lease() != 0))
    }

    /// The run's keys and subscribed channels on the servers now (an etcd
    /// or ZooKeeper read may fail).
    async fn left(&self, prefix: &str) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        match self {
            Store::Redis(server) => {
                let mut con = server.connection().await;
                let left: Vec<String> = keys(&mut con, &format!("{prefix}*"))
                    .await
                    .into_iter()
                    .filter(|k| k.ends_with('}') || k.ends_with(":queue") || k.ends_with(":queued"))
                    .collect();
                Ok((left, channels(&mut con, &format!("{prefix}*")).await))
            }
            Store::Cluster(Cluster::ZooKeeper(ensemble)) => Ok((
                tokio::task::block_in_place(|| ensemble.ephemerals(prefix))?,
                Vec::new(),
            )),
            Store::Cluster(Cluster::Etcd(cluster)) => {
                let mut client = etcd_client::Client::connect(cluster.endpoints(), None).await?;
                let only_keys = etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only();
                let found = client.get(prefix, Some(only_keys)).await?;
                let left = found
                    .kvs()
                    .iter()
                    .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                    .collect();
                Ok((left, Vec::new()))
            }
        }
    }
}

/// How much longer than the limit leftover etcd keys on leases are waited
/// for: a few leader changes' worth of renewed TTLs.
const ETCD_LEADER_EXTENSIONS: Duration = Duration::from_secs(20);

/// The port of `host:port`.
pub(super) fn port_of(endpoint: &str) -> u16 {
    endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("an endpoint host:port, not {endpoint:?}"))
}

/// One worker's network: a proxy in front of each server, so that a
/// network fault hits this one process's view of all of them at once (an
/// etcd or ZooKeeper client moves to another member: a fault at one proxy
/// alone would only move its requests there).
pub(super) struct Link {
    proxies: Vec<FaultProxy>,
    backend: Backend,
}

impl Link {
    /// Proxies in front of every server of `store`.
    pub(super) async fn start(store: &Store, backend: Backend) -> Link {
        let mut proxies = Vec::new();
        for port in store.ports() {
            proxies.push(FaultProxy::start(port).await);
        }
        Link { proxies, backend }
    }

    /// The URL a worker is given: `redis://...` through the proxy, or
    /// `etcd://host:port,...` (one endpoint per member, each through its
    /// proxy), or `zookeeper://host:port,...` (likewise).
    pub(super) fn url(&self) -> String {
        let endpoints = || {
            let endpoints: Vec<String> = self
                .proxies
                .iter()
                .map(|p| format!("127.0.0.1:{}", p.port()))
                .collect();
            endpoints.join(",")
        };
        match self.backend {
            Backend::Redis => self.proxies[0].url(),
            Backend::Etcd => format!("etcd://{}", endpoints()),
            Backend::ZooKeeper => format!("zookeeper://{}", endpoints()),
        }
    }

    /// Stops forwarding (see [`FaultProxy::stall`]).
    pub(super) fn stall(&self) {
        self.proxies.iter().for_each(FaultProxy::stall);
    }

    /// Forwards again.
    pub(super) fn resume(&self) {
        self.proxies.iter().for_each(FaultProxy::resume);
    }

    /// Stalls (`true`) or resumes the way to server `n` only.
    pub(super) fn stall_member(&self, n: usize, stall: bool) {
        if stall {
            self.proxies[n].stall();
        } else {
            self.proxies[n].resume();
        }
    }

    /// Delays every chunk by `delay` (`None`: no delay).
    pub(super) fn slow(&self, delay: Option<Duration>) {
        self.proxies.iter().for_each(|p| p.slow(delay));
    }

    /// Closes every connection open now.
    pub(super) fn drop_connections(&self) {
        self.proxies.iter().for_each(FaultProxy::drop_connections);
    }

    /// Closes new connections right after accept while `true`.
    pub(super) fn refuse(&self, refuse: bool) {
        self.proxies.iter().for_each(|p| p.refuse(refuse));
    }

    /// One-shot: the connection that sends the Redis command `command`
    /// next is cut (Redis only: it names a RESP command).
    pub(super) fn drop_at_command(&self, command: &str) {
        assert_eq!(self.backend, Backend::Redis, "a Redis command on a cluster");
        self.proxies[0].drop_at_command(command);
    }

    /// When each `drop_at_command` fired.
    pub(super) fn dropped_at_command_times(&self) -> Vec<std::time::Instant> {
        self.proxies
            .iter()
            .flat_map(FaultProxy::dropped_at_command_times)
            .collect()
    }
}
