//! Servers of a test's own, on any backend of the list: for a behaviour that
//! freezes every server of its backend. The shared servers of `lib.rs` serve
//! the other tests of the binary at the same time, and must keep answering.

use lock_runtime::{LockRuntime, LockRuntimeBuilder};
use lock_testkit::{
    EtcdCluster, RedisCluster, RedisServer, SentinelSet, ZooKeeperEnsemble, ZooKeeperServer,
};

use crate::Kind;

/// A deployment of one backend that a single test owns (gone with it).
pub enum OwnServers {
    /// One `redis-server`.
    Redis(RedisServer),
    /// A Redis Cluster of three masters.
    Cluster(RedisCluster),
    /// A primary, one replica and three sentinels.
    Sentinel(SentinelSet),
    /// Three independent masters.
    Redlock(Vec<RedisServer>),
    /// etcd, one member or three.
    Etcd(EtcdCluster),
    /// A standalone ZooKeeper server.
    Zookeeper(ZooKeeperServer),
    /// A ZooKeeper ensemble of three.
    Zookeeper3(ZooKeeperEnsemble),
}

impl Kind {
    /// Servers of this backend of the test's own, started now (`None` for
    /// the embedded store, which has none).
    pub fn own_servers(self) -> Option<OwnServers> {
        Some(match self {
            Kind::Memory => return None,
            Kind::Redis => OwnServers::Redis(RedisServer::start()),
            Kind::Cluster => OwnServers::Cluster(RedisCluster::start(3)),
            Kind::Sentinel => OwnServers::Sentinel(SentinelSet::start(1)),
            Kind::Redlock => OwnServers::Redlock((0..3).map(|_| RedisServer::start()).collect()),
            Kind::Etcd => OwnServers::Etcd(EtcdCluster::start(1)),
            Kind::Etcd3 => OwnServers::Etcd(EtcdCluster::start(3)),
            Kind::Zookeeper => OwnServers::Zookeeper(ZooKeeperServer::start()),
            Kind::Zookeeper3 => OwnServers::Zookeeper3(ZooKeeperEnsemble::start()),
        })
    }
}

impl OwnServers {
    /// A runtime builder on these servers with this prefix (set as
    /// [`Kind::builder`] sets it).
    pub fn builder(&self, prefix: &str) -> LockRuntimeBuilder {
        let builder = match self {
            OwnServers::Redis(server) => LockRuntime::builder().redis(server.url()),
            OwnServers::Cluster(cluster) => LockRuntime::builder().redis_cluster(cluster.urls()),
            OwnServers::Sentinel(set) => LockRuntime::builder()
                .redis_sentinel(set.sentinel_urls(), lock_testkit::sentinel::SERVICE),
            OwnServers::Redlock(fleet) => LockRuntime::builder()
                .redlock(fleet.iter().map(RedisServer::url))
                .fair(false),
            OwnServers::Etcd(cluster) => LockRuntime::builder().etcd(cluster.endpoints()),
            OwnServers::Zookeeper(server) => {
                return LockRuntime::builder()
                    .zookeeper(server.connect_string())
                    .key_prefix(format!("/{prefix}/"))
            }
            OwnServers::Zookeeper3(ensemble) => {
                return LockRuntime::builder()
                    .zookeeper(ensemble.connect_string())
                    .key_prefix(format!("/{prefix}/"))
            }
        };
        builder.key_prefix(prefix)
    }

    /// Freezes (SIGSTOP) every server that stores locks: none answers, and
    /// none can take over (Sentinel's replica is frozen with its primary).
    pub fn freeze(&self) {
        self.each_data_server(true);
    }

    /// Thaws (SIGCONT) what [`freeze`](Self::freeze) froze.
    pub fn thaw(&self) {
        self.each_data_server(false);
    }

    fn each_data_server(&self, freeze: bool) {
        let redis = |server: &RedisServer| {
            if freeze {
                server.freeze();
            } else {
                server.thaw();
            }
        };
        match self {
            OwnServers::Redis(server) => redis(server),
            OwnServers::Cluster(cluster) => (0..3).for_each(|n| redis(cluster.node(n))),
            OwnServers::Sentinel(set) => {
                redis(set.first_primary());
                set.replicas().iter().for_each(redis);
            }
            OwnServers::Redlock(fleet) => fleet.iter().for_each(redis),
            OwnServers::Etcd(cluster) => (0..cluster.size()).for_each(|n| {
                if freeze {
                    cluster.freeze(n);
                } else {
                    cluster.thaw(n);
                }
            }),
            OwnServers::Zookeeper(server) if freeze => server.freeze(),
            OwnServers::Zookeeper(server) => server.thaw(),
            OwnServers::Zookeeper3(ensemble) => (0..ensemble.size()).for_each(|i| {
                if freeze {
                    ensemble.freeze(i);
                } else {
                    ensemble.thaw(i);
                }
            }),
        }
    }
}
