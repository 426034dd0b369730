//! What the builder hands a backend to start: which one, where, and how to
//! reach it (timeouts, TLS, the fence window). Read by `Backend::start` and
//! each backend's connect; decided nowhere here.

use std::time::Duration;

#[cfg(feature = "etcd")]
use super::etcd;
use super::sentinel;
#[cfg(feature = "zookeeper")]
use super::zookeeper;

/// Which backend to start, and how (what the builder decided).
#[derive(Clone)]
pub(crate) enum BackendConfig {
    /// The embedded store; tokens' counters expire `fence_window` after use.
    Memory {
        /// See [`ConnectSettings::fence_window`].
        fence_window: Duration,
    },
    /// A Redis server at a URL (which may hold a password: never shown).
    Redis(String, ConnectSettings),
    /// A Redis Cluster, given URLs of some of its nodes.
    RedisCluster(Vec<String>, ConnectSettings),
    /// Redlock over these independent Redis masters (at least three), with
    /// the name of their boot marker (`<prefix>redlock:boot`).
    Redlock(Vec<String>, String, ConnectSettings),
    /// A primary found through Redis Sentinel, followed across failovers.
    Sentinel(sentinel::SentinelConfig, ConnectSettings),
    /// An etcd cluster.
    #[cfg(feature = "etcd")]
    Etcd(etcd::EtcdConfig, ConnectSettings),
    /// A ZooKeeper ensemble (or standalone server).
    #[cfg(feature = "zookeeper")]
    Zookeeper(zookeeper::ZookeeperConfig, ConnectSettings),
}

/// How to reach a server backend, as the builder configured it (the same
/// for every networked backend: timeouts, TLS, the fence window).
#[derive(Clone, Default)]
pub(crate) struct ConnectSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    /// PEM of a private CA to trust instead of the system roots (TLS URLs).
    pub(crate) tls_root_ca: Option<Vec<u8>>,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    /// PEM certificate chain and key for mutual TLS.
    pub(crate) tls_client: Option<(Vec<u8>, Vec<u8>)>,
    /// How long a key's last token is kept after it was issued.
    pub(crate) fence_window: Duration,
    /// Tokens reserved with each acquisition for local holders (lock
    /// cohorting; 0: none).
    pub(crate) fence_reserve: u32,
}

#[cfg(test)]
impl ConnectSettings {
    /// What the backend tests connect with: patient timeouts, no TLS, no
    /// tokens reserved.
    pub(crate) fn for_tests() -> ConnectSettings {
        ConnectSettings {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(2),
            tls_root_ca: None,
            tls_client: None,
            fence_window: Duration::from_secs(60),
            fence_reserve: 0,
        }
    }
}
