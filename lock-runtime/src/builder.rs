//! Configuring and starting a runtime: [`LockRuntimeBuilder`], and the
//! worker thread it starts.
//!
//! `build()` checks every setting (a `LockError::InvalidConfig` naming the
//! setter), then starts the runtime's thread with a small tokio runtime of
//! its own, starts the backend there (`Backend::start`: connections, scripts,
//! tasks) and the watchdog, and hands back a [`LockRuntime`] handle. When
//! the last handle is dropped the thread sends the releases still queued,
//! then stops.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::releases::PendingReleases;
use crate::backend::sentinel::{NodeAuth, SentinelConfig};
use crate::backend::{Backend, BackendConfig, ConnectSettings, Heartbeats, Wakeups};
use crate::cohort::Cohort;
use crate::error::{BackendError, LockError};
use crate::names::LockNames;
use crate::runtime::{LockRuntime, Settings, Started};
use crate::waiters::Waiters;
use crate::watchdog::{self, Watchdog};
use crate::who::Identity;

/// Default lease: how long a lock outlives a holder that stopped renewing it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Default wait of an acquire (and of a `#[distributed_lock]` fn) that sets
/// none: as long as the default lease, so that a waiter outlasts one crashed
/// holder (whose lock frees within one lease), and bounded, so that a
/// mistake that can never be granted (a task waiting for its own lock, a
/// holder stuck for good) ends in an error naming the key instead of a hang.
/// Redisson's `lock()` waits forever; lock4j gives up after 3 s, which fails
/// healthy calls behind a holder of a few seconds. Set it with
/// [`LockRuntimeBuilder::default_wait`], per lock with `wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// Which backend a builder will use.
#[derive(Clone)]
pub(crate) enum Choice {
    Memory,
    Redis(String),
    RedisCluster(Vec<String>),
    /// Redlock over these masters' URLs.
    Redlock(Vec<String>),
    /// Sentinel addresses and the service name.
    Sentinel(Vec<String>, String),
    /// etcd endpoints (without the feature `etcd`, `build` refuses it).
    Etcd(#[cfg_attr(not(feature = "etcd"), allow(dead_code))] Vec<String>),
    /// A ZooKeeper connect string (without the feature `zookeeper`,
    /// `build` refuses it).
    Zookeeper(#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))] String),
}

/// Configures and starts a [`LockRuntime`].
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::LockRuntime;
/// let runtime = LockRuntime::builder()
///     .memory()                      // or .redis("redis://127.0.0.1:6379")
///     .key_prefix("billing:")
///     .default_lease(Duration::from_secs(10))
///     .default_wait(Some(Duration::from_secs(5)))
///     .build()
///     .await?;
/// assert!(runtime.describe().starts_with("embedded (in-process) backend"));
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[must_use = "a builder does nothing until `.build().await`"]
#[derive(Clone)]
pub struct LockRuntimeBuilder {
    pub(crate) choice: Choice,
    pub(crate) prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) default_wait: Option<Duration>,
    /// `None`: [`DEFAULT_FAIR`] where the backend queues across processes.
    pub(crate) fair: Option<bool>,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) try_timeout: Duration,
    pub(crate) fence_window: Duration,
    pub(crate) tls_root_ca: Option<Vec<u8>>,
    pub(crate) tls_client: Option<(Vec<u8>, Vec<u8>)>,
    /// Sentinel: how the data nodes are reached.
    pub(crate) node_auth: NodeAuth,
    /// etcd: user and password.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) etcd_user: Option<(String, String)>,
    /// ZooKeeper: user and password for the `digest` scheme.
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    pub(crate) zookeeper_auth: Option<(String, String)>,
    /// Sentinel: `WAIT` for this many replicas, this long, after acquires.
    pub(crate) sync_replicas: Option<(u32, Duration)>,
    /// Local handoffs of a held lock between tasks of this process.
    pub(crate) cohort: Cohort,
    /// The name this runtime publishes with its identity (`who.rs`).
    pub(crate) client_name: Option<String>,
    /// Whether it publishes its identity at all.
    pub(crate) publish_identity: bool,
}

/// Whether locks are fair when neither the lock, the builder nor
/// `LOCK_FAIR` says (see [`LockRuntimeBuilder::fair`]). Redlock, which has
/// no fair mode, is plain unless asked otherwise (and then refused).
pub const DEFAULT_FAIR: bool = true;

/// `LOCK_FAIR`: `true`, `yes`, `on` or `1` fair, `false`, `no`, `off` or `0`
/// plain (in any case); unset or blank, the default (`None`). Anything else
/// is refused: a misspelt mode silently running the other one is the kind of
/// mistake nobody sees.
pub(crate) fn fair_from_env(value: Option<&str>) -> Result<Option<bool>, LockError> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(Some(true)),
        "0" | "false" | "no" | "off" => Ok(Some(false)),
        _ => Err(LockError::InvalidConfig(format!(
            "LOCK_FAIR={value:?} is neither yes nor no: use true, yes, on or 1 for fair \
             locks, false, no, off or 0 for plain ones, or leave it unset (fair)"
        ))),
    }
}

/// Default of [`LockRuntimeBuilder::cohort`].
pub const DEFAULT_COHORT: Cohort = Cohort {
    handoffs: 32,
    budget: Duration::from_millis(5),
};

/// Default bound of a single try ([`LockRuntimeBuilder::try_timeout`]).
pub const DEFAULT_TRY_TIMEOUT: Duration = Duration::from_millis(250);

/// Default of [`LockRuntimeBuilder::fence_window`]: how long a key's last
/// fencing token is kept after it was issued.
pub const DEFAULT_FENCE_WINDOW: Duration = Duration::from_secs(60);

/// Shortest and longest accepted fence window.
const FENCE_WINDOW_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(3600);

/// Shortest and longest accepted connect, response and try timeouts.
const TIMEOUT_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);

impl std::fmt::Debug for LockRuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match &self.choice {
            Choice::Memory => "memory",
            Choice::Redis(_) => "redis (URL hidden)",
            Choice::RedisCluster(_) => "redis cluster (URLs hidden)",
            Choice::Redlock(_) => "redlock (URLs hidden)",
            Choice::Sentinel(..) => "redis sentinel (URLs hidden)",
            Choice::Etcd(_) => "etcd",
            Choice::Zookeeper(_) => "zookeeper",
        };
        f.debug_struct("LockRuntimeBuilder")
            .field("backend", &backend)
            .field("prefix", &self.prefix)
            .field("default_lease", &self.default_lease)
            .field("default_wait", &self.default_wait)
            .field("fair", &self.fair)
            .finish_non_exhaustive()
    }
}

impl Default for LockRuntimeBuilder {
    fn default() -> Self {
        LockRuntimeBuilder {
            choice: Choice::Memory,
            prefix: "lock:".to_owned(),
            default_lease: DEFAULT_LEASE,
            default_wait: Some(DEFAULT_WAIT),
            fair: fair_from_env(std::env::var("LOCK_FAIR").ok().as_deref()).unwrap_or(None),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
            try_timeout: DEFAULT_TRY_TIMEOUT,
            fence_window: DEFAULT_FENCE_WINDOW,
            tls_root_ca: None,
            tls_client: None,
            node_auth: NodeAuth::default(),
            etcd_user: None,
            zookeeper_auth: None,
            sync_replicas: None,
            cohort: DEFAULT_COHORT,
            client_name: std::env::var("LOCK_CLIENT_NAME")
                .ok()
                .filter(|n| !n.trim().is_empty()),
            publish_identity: true,
        }
    }
}

impl LockRuntimeBuilder {
    /// Use the Redis server at `url` (`redis://[user[:password]@]host[:port][/db]`,
    /// or `rediss://` for TLS). Needs Redis 6 or later (RESP3).
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.choice = Choice::Redis(url.into());
        self
    }

    /// Use a Redis Cluster, given the URLs of some of its nodes
    /// (`redis://[user[:password]@]host:port`, or `rediss://` for TLS; one
    /// reachable node is enough, the client learns the others and the
    /// slots from it). Needs Redis 7 or later (sharded pub/sub). Every name
    /// of one lock shares a hash tag, so each lock lives on one node; see
    /// `docs/deploying.md`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder()
    ///     .redis_cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .build()
    ///     .await?;
    /// # drop(runtime); Ok(()) }
    /// ```
    pub fn redis_cluster<U: Into<String>>(mut self, urls: impl IntoIterator<Item = U>) -> Self {
        self.choice = Choice::RedisCluster(urls.into_iter().map(Into::into).collect());
        self
    }

    /// Use Redlock over these independent Redis masters (each
    /// `redis://…` or `rediss://…`, at least three; an odd count is best, as
    /// N and N+1 masters tolerate the same number of failures): a lock is
    /// held while a majority (N/2+1) of them hold it, so it survives the loss
    /// of a minority. Fair mode is not available on it: `build` refuses a
    /// builder whose `fair` is on (also by `LOCK_FAIR=1`). `docs/deploying.md`
    /// says what it guarantees.
    ///
    /// ```
    /// # async fn demo() {
    /// let built = lock_runtime::LockRuntime::builder()
    ///     .redlock(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])
    ///     .fair(false)
    ///     .build()
    ///     .await;
    /// assert!(built.unwrap_err().to_string().contains("at least 3 masters"));
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo());
    /// ```
    pub fn redlock<I>(mut self, urls: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.choice = Choice::Redlock(urls.into_iter().map(Into::into).collect());
        self
    }

    /// Use the primary of a Redis Sentinel service, and follow it across
    /// failovers: `sentinels` are the sentinels' addresses
    /// (`redis://[user:password@]host:port`, or `host:port`; a password in
    /// one authenticates to that sentinel), `service` the name they monitor
    /// (`sentinel monitor <service> …`). The primary and replicas are
    /// reached with [`sentinel_auth`](Self::sentinel_auth) and
    /// [`sentinel_db`](Self::sentinel_db). See `docs/deploying.md`, "Redis Sentinel".
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// let runtime = lock_runtime::LockRuntime::builder()
    ///     .redis_sentinel(["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"], "mymaster")
    ///     .sentinel_auth(None, "data-node-password")
    ///     .sync_replicas(1, Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// println!("{}", runtime.describe()); // redis sentinel service mymaster, primary at …
    /// # Ok(()) }
    /// ```
    pub fn redis_sentinel(
        mut self,
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        service: impl Into<String>,
    ) -> Self {
        let sentinels = sentinels.into_iter().map(Into::into).collect();
        self.choice = Choice::Sentinel(sentinels, service.into());
        self
    }

    /// Sentinel: the user (`None`: the default user) and password of the
    /// primary and replicas (not of the sentinels: put theirs in their URLs).
    pub fn sentinel_auth(mut self, username: Option<String>, password: impl Into<String>) -> Self {
        self.node_auth.username = username;
        self.node_auth.password = Some(password.into());
        self
    }

    /// Sentinel: the database number on the primary (default 0).
    pub fn sentinel_db(mut self, db: u16) -> Self {
        self.node_auth.db = db;
        self
    }

    /// Sentinel: after each first acquisition, `WAIT` until `replicas`
    /// replicas have the lock, at most `timeout` (1 ms to 1 h), so that a
    /// failover right after the acquire does not lose it. When fewer
    /// acknowledge it, the lock is released and the acquire fails with a
    /// [`LockError::Backend`] saying "replication sync failed" (a bounded
    /// wait retries until its deadline first). Costs a replication round
    /// trip per acquire; keep `timeout` below
    /// [`try_timeout`](Self::try_timeout), which bounds a try-once.
    pub fn sync_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.sync_replicas = Some((replicas, timeout));
        self
    }

    /// Use etcd (v3 API, 3.4 or later), given some of its members'
    /// endpoints (`host:port`, or `http://host:port`): etcd's own lock recipe,
    /// fair by construction, with the key's create revision as the fencing
    /// token; `etcdctl lock <name>` and this runtime exclude each other on
    /// the same name (with an empty [`key_prefix`](Self::key_prefix), the
    /// key is the name). Needs the feature `etcd`. See README, "etcd".
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder()
    ///     .etcd(["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"])
    ///     .build()
    ///     .await?;
    /// # drop(runtime); Ok(()) }
    /// ```
    #[cfg(feature = "etcd")]
    pub fn etcd<I>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.choice = Choice::Etcd(endpoints.into_iter().map(Into::into).collect());
        self
    }

    /// etcd: authenticate as `user` with `password` (etcd's own auth).
    #[cfg(feature = "etcd")]
    pub fn etcd_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.etcd_user = Some((user.into(), password.into()));
        self
    }

    /// Use ZooKeeper (3.5 or later), given its connect string
    /// (`host:port,host:port[/chroot]`): Apache Curator's lock recipe
    /// (`InterProcessMutex`), fair by construction, with the node's czxid as
    /// the fencing token. A lock's path is the key prefix followed by the
    /// key (`/locks/` + `order:1`; the default prefix `lock:` becomes
    /// `/locks/`), and a Java service locking that path with Curator and
    /// this runtime exclude each other. Needs the feature `zookeeper`. See
    /// README, "ZooKeeper".
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder()
    ///     .zookeeper("10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181")
    ///     .key_prefix("/locks/")
    ///     .build()
    ///     .await?;
    /// # drop(runtime); Ok(()) }
    /// ```
    #[cfg(feature = "zookeeper")]
    pub fn zookeeper(mut self, connect: impl Into<String>) -> Self {
        self.choice = Choice::Zookeeper(connect.into());
        self
    }

    /// ZooKeeper: authenticate as `user` with `password` (the `digest`
    /// scheme, what `addauth digest user:password` does), for lock paths
    /// whose ACLs ask for it.
    #[cfg(feature = "zookeeper")]
    pub fn zookeeper_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.zookeeper_auth = Some((user.into(), password.into()));
        self
    }

    /// Use the embedded in-process backend (the default): same semantics,
    /// one process. For development and for users' own tests.
    pub fn memory(mut self) -> Self {
        self.choice = Choice::Memory;
        self
    }

    /// Prefix of every lock name in the backend (default `"lock:"`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease of locks that set none (default 30 s; 10 ms to 24 h).
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = lease;
        self
    }

    /// Wait of locks that set none ([`DEFAULT_WAIT`], 30 s, unless set);
    /// `None` waits forever.
    pub fn default_wait(mut self, wait: Option<Duration>) -> Self {
        self.default_wait = wait;
        self
    }

    /// Whether locks that set nothing else are fair: first come, first
    /// served across processes, with direct handoff (see
    /// [`LockRequest::fair`](crate::LockRequest::fair) for what it costs). Every process that uses a
    /// key should agree. Default: [`DEFAULT_FAIR`] on backends that queue
    /// across processes (Redis, Cluster, Sentinel), plain on Redlock; the
    /// environment variable `LOCK_FAIR` (`true`/`yes`/`on`/`1` fair,
    /// `false`/`no`/`off`/`0` plain, any case; another value makes
    /// [`build`](Self::build) fail) sets it for a deployment, or a test run,
    /// without code changes.
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = Some(fair);
        self
    }

    /// Lock cohorting: when a task of this process waits for a lock that
    /// another of its tasks releases, pass the hold to it without a round
    /// trip, up to `handoffs` times in a row and for at most `budget` after
    /// the backend acquisition; then release to the backend so that other
    /// processes get their turn. Default [`DEFAULT_COHORT`] (32 handoffs,
    /// 5 ms); `handoffs` 0 turns it off (at most
    /// [`MAX_COHORT_HANDOFFS`](crate::MAX_COHORT_HANDOFFS)).
    ///
    /// Each local holder gets a token greater than the one before (from a
    /// block reserved with the backend acquisition), the watchdog keeps
    /// renewing, and a loss reaches whichever task holds the lock then. Only
    /// locks with a renewed lease are passed, and only to a waiter that asks
    /// for the same lease and mode. On the embedded store (no round trip to
    /// save) and on Redlock (tokens come from a majority) this does nothing.
    /// `docs/fair-mode-and-cohorting.md`.
    pub fn cohort(mut self, handoffs: u32, budget: Duration) -> Self {
        self.cohort = Cohort { handoffs, budget };
        self
    }

    /// A name for this process in what operators see: the runtime publishes
    /// it with its host, pid and start time (default: `LOCK_CLIENT_NAME`,
    /// else none), and `lockctl show`/`list` print it beside the holder id
    /// ([`LockRuntime::client_of`](crate::LockRuntime::client_of)).
    ///
    /// ```
    /// let builder = lock_runtime::LockRuntime::builder().client_name("billing-worker");
    /// # drop(builder);
    /// ```
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = Some(name.into());
        self
    }

    /// Whether this runtime publishes who it is (see
    /// [`client_name`](Self::client_name); default `true`). A tool that
    /// takes no lock, like `lockctl`, turns it off and writes nothing.
    pub fn publish_identity(mut self, publish: bool) -> Self {
        self.publish_identity = publish;
        self
    }

    /// How long a single try may take: `wait(Duration::ZERO)` and
    /// [`try_acquire`](crate::LockRequest::try_acquire), and the last try a
    /// bounded wait makes when its deadline passes while it sleeps (default
    /// 250 ms; 1 ms to 1 h). A try that gets no answer in time fails: a
    /// try-once with [`LockError::Backend`], a bounded wait with
    /// [`LockError::Timeout`]. So a bounded wait returns by its deadline plus
    /// this, whatever the network does.
    pub fn try_timeout(mut self, timeout: Duration) -> Self {
        self.try_timeout = timeout;
        self
    }

    /// How long a key's last fencing token is kept after it was issued
    /// (default 60 s; 10 ms to 1 h). A hold keeps its own token as long as
    /// it lasts.
    ///
    /// Tokens are at least the backend's clock in µs, so the stored token is
    /// needed only while the clock could still be at or below it; after the
    /// window a released key leaves nothing behind. Tokens keep growing as
    /// long as the server's clock never steps back by more than this (`docs/guarantees.md`). Shorten it only to watch keys expire in a test.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// let runtime = lock_runtime::LockRuntime::builder()
    ///     .memory()
    ///     .fence_window(Duration::from_secs(300))
    ///     .build()
    ///     .await?;
    /// # drop(runtime); Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn fence_window(mut self, window: Duration) -> Self {
        self.fence_window = window;
        self
    }

    /// How long to try to reach Redis when connecting (default 2 s; 1 ms to 1 h).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a single Redis command may take before it counts as failed
    /// (default 2 s; 1 ms to 1 h).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Trusts this CA (PEM) for `rediss://` URLs and `https://` etcd
    /// endpoints instead of the system's roots: for servers with
    /// certificates from a private CA. Needs the `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_ca = Some(pem.into());
        self
    }

    /// Presents this client certificate chain and private key (both PEM) for
    /// mutual TLS (Redis, and etcd's `--client-cert-auth`). Needs the `tls`
    /// feature.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls_client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Starts the runtime: connects to Redis and loads the scripts (failing
    /// fast when Redis is unreachable), and starts the worker thread.
    pub async fn build(self) -> Result<LockRuntime, LockError> {
        // The default mode came from `LOCK_FAIR`; a value that is neither
        // yes nor no is refused here, where an error can be returned.
        fair_from_env(std::env::var("LOCK_FAIR").ok().as_deref())?;
        if !(crate::request::MIN_LEASE..=crate::request::MAX_LEASE).contains(&self.default_lease) {
            return Err(LockError::InvalidConfig(format!(
                "default_lease {:?} is out of range: use 10ms to 24h",
                self.default_lease
            )));
        }
        for (name, timeout) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
            ("try_timeout", self.try_timeout),
        ] {
            if !TIMEOUT_RANGE.contains(&timeout) {
                return Err(LockError::InvalidConfig(format!(
                    "{name} {timeout:?} is out of range: use 1ms to 1h"
                )));
            }
        }
        if !FENCE_WINDOW_RANGE.contains(&self.fence_window) {
            return Err(LockError::InvalidConfig(format!(
                "fence_window {:?} is out of range: use 10ms to 1h",
                self.fence_window
            )));
        }
        if self.cohort.handoffs > crate::cohort::MAX_COHORT_HANDOFFS {
            return Err(LockError::InvalidConfig(format!(
                "cohort handoffs {} is out of range: use 0 (off) to {}",
                self.cohort.handoffs,
                crate::cohort::MAX_COHORT_HANDOFFS
            )));
        }
        if self.prefix.contains(['{', '}']) {
            return Err(LockError::InvalidConfig(
                "the key prefix may not contain `{` or `}` (the runtime adds the hash tag)"
                    .to_owned(),
            ));
        }
        if let Choice::Redlock(urls) = &self.choice {
            check_redlock(urls.len(), self.fair == Some(true))?;
        }
        self.check_sync_replicas()?;
        let (ready_tx, ready_rx) = oneshot::channel::<Result<Parts, LockError>>();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        // How long a stopping runtime (shutdown, or the last handle gone)
        // waits for its queued releases to be answered.
        let drain = self.response_timeout.saturating_mul(2);
        let settings = self.connect_settings();
        let config = match &self.choice {
            Choice::Memory => BackendConfig::Memory {
                fence_window: self.fence_window,
            },
            Choice::Redis(url) => BackendConfig::Redis(url.clone(), settings),
            Choice::RedisCluster(urls) => BackendConfig::RedisCluster(urls.clone(), settings),
            Choice::Redlock(urls) => BackendConfig::Redlock(
                urls.clone(),
                LockNames::redlock_boot(&self.prefix),
                settings,
            ),
            Choice::Sentinel(sentinels, service) => BackendConfig::Sentinel(
                SentinelConfig {
                    sentinels: sentinels.clone(),
                    service: service.clone(),
                    auth: self.node_auth.clone(),
                    sync: self.sync_replicas,
                },
                settings,
            ),
            #[cfg(feature = "etcd")]
            Choice::Etcd(endpoints) => BackendConfig::Etcd(
                crate::backend::etcd::EtcdConfig {
                    endpoints: endpoints.clone(),
                    user: self.etcd_user.clone(),
                    prefix: self.prefix.clone(),
                    default_lease: self.default_lease,
                },
                settings,
            ),
            #[cfg(feature = "zookeeper")]
            Choice::Zookeeper(connect) => BackendConfig::Zookeeper(
                crate::backend::zookeeper::ZookeeperConfig {
                    connect: connect.clone(),
                    auth: self.zookeeper_auth.clone(),
                    prefix: self.prefix.clone(),
                    default_lease: self.default_lease,
                },
                settings,
            ),
            #[cfg(not(feature = "zookeeper"))]
            Choice::Zookeeper(_) => {
                return Err(LockError::InvalidConfig(
                    "ZooKeeper is configured (LOCK_ZOOKEEPER or LOCK_BACKEND=zookeeper), but \
                     this build has no ZooKeeper backend: enable the feature `zookeeper` of \
                     lock-runtime"
                        .to_owned(),
                ))
            }
            #[cfg(not(feature = "etcd"))]
            Choice::Etcd(_) => {
                return Err(LockError::InvalidConfig(
                    "etcd is configured (LOCK_ETCD_ENDPOINTS or LOCK_BACKEND=etcd), but this \
                     build has no etcd backend: enable the feature `etcd` of lock-runtime"
                        .to_owned(),
                ))
            }
        };
        // Every runtime on a server publishes who it is (`who.rs`); nobody
        // can look into the embedded store.
        let publish = self.publish_identity && !matches!(self.choice, Choice::Memory);
        let identity = publish.then(|| {
            let key = LockNames::identity(&self.prefix, crate::owner::process_id());
            Identity::of_this_process(key, self.client_name.as_deref())
        });
        std::thread::Builder::new()
            .name("lock-runtime".to_owned())
            .spawn(move || worker(config, drain, identity, ready_tx, stop_rx))
            .map_err(|e| BackendError::new("cannot start the lock runtime thread", e))?;
        let parts = ready_rx
            .await
            .map_err(|_| BackendError::msg("the lock runtime thread stopped during start-up"))??;
        let started = Started {
            handle: parts.handle,
            backend: parts.backend,
            waiters: parts.waiters,
            watchdog: parts.watchdog,
            behind: parts.behind,
            stop: stop_tx,
        };
        let settings = Settings {
            prefix: self.prefix,
            default_lease: self.default_lease,
            default_wait: self.default_wait,
            // (Redlock has no fair mode: plain unless asked, and then
            // refused above.)
            default_fair: self
                .fair
                .unwrap_or(DEFAULT_FAIR && !matches!(self.choice, Choice::Redlock(_))),
            try_timeout: self.try_timeout,
            drain_limit: drain,
            cohort: self.cohort,
        };
        Ok(LockRuntime::new(started, settings))
    }
}

impl LockRuntimeBuilder {
    /// How to reach a server backend, as configured.
    fn connect_settings(&self) -> ConnectSettings {
        ConnectSettings {
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            tls_root_ca: self.tls_root_ca.clone(),
            tls_client: self.tls_client.clone(),
            fence_window: self.fence_window,
            // (Redlock derives tokens from a majority: no reserved blocks.)
            fence_reserve: if self.cohort.is_on() && !matches!(self.choice, Choice::Redlock(_)) {
                self.cohort.handoffs
            } else {
                0
            },
        }
    }

    /// `sync_replicas` is for Sentinel only, with at least one replica.
    fn check_sync_replicas(&self) -> Result<(), LockError> {
        let Some((replicas, timeout)) = self.sync_replicas else {
            return Ok(());
        };
        if !matches!(self.choice, Choice::Sentinel(..)) {
            return Err(LockError::InvalidConfig(
                "sync_replicas needs the Sentinel backend (redis_sentinel)".to_owned(),
            ));
        }
        if replicas == 0 || !TIMEOUT_RANGE.contains(&timeout) {
            return Err(LockError::InvalidConfig(format!(
                "sync_replicas({replicas}, {timeout:?}) is out of range: use at least one \
                 replica and 1ms to 1h"
            )));
        }
        Ok(())
    }
}

/// What `build` refuses of a Redlock configuration: fewer than three
/// masters (with one or two, one failure stops every lock: use
/// `.redis(url)` for one server), and fair mode. An even count is allowed,
/// with a warning.
fn check_redlock(masters: usize, fair: bool) -> Result<(), LockError> {
    use crate::backend::redlock::{FAIR_UNSUPPORTED, MIN_MASTERS};
    if masters < MIN_MASTERS {
        return Err(LockError::InvalidConfig(format!(
            "Redlock needs at least {MIN_MASTERS} masters, got {masters} (with fewer, one \
             failure stops every lock; use .redis(url) for a single server)"
        )));
    }
    if fair {
        return Err(LockError::InvalidConfig(FAIR_UNSUPPORTED.to_owned()));
    }
    if masters.is_multiple_of(2) {
        tracing::warn!(
            masters,
            "Redlock over an even number of masters tolerates no more failures than \
             one master fewer"
        );
    }
    Ok(())
}

impl LockRuntime {
    /// A builder with the defaults: embedded backend, prefix `"lock:"`, 30 s
    /// lease, 30 s wait.
    pub fn builder() -> LockRuntimeBuilder {
        LockRuntimeBuilder::default()
    }
}

/// What the worker thread hands back once started.
struct Parts {
    /// The worker's tokio runtime: context for callers that have none.
    handle: tokio::runtime::Handle,
    backend: Backend,
    waiters: Arc<Waiters>,
    watchdog: Arc<Watchdog>,
    behind: Arc<PendingReleases>,
}

/// Body of the runtime's thread: start everything, then idle until stopped.
fn worker(
    config: BackendConfig,
    drain: Duration,
    identity: Option<Identity>,
    ready: oneshot::Sender<Result<Parts, LockError>>,
    stop: oneshot::Receiver<()>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(
                BackendError::new("cannot start the lock runtime", e).into()
            ));
            return;
        }
    };
    rt.block_on(async move {
        let waiters = Waiters::new();
        let wakeups: Weak<dyn Wakeups> = Arc::downgrade(&waiters) as Weak<dyn Wakeups>;
        let (backend, watches) = match Backend::start(config, wakeups).await {
            Ok(started) => started,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        waiters.attach(watches);
        let watchdog = Arc::new(Watchdog::default());
        let backend_for_drain = backend.clone();
        let (wd_stop_tx, wd_stop_rx) = oneshot::channel();
        let heartbeats: Weak<dyn Heartbeats> = Arc::downgrade(&waiters) as Weak<dyn Heartbeats>;
        tokio::spawn(watchdog::run(
            watchdog.clone(),
            backend.clone(),
            heartbeats,
            identity,
            wd_stop_rx,
        ));
        let behind = Arc::new(PendingReleases::default());
        let parts = Parts {
            handle: tokio::runtime::Handle::current(),
            backend,
            waiters,
            watchdog,
            behind: behind.clone(),
        };
        if ready.send(Ok(parts)).is_err() {
            return;
        }
        let _ = stop.await;
        let _ = wd_stop_tx.send(());
        // The last handle is gone, so no guard is left, but releases of
        // dropped guards and locked calls may still be out: send them
        // before stopping.
        let _ = tokio::time::timeout(drain, async {
            behind.all_settled().await;
            backend_for_drain.all_releases_settled().await;
        })
        .await;
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_bounded_by_default() {
        assert_eq!(LockRuntime::builder().default_wait, Some(DEFAULT_WAIT));
        assert_eq!(DEFAULT_WAIT, DEFAULT_LEASE);
    }
}
