//! The runtime: configuration, the global registry, and the worker thread.
//!
//! A [`LockRuntime`] is a cheap handle (an `Arc`) to one backend connection,
//! its table of held locks, its waiters and its watchdog. Its background
//! work — the watchdog, the Redis connection driver, the subscription task,
//! the background releaser — runs on one dedicated thread with a small tokio
//! runtime of its own. That keeps locks working whatever runtime the caller
//! uses and however many there are (one per `#[tokio::test]`, say), and lets a
//! dropped guard queue its release without any tokio context. The thread stops
//! when the last handle is dropped.
//!
//! The global registry is a `OnceLock`: `install` puts a runtime there once,
//! and `#[distributed_lock]` and [`lock`] use it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::memory::MemoryBackend;
use crate::backend::redis::{self as redis_backend, RedisSettings};
use crate::backend::{Backend, LockNames};
use crate::error::{BackendError, LockError};
use crate::guard::LockGuard;
use crate::held::{HeldLock, HeldTable};
use crate::owner::Node;
use crate::request::LockRequest;
use crate::waiters::Waiters;
use crate::watchdog::{self, Watchdog, WatchdogStats};

/// What [`LockRuntime::describe`] says of the embedded backend.
const EMBEDDED_DESCRIPTION: &str =
    "embedded (in-process) backend: locks exclude only tasks of this process";

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

static GLOBAL: OnceLock<LockRuntime> = OnceLock::new();

/// Which backend a builder will use.
#[derive(Clone)]
enum Choice {
    Memory,
    Redis(String),
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
    choice: Choice,
    prefix: String,
    default_lease: Duration,
    default_wait: Option<Duration>,
    fair: bool,
    connect_timeout: Duration,
    response_timeout: Duration,
    try_timeout: Duration,
    fence_window: Duration,
    tls_root_ca: Option<Vec<u8>>,
    tls_client: Option<(Vec<u8>, Vec<u8>)>,
}

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
            fair: std::env::var_os("LOCK_FAIR").is_some_and(|v| v == "1"),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
            try_timeout: DEFAULT_TRY_TIMEOUT,
            fence_window: DEFAULT_FENCE_WINDOW,
            tls_root_ca: None,
            tls_client: None,
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
    /// [`LockRequest::fair`] for what it costs). Every process that uses a
    /// key should agree. Default: `false`, or `true` when the environment
    /// variable `LOCK_FAIR` is `1` (to switch a deployment, or a test run,
    /// without code changes).
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
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
    /// long as the server's clock never steps back by more than this (README,
    /// "Guarantees"). Shorten it only to watch keys expire in a test.
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

    /// Trusts this CA (PEM) for `rediss://` instead of the system's roots:
    /// for servers with certificates from a private CA. Needs the `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_ca = Some(pem.into());
        self
    }

    /// Presents this client certificate chain and private key (both PEM) for
    /// mutual TLS. Needs the `tls` feature.
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
        if self.prefix.contains(['{', '}']) {
            return Err(LockError::InvalidConfig(
                "the key prefix may not contain `{` or `}` (the runtime adds the hash tag)"
                    .to_owned(),
            ));
        }
        let (ready_tx, ready_rx) = oneshot::channel::<Result<Parts, LockError>>();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let choice = self.choice.clone();
        let fence_window = self.fence_window;
        let settings = RedisSettings {
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            tls_root_ca: self.tls_root_ca.clone(),
            tls_client: self.tls_client.clone(),
        };
        std::thread::Builder::new()
            .name("lock-runtime".to_owned())
            .spawn(move || worker(choice, settings, fence_window, ready_tx, stop_rx))
            .map_err(|e| BackendError::new("cannot start the lock runtime thread", e))?;
        let parts = ready_rx
            .await
            .map_err(|_| BackendError::msg("the lock runtime thread stopped during start-up"))??;
        Ok(LockRuntime {
            inner: Arc::new(Inner {
                describe: match &parts.backend {
                    Backend::Redis(r) => format!("redis at {}", r.endpoint()),
                    Backend::Memory(_) => EMBEDDED_DESCRIPTION.to_owned(),
                },
                handle: parts.handle,
                backend: parts.backend,
                waiters: parts.waiters,
                watchdog: parts.watchdog,
                table: HeldTable::default(),
                prefix: self.prefix,
                default_lease: self.default_lease,
                default_wait: self.default_wait,
                default_fair: self.fair,
                try_timeout: self.try_timeout,
                drain_limit: self.response_timeout.saturating_mul(2),
                closed: AtomicBool::new(false),
                _stop: stop_tx,
            }),
        })
    }
}

/// What the worker thread hands back once started.
struct Parts {
    /// The worker's tokio runtime: context for callers that have none.
    handle: tokio::runtime::Handle,
    backend: Backend,
    waiters: Arc<Waiters>,
    watchdog: Arc<Watchdog>,
}

/// Body of the runtime's thread: start everything, then idle until stopped.
fn worker(
    choice: Choice,
    settings: RedisSettings,
    fence_window: Duration,
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
        let (backend, waiters) = match choice {
            Choice::Memory => {
                let waiters = Waiters::new(None, None);
                let memory = Arc::new(MemoryBackend::new(waiters.clone(), fence_window));
                (Backend::Memory(memory), waiters)
            }
            Choice::Redis(url) => match redis_backend::connect(&url, &settings, fence_window).await
            {
                Ok(connected) => (Backend::Redis(connected.backend), connected.waiters),
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            },
        };
        let watchdog = Arc::new(Watchdog::default());
        let backend_for_drain = backend.clone();
        let (wd_stop_tx, wd_stop_rx) = oneshot::channel();
        tokio::spawn(watchdog::run(watchdog.clone(), backend.clone(), wd_stop_rx));
        let parts = Parts {
            handle: tokio::runtime::Handle::current(),
            backend,
            waiters,
            watchdog,
        };
        if ready.send(Ok(parts)).is_err() {
            return;
        }
        let _ = stop.await;
        let _ = wd_stop_tx.send(());
        // The last handle is gone, so no guard is left, but releases of
        // dropped guards may still be queued: send them before stopping.
        let drain = settings.response_timeout.saturating_mul(2);
        let _ = tokio::time::timeout(drain, backend_for_drain.all_releases_settled()).await;
    });
}

struct Inner {
    handle: tokio::runtime::Handle,
    backend: Backend,
    waiters: Arc<Waiters>,
    watchdog: Arc<Watchdog>,
    table: HeldTable,
    prefix: String,
    default_lease: Duration,
    default_wait: Option<Duration>,
    default_fair: bool,
    try_timeout: Duration,
    /// How long shutdown waits for the backend to confirm its releases.
    drain_limit: Duration,
    /// Set by [`LockRuntime::shutdown`]: no more locks are taken.
    closed: AtomicBool,
    describe: String,
    /// Dropped with the last handle: stops the worker thread.
    _stop: oneshot::Sender<()>,
}

/// A handle to a running lock runtime; clones share it.
///
/// Build one with [`LockRuntime::builder`], then either use it directly
/// ([`lock`](Self::lock)) or [`install`](Self::install) it as the global
/// runtime that `#[distributed_lock]` uses.
#[derive(Clone)]
pub struct LockRuntime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LockRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockRuntime")
            .field("backend", &self.inner.describe)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

/// A snapshot of a runtime's bookkeeping (tests, health checks, benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeStats {
    /// Backend holds this runtime has now (nested holds count once).
    pub held: usize,
    /// Keys with at least one local waiter (each is one subscription on Redis).
    pub waiting_keys: usize,
    /// The watchdog's counters.
    pub watchdog: WatchdogStats,
}

impl LockRuntime {
    /// A builder with the defaults: embedded backend, prefix `"lock:"`, 30 s
    /// lease, 30 s wait.
    pub fn builder() -> LockRuntimeBuilder {
        LockRuntimeBuilder::default()
    }

    /// Makes this the global runtime used by `#[distributed_lock]` and
    /// [`lock`]. Once per process: a second call returns
    /// [`LockError::AlreadyInstalled`] and leaves the first in place.
    pub fn install(self) -> Result<(), LockError> {
        if matches!(self.inner.backend, Backend::Memory(_)) {
            tracing::warn!(
                "lock runtime installed on the embedded backend: locks exclude only tasks \
                 of this process, not other processes or machines"
            );
        }
        GLOBAL.set(self).map_err(|_| LockError::AlreadyInstalled)
    }

    /// The installed global runtime, or [`LockError::NotInstalled`].
    pub fn global() -> Result<LockRuntime, LockError> {
        GLOBAL.get().cloned().ok_or(LockError::NotInstalled)
    }

    /// A request for the lock `key` on this runtime.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(Some(self.clone()), key.into())
    }

    /// Deletes the lock `key` whoever holds it, and wakes its waiters; `true`
    /// when there was a lock. An administrative tool: the holder finds out at
    /// its next renewal (`Lost`).
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let hash = LockNames::hash(&self.inner.prefix, key);
        Ok(self.run(self.inner.backend.force_unlock(&hash)).await?)
    }

    /// Gives back every lock this runtime holds and takes no more: for a
    /// graceful stop (SIGTERM, ctrl-c), after the service has finished the
    /// requests in flight. Returns how many locks it released.
    ///
    /// - Every held lock leaves the watchdog and is released at once, and
    ///   the call waits until the backend has answered those releases and
    ///   any queued by dropped guards (at most twice the response timeout;
    ///   after that, [`LockError::Backend`], and leases free what is left).
    /// - A locked body still running is told its lock is lost: with
    ///   `on_lost = "abort"` it is stopped at its next `.await` and its call
    ///   returns [`LockError::ShutDown`]; its guard's `is_lost()` is true.
    /// - Acquires that wait now, and every later one, fail with
    ///   [`LockError::ShutDown`].
    ///
    /// Without it, a process that ends with locks still held (a `return`
    /// from `main` while tasks hold locks, `std::process::exit`, SIGTERM
    /// with no handler, a crash) leaves them to their leases: other
    /// processes wait up to one lease for them.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
    /// let guard = runtime.lock("report").acquire().await?;
    /// assert_eq!(runtime.shutdown().await?, 1);
    /// assert!(guard.is_lost());
    /// assert!(runtime.lock("report").acquire().await.is_err());
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn shutdown(&self) -> Result<usize, LockError> {
        self.inner.closed.store(true, Ordering::SeqCst);
        let holds = self.inner.table.close_all();
        for held in &holds {
            self.inner.watchdog.remove(held.id);
            held.mark_lost();
            self.inner.backend.release_in_background(
                held.hash.clone(),
                held.holder.clone(),
                held.fair,
            );
        }
        // Waiters see the flag when they wake.
        self.inner.waiters.wake_all();
        let limit = self.inner.drain_limit;
        let backend = &self.inner.backend;
        let drained = self
            .run(async { tokio::time::timeout(limit, backend.all_releases_settled()).await })
            .await;
        match drained {
            Ok(()) => Ok(holds.len()),
            Err(_) => Err(BackendError::msg(format!(
                "shutdown: the backend did not confirm every release within {limit:?}; \
                 their leases will free the locks left"
            ))
            .into()),
        }
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// One round trip to the backend on the runtime's own connection (a Redis
    /// `PING`); returns how long it took. For readiness probes, and as the
    /// unit the benchmarks measure lock costs in.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
    /// let rtt = runtime.ping().await?;
    /// assert!(rtt < std::time::Duration::from_secs(1));
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn ping(&self) -> Result<Duration, LockError> {
        let start = Instant::now();
        self.run(self.inner.backend.ping()).await?;
        Ok(start.elapsed())
    }

    /// Which backend this runtime uses, for logs: `"redis at host:port"` (no
    /// credentials) or `"embedded (in-process) backend"`.
    pub fn describe(&self) -> &str {
        &self.inner.describe
    }

    /// Counters of held locks, waiters and renewals.
    pub fn stats(&self) -> RuntimeStats {
        RuntimeStats {
            held: self.inner.table.len(),
            waiting_keys: self.inner.waiters.waiting_keys(),
            watchdog: self.inner.watchdog.stats(),
        }
    }

    /// Backend name of `key` (prefix and hash tag applied), e.g. `lock:{order:1}`.
    pub fn backend_key(&self, key: &str) -> String {
        LockNames::hash(&self.inner.prefix, key)
    }

    /// Polls `fut` in the runtime's tokio context when the caller has none
    /// (see `context.rs`).
    pub(crate) fn run<F: std::future::Future>(&self, fut: F) -> crate::context::InContext<'_, F> {
        crate::context::in_context(&self.inner.handle, fut)
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    pub(crate) fn table(&self) -> &HeldTable {
        &self.inner.table
    }

    pub(crate) fn waiters(&self) -> &Arc<Waiters> {
        &self.inner.waiters
    }

    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.inner.watchdog
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    pub(crate) fn default_lease(&self) -> Duration {
        self.inner.default_lease
    }

    pub(crate) fn default_fair(&self) -> bool {
        self.inner.default_fair
    }

    pub(crate) fn default_wait(&self) -> Option<Duration> {
        self.inner.default_wait
    }

    pub(crate) fn try_timeout(&self) -> Duration {
        self.inner.try_timeout
    }

    /// Takes a fresh backend hold into the table and the watchdog.
    pub(crate) fn adopt(
        &self,
        held: Arc<HeldLock>,
        scope: Arc<Node>,
        sent_at: Instant,
    ) -> LockGuard {
        let lease = held.lease;
        self.adopt_for(held, scope, sent_at, lease)
    }

    /// [`adopt`](Self::adopt) a lock whose backend lease is `in_force` (a
    /// fair handoff's claim, until the watchdog's first renewal).
    pub(crate) fn adopt_for(
        &self,
        held: Arc<HeldLock>,
        scope: Arc<Node>,
        sent_at: Instant,
        in_force: Duration,
    ) -> LockGuard {
        let channel_waiting = self.inner.waiters.waiting_keys() > 0;
        let frame = self.inner.table.insert(held.clone(), held.owner);
        self.inner.watchdog.add(held.clone(), sent_at, in_force);
        if channel_waiting {
            let channel = LockNames::channel(&held.hash);
            // The key's other waiters sleep no longer than this hold's lease
            // (it may end by expiry, with no release message).
            if let Some(until) = sent_at.checked_add(in_force) {
                self.inner.waiters.note_held(&channel, until);
            }
            // Waiters of the same scope may re-enter now instead of waiting
            // for a release that their own scope would have to make.
            self.inner.waiters.wake_owner(&channel, held.owner);
        }
        LockGuard::new(self.clone(), held, frame, scope)
    }
}

/// A request for the lock `key` on the global runtime; acquiring it fails
/// with [`LockError::NotInstalled`] when none is installed.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// let guard = lock_runtime::lock("daily-report").acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub fn lock(key: impl Into<String>) -> LockRequest {
    LockRequest::new(GLOBAL.get().cloned(), key.into())
}

/// Shuts the global runtime down ([`LockRuntime::shutdown`]): releases
/// every lock it holds and takes no more. `Ok(0)` when none is installed.
///
/// ```no_run
/// # async fn serve() {}
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// lock_runtime::init_from_env().await?;
/// tokio::select! {
///     () = serve() => {}
///     _ = tokio::signal::ctrl_c() => {} // and SIGTERM, with tokio::signal::unix
/// }
/// lock_runtime::shutdown().await?;
/// # Ok(()) }
/// ```
pub async fn shutdown() -> Result<usize, LockError> {
    match GLOBAL.get() {
        Some(runtime) => runtime.shutdown().await,
        None => Ok(0),
    }
}

/// Installs the global runtime from the environment, and returns it.
///
/// | variable | meaning |
/// |---|---|
/// | `LOCK_REDIS_URL`, else `REDIS_URL` | the Redis server (`redis://…` or `rediss://…`) |
/// | `LOCK_BACKEND` | `redis` (needs a URL) or `memory` (the embedded backend, on purpose) |
/// | `LOCK_PREFIX` | prefix of every lock name (default `lock:`) |
/// | `LOCK_FAIR` | `1`: locks are fair unless they say otherwise |
///
/// **Once per process, and idempotent.** A second call returns the runtime
/// already installed (however it was installed) without reading the
/// environment again, so every `#[tokio::test]` of a test binary may call
/// it: the runtime runs on its own thread, so it serves every test's tokio
/// runtime alike. ([`LockRuntime::install`] instead refuses a second
/// runtime; a test that wants a runtime of its own builds one and uses
/// [`LockRuntime::lock`] or [`with_lock`](crate::with_lock), not the global.)
///
/// **It fails closed.** With no URL and no `LOCK_BACKEND=memory`, a release
/// build returns [`LockError::InvalidConfig`] naming `REDIS_URL`: a service
/// deployed with a missing or misspelt variable must not run with locks that
/// exclude only its own process while every call seems to succeed. A debug
/// build (`cargo run`, `cargo test`) uses the embedded backend then, with a
/// warning, so examples and users' own tests need no setup. Whenever the
/// embedded backend is installed a warning says that locks exclude only this
/// process, and an unknown `LOCK_*` variable (a typo such as
/// `LOCK_REDIS_UR`) is reported with the nearest known name.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// # std::env::remove_var("LOCK_REDIS_URL"); std::env::remove_var("REDIS_URL");
/// # std::env::set_var("LOCK_BACKEND", "memory");
/// let runtime = lock_runtime::init_from_env().await?;
/// println!("locks on {}", runtime.describe());
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub async fn init_from_env() -> Result<LockRuntime, LockError> {
    if let Some(installed) = GLOBAL.get() {
        return Ok(installed.clone());
    }
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    for (name, nearest) in unknown_lock_variables(names) {
        match nearest {
            Some(known) => tracing::warn!("unknown variable {name}: did you mean {known}?"),
            None => tracing::warn!("unknown variable {name}: lock-runtime does not read it"),
        }
    }
    let read = |name: &str| std::env::var(name).ok();
    let builder = builder_from_env(read, cfg!(debug_assertions))?;
    let runtime = builder.build().await?;
    match runtime.clone().install() {
        Ok(()) => {}
        // Another caller installed one meanwhile: that one is the runtime.
        Err(LockError::AlreadyInstalled) => return LockRuntime::global(),
        Err(e) => return Err(e),
    }
    tracing::info!(backend = %runtime.describe(), "lock runtime installed");
    Ok(runtime)
}

/// The variables [`init_from_env`] reads.
const ENV_VARIABLES: [&str; 5] = [
    "LOCK_REDIS_URL",
    "REDIS_URL",
    "LOCK_BACKEND",
    "LOCK_PREFIX",
    "LOCK_FAIR",
];

/// The builder the environment asks for (`read` looks a variable up;
/// `debug_build` allows the embedded fallback). The rule of [`init_from_env`].
fn builder_from_env(
    read: impl Fn(&str) -> Option<String>,
    debug_build: bool,
) -> Result<LockRuntimeBuilder, LockError> {
    let set = |name: &str| read(name).filter(|v| !v.trim().is_empty());
    let url = set("LOCK_REDIS_URL").or_else(|| set("REDIS_URL"));
    let backend = set("LOCK_BACKEND").map(|b| b.trim().to_ascii_lowercase());
    let mut builder = match (backend.as_deref(), url) {
        (None | Some("redis"), Some(url)) => LockRuntime::builder().redis(url),
        (Some("memory"), None) => LockRuntime::builder().memory(),
        (Some("memory"), Some(_)) => {
            return Err(LockError::InvalidConfig(
                "LOCK_BACKEND=memory, but a Redis URL is set too (REDIS_URL or \
                 LOCK_REDIS_URL): unset one of them"
                    .to_owned(),
            ))
        }
        (Some("redis"), None) => {
            return Err(LockError::InvalidConfig(
                "LOCK_BACKEND=redis, but no Redis URL: set REDIS_URL (or LOCK_REDIS_URL) \
                 to redis://host:port"
                    .to_owned(),
            ))
        }
        (Some(other), _) => {
            return Err(LockError::InvalidConfig(format!(
                "LOCK_BACKEND={other:?} is not a backend: use redis or memory"
            )))
        }
        (None, None) if debug_build => {
            tracing::warn!(
                "no REDIS_URL set: using the embedded backend (debug build only; a \
                 release build fails here unless LOCK_BACKEND=memory)"
            );
            LockRuntime::builder().memory()
        }
        (None, None) => {
            return Err(LockError::InvalidConfig(
                "no lock backend configured: set REDIS_URL (or LOCK_REDIS_URL) to \
                 redis://host:port, or LOCK_BACKEND=memory to use the embedded backend \
                 on purpose (its locks exclude only tasks of this process)"
                    .to_owned(),
            ))
        }
    };
    if let Some(prefix) = read("LOCK_PREFIX") {
        builder = builder.key_prefix(prefix);
    }
    Ok(builder.fair(read("LOCK_FAIR").is_some_and(|v| v.trim() == "1")))
}

/// The `LOCK_*` names among `names` that [`init_from_env`] does not read,
/// each with the nearest known name when it looks like a typo of one.
fn unknown_lock_variables(
    names: impl Iterator<Item = String>,
) -> Vec<(String, Option<&'static str>)> {
    names
        .filter(|n| n.starts_with("LOCK_") && !ENV_VARIABLES.contains(&n.as_str()))
        .map(|name| {
            let nearest = ENV_VARIABLES
                .iter()
                .map(|known| (edit_distance(&name, known), *known))
                .min()
                .filter(|(distance, _)| *distance <= 3)
                .map(|(_, known)| known);
            (name, nearest)
        })
        .collect()
}

/// Levenshtein distance (both strings are short variable names).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn backend(builder: &LockRuntimeBuilder) -> &'static str {
        match builder.choice {
            Choice::Memory => "memory",
            Choice::Redis(_) => "redis",
        }
    }

    fn error(result: Result<LockRuntimeBuilder, LockError>) -> String {
        match result {
            Err(LockError::InvalidConfig(message)) => message,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn waits_are_bounded_by_default() {
        assert_eq!(LockRuntime::builder().default_wait, Some(DEFAULT_WAIT));
        assert_eq!(DEFAULT_WAIT, DEFAULT_LEASE);
    }

    #[test]
    fn a_release_build_with_no_backend_configured_fails_closed() {
        let message = error(builder_from_env(env(&[]), false));
        assert!(message.contains("REDIS_URL"), "{message}");
        assert!(message.contains("LOCK_BACKEND=memory"), "{message}");
        // Empty values count as unset.
        let message = error(builder_from_env(env(&[("REDIS_URL", " ")]), false));
        assert!(message.contains("REDIS_URL"), "{message}");
    }

    #[test]
    fn the_embedded_backend_is_used_when_asked_or_in_debug_builds() {
        let asked = builder_from_env(env(&[("LOCK_BACKEND", "memory")]), false).unwrap();
        assert_eq!(backend(&asked), "memory");
        let debug = builder_from_env(env(&[]), true).unwrap();
        assert_eq!(backend(&debug), "memory");
    }

    #[test]
    fn a_url_selects_redis_and_conflicts_are_errors() {
        for (debug, pairs) in [
            (false, &[("REDIS_URL", "redis://h:1")][..]),
            (false, &[("LOCK_REDIS_URL", "redis://h:1")][..]),
            (
                true,
                &[("LOCK_BACKEND", "Redis"), ("REDIS_URL", "redis://h:1")][..],
            ),
        ] {
            assert_eq!(
                backend(&builder_from_env(env(pairs), debug).unwrap()),
                "redis"
            );
        }
        let both = &[("LOCK_BACKEND", "memory"), ("REDIS_URL", "redis://h:1")];
        assert!(error(builder_from_env(env(both), true)).contains("unset one"));
        let no_url = error(builder_from_env(env(&[("LOCK_BACKEND", "redis")]), true));
        assert!(no_url.contains("REDIS_URL"), "{no_url}");
        let typo = error(builder_from_env(env(&[("LOCK_BACKEND", "memroy")]), true));
        assert!(typo.contains("redis or memory"), "{typo}");
    }

    #[test]
    fn prefix_and_fair_mode_come_from_the_environment() {
        let pairs = [
            ("LOCK_BACKEND", "memory"),
            ("LOCK_PREFIX", "billing:"),
            ("LOCK_FAIR", "1"),
        ];
        let builder = builder_from_env(env(&pairs), false).unwrap();
        assert_eq!(builder.prefix, "billing:");
        assert!(builder.fair);
        let plain = builder_from_env(env(&[("LOCK_BACKEND", "memory")]), false).unwrap();
        assert!(!plain.fair);
    }

    #[test]
    fn unknown_lock_variables_get_the_nearest_known_name() {
        let names = [
            "LOCK_REDIS_UR",
            "LOCK_PREFIX",
            "PATH",
            "LOCK_BAKEND",
            "LOCK_SOMETHING_ELSE",
        ];
        let found = unknown_lock_variables(names.iter().map(|n| (*n).to_owned()));
        assert_eq!(
            found,
            [
                ("LOCK_REDIS_UR".to_owned(), Some("LOCK_REDIS_URL")),
                ("LOCK_BAKEND".to_owned(), Some("LOCK_BACKEND")),
                ("LOCK_SOMETHING_ELSE".to_owned(), None),
            ]
        );
    }

    #[tokio::test]
    async fn the_embedded_backend_says_it_excludes_only_this_process() {
        let runtime = LockRuntime::builder().memory().build().await.unwrap();
        assert!(
            runtime.describe().contains("only tasks of this process"),
            "{}",
            runtime.describe()
        );
    }
}
