//! Configuring and starting a runtime: [`LockRuntimeBuilder`], and the
//! worker thread it starts.
//!
//! `build()` checks every setting (a `LockError::InvalidConfig` naming the
//! setter), then starts the runtime's thread with a small tokio runtime of
//! its own, starts the backend there (`Backend::start`: connections, scripts,
//! tasks) and the watchdog, and hands back a [`LockRuntime`] handle. When
//! the last handle is dropped the thread sends the releases still queued,
//! then stops.
//!
//! A section per backend's configuration (`redis.rs`, `etcd.rs`,
//! `zookeeper.rs`), the checks every backend shares (`check.rs`), and the
//! thread (`worker.rs`); this file holds the builder, its common setters
//! and `build`.

mod check;
mod endpoints;
mod etcd;
mod redis;
mod worker;
mod zookeeper;

use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::sentinel::{NodeAuth, SentinelConfig};
use crate::backend::{BackendConfig, ConnectSettings};
use crate::cohort::Cohort;
use crate::error::{BackendError, LockError};
use crate::names::LockNames;
use crate::runtime::{LockRuntime, Settings, Started};
use crate::who::Identity;
use worker::{worker, Parts};

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
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_ca = Some(pem.into());
        self
    }

    /// Presents this client certificate chain and private key (both PEM) for
    /// mutual TLS (Redis, and etcd's `--client-cert-auth`). Needs the `tls`
    /// feature.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
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
        self.check()?;
        let (ready_tx, ready_rx) = oneshot::channel::<Result<Parts, LockError>>();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        // How long a stopping runtime (shutdown, or the last handle gone)
        // waits for its queued releases to be answered.
        let drain = self.response_timeout.saturating_mul(2);
        let settings = self.connect_settings();
        let config = self.backend_config(settings)?;
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

    /// The backend's configuration, as the builder's choice says; a
    /// backend this build lacks is refused, naming its feature.
    fn backend_config(&self, settings: ConnectSettings) -> Result<BackendConfig, LockError> {
        Ok(match &self.choice {
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
            Choice::Etcd(endpoints) => self.etcd_config(endpoints, settings)?,
            Choice::Zookeeper(connect) => self.zookeeper_config(connect, settings)?,
            Choice::Sentinel(sentinels, service) => BackendConfig::Sentinel(
                SentinelConfig {
                    sentinels: sentinels.clone(),
                    service: service.clone(),
                    auth: self.node_auth.clone(),
                    sync: self.sync_replicas,
                },
                settings,
            ),
        })
    }
}

impl LockRuntime {
    /// A builder with the defaults: embedded backend, prefix `"lock:"`, 30 s
    /// lease, 30 s wait.
    pub fn builder() -> LockRuntimeBuilder {
        LockRuntimeBuilder::default()
    }
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
