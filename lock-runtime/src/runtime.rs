//! The runtime handle and the global registry.
//!
//! A [`LockRuntime`] is a cheap handle (an `Arc`) to one backend, its table
//! of held locks, its waiters and its watchdog. Its background work — the
//! watchdog, the backend's connection, subscription and release tasks — runs
//! on one dedicated thread with a small tokio runtime of its own, started by
//! the builder (`builder/worker.rs`). That keeps locks working whatever runtime the
//! caller uses and however many there are (one per `#[tokio::test]`, say),
//! and lets a dropped guard queue its release without any tokio context. The
//! thread stops when the last handle is dropped.
//!
//! The global registry is a `OnceLock`: `install` puts a runtime there once,
//! and `#[distributed_lock]` and [`lock`](crate::lock) use it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::releases::PendingReleases;
use crate::backend::{Backend, Holding, Release};
use crate::error::{BackendError, LockError};
use crate::held::{HeldLock, HeldTable};
use crate::inflight::InFlight;
use crate::waiters::Waiters;
use crate::watchdog::{Watchdog, WatchdogStats};

static GLOBAL: OnceLock<LockRuntime> = OnceLock::new();

/// The defaults and limits a runtime applies, as the builder checked them.
pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) default_wait: Option<Duration>,
    pub(crate) default_fair: bool,
    pub(crate) try_timeout: Duration,
    /// How long shutdown waits for the backend to confirm its releases.
    pub(crate) drain_limit: Duration,
    /// Local handoffs between tasks of this process.
    pub(crate) cohort: crate::cohort::Cohort,
}

/// What the worker thread started (see `builder/worker.rs`).
pub(crate) struct Started {
    /// The worker's tokio runtime: context for callers that have none.
    pub(crate) handle: tokio::runtime::Handle,
    pub(crate) backend: Backend,
    pub(crate) waiters: Arc<Waiters>,
    pub(crate) watchdog: Arc<Watchdog>,
    /// Locked calls' releases not yet answered (see [`LockRuntime::release_behind`]).
    pub(crate) behind: Arc<PendingReleases>,
    /// Dropped with the last handle: stops the worker thread.
    pub(crate) stop: oneshot::Sender<()>,
}

struct Inner {
    handle: tokio::runtime::Handle,
    backend: Backend,
    waiters: Arc<Waiters>,
    watchdog: Arc<Watchdog>,
    behind: Arc<PendingReleases>,
    /// See [`RuntimeStats::lost_at_release`].
    lost_at_release: Arc<std::sync::atomic::AtomicU64>,
    table: HeldTable,
    settings: Settings,
    /// Acquisitions in flight, and the gate that shutdown closes: no more
    /// locks are taken after.
    in_flight: Arc<InFlight>,
    /// See [`RuntimeStats::passed_locally`].
    passed_locally: std::sync::atomic::AtomicU64,
    /// See [`RuntimeStats::joined_locally`].
    joined_locally: std::sync::atomic::AtomicU64,
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
            .field("prefix", &self.inner.settings.prefix)
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
    /// Acquires of this runtime waiting for a lock now (over every key).
    pub waiting: usize,
    /// Of [`waiting_keys`](Self::waiting_keys), those whose watch the
    /// backend confirmed (on Redis, the release channel's subscription):
    /// their waiters are woken by a release and can be passed a hold. A key
    /// that stays unwatched has waiters that learn of a release only from
    /// the holder's lease end.
    pub watched_keys: usize,
    /// The watchdog's counters.
    pub watchdog: WatchdogStats,
    /// Holds passed from one task of this process to another without a
    /// round trip so far (lock cohorting, [`LockRuntimeBuilder::cohort`](crate::LockRuntimeBuilder::cohort)).
    pub passed_locally: u64,
    /// Reads that joined a read hold another task of this process had,
    /// without a round trip (sharing its backend hold and token, within the
    /// same limits as [`passed_locally`](Self::passed_locally)).
    pub joined_locally: u64,
    /// Times the backend reported a lost connection (a server restarted, a
    /// failover, a network cut); holds are not passed between tasks again
    /// until a renewal confirms them after it.
    pub connections_lost: u64,
    /// Locked calls that returned before their release was answered, whose
    /// release then found the hold gone (freed by force or by the server,
    /// unnoticed while the body ran); also in the `lock_lost_total` metric.
    /// `on_lost = "confirm"` turns such a call into `Err(LockError::Lost)`.
    pub lost_at_release: u64,
}

impl LockRuntime {
    /// The handle of a runtime whose worker thread has started.
    pub(crate) fn new(started: Started, settings: Settings) -> LockRuntime {
        LockRuntime {
            inner: Arc::new(Inner {
                describe: started.backend.describe(),
                handle: started.handle,
                backend: started.backend,
                waiters: started.waiters,
                watchdog: started.watchdog,
                behind: started.behind,
                lost_at_release: Arc::default(),
                table: HeldTable::default(),
                settings,
                in_flight: Arc::default(),
                passed_locally: std::sync::atomic::AtomicU64::new(0),
                joined_locally: std::sync::atomic::AtomicU64::new(0),
                _stop: started.stop,
            }),
        }
    }

    /// Makes this the global runtime used by `#[distributed_lock]` and
    /// [`lock`](crate::lock). Once per process: a second call returns
    /// [`LockError::AlreadyInstalled`] and leaves the first in place.
    pub fn install(self) -> Result<(), LockError> {
        if self.inner.backend.is_embedded() {
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

    /// Deletes the lock `key` whoever holds it, and wakes its waiters; `true`
    /// when there was a lock. An administrative tool: the holder finds out at
    /// its next renewal (`Lost`).
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let lock_key = self.backend_key(key);
        Ok(self.run(self.inner.backend.force_unlock(&lock_key)).await?)
    }

    /// Gives back every lock this runtime holds and takes no more: for a
    /// graceful stop (SIGTERM, ctrl-c), after the service has finished the
    /// requests in flight. Returns how many locks it released.
    ///
    /// - Every held lock leaves the watchdog and is released at once, and
    ///   the call waits until the backend has confirmed those releases and
    ///   any queued by dropped guards, on every backend, for at most twice
    ///   the response timeout (the drain limit). A release not confirmed by
    ///   then, or given up before (a server that refuses connections), makes
    ///   it return [`LockError::Backend`] naming those locks; their leases
    ///   free them.
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
        let inner = &self.inner;
        // A release given up from now on (its retries failed before the
        // drain limit) is named in the result, never `Ok`.
        inner.backend.record_given_up_releases();
        // Closed under the gate: every hold is in the table now, or will be
        // refused. What answered acquires took and nobody claimed goes back.
        for taken in inner.in_flight.close(|| {}) {
            inner
                .backend
                .release_in_background(taken.lock_key, taken.holder, taken.fair);
        }
        let holds = inner.table.close_all();
        for held in &holds {
            inner.watchdog.remove(held.id);
            held.mark_lost();
            inner.backend.release_in_background(
                held.lock_key.clone(),
                held.holder.clone(),
                held.fair,
            );
        }
        let limit = inner.settings.drain_limit;
        let backend = &inner.backend;
        let drained = self
            .run(async {
                tokio::time::timeout(limit, async {
                    // Scripts still out are answered first (each gives back
                    // what it took), and only then are the fair places given
                    // back: a place's give-back must not overtake the script
                    // that queued it or was handed the lock with it.
                    inner.in_flight.all_answered().await;
                    // (Their waiters would only give them back when next
                    // polled; waiters see the flag when they wake.)
                    inner.waiters.give_back_places();
                    inner.waiters.wake_all();
                    // (A locked call's release that fails goes to the
                    // backend's releaser: these first.)
                    inner.behind.all_settled().await;
                    backend.all_releases_settled().await;
                })
                .await
            })
            .await;
        if drained.is_err() {
            inner.waiters.give_back_places();
            inner.waiters.wake_all();
        }
        let mut unconfirmed = inner.backend.unconfirmed_releases();
        unconfirmed.extend(inner.behind.unconfirmed());
        if drained.is_ok() && unconfirmed.is_empty() {
            return Ok(holds.len());
        }
        Err(BackendError::msg(unconfirmed_message(&inner.describe, limit, &unconfirmed)).into())
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.in_flight.is_closed()
    }

    /// Acquisitions in flight, and the gate new holds pass.
    pub(crate) fn in_flight(&self) -> &Arc<InFlight> {
        &self.inner.in_flight
    }

    /// Polls `fut` once here, so that whatever it sends goes out now, in
    /// order with what this task sends after; if it is not done, the
    /// runtime's worker thread finishes it (also when the caller goes away).
    /// (Boxed by the caller: an unstarted future is as large as its
    /// largest state, which every waiting acquire would otherwise carry.)
    pub(crate) async fn finish_on_worker<F>(
        &self,
        mut fut: std::pin::Pin<Box<F>>,
    ) -> Result<F::Output, tokio::task::JoinError>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        match first {
            Poll::Ready(output) => Ok(output),
            // (The worker polls it at once, with its own waker.)
            Poll::Pending => self.inner.handle.spawn(fut).await,
        }
    }

    /// Gives back `held` (its last frame gone, out of the watchdog) without
    /// waiting for the backend's answer: a locked call whose hold is known
    /// valid through its body's end returns as soon as the release is on
    /// its way (`locked.rs`).
    ///
    /// The release is written here, from the caller's thread, before this
    /// returns: on a backend whose one connection applies commands in the
    /// order they are written (a single Redis server), anything this
    /// process sends about the key afterwards reaches the server after it,
    /// so the next acquire need not wait for its answer. (Should a
    /// reconnect or an unloaded script delay it after all, that acquire
    /// finds this process's old hold, and waits for its release message
    /// like any waiter: later, never wrong.) Elsewhere the key's next
    /// acquire in this process waits for the answer, as for a dropped guard.
    ///
    /// The answer goes to nobody's caller. A hold the release finds gone
    /// (freed by force, or by the server, without a renewal noticing) is
    /// counted in the `lock_lost` metric and logged (warn); a failed
    /// release goes to the backend's background releaser, which retries.
    /// Callers that need the verdict await [`LockGuard::release`](crate::LockGuard::release)
    /// (`on_lost = "confirm"`).
    pub(crate) fn release_behind(&self, held: &Arc<HeldLock>) {
        let backend = self.inner.backend.clone();
        let ordered = backend.applies_in_order();
        let pending = Behind::new(self.inner.behind.clone(), &held.lock_key, ordered);
        let lost_at_release = self.inner.lost_at_release.clone();
        let hold = held.clone();
        let (key, lock_key, holder, fair) = (
            held.key.clone(),
            held.lock_key.clone(),
            held.holder.clone(),
            held.fair,
        );
        self.start_on_worker(async move {
            let given = Holding {
                lock_key: &lock_key,
                holder: &holder,
                fair,
            };
            match backend.release(given).await {
                Ok(outcome @ (Release::Freed | Release::StillHeld)) => {
                    tracing::debug!(%key, ?outcome, behind = true, "lock released");
                }
                Ok(Release::NotHeld) => {
                    lost_at_release.fetch_add(1, Ordering::Relaxed);
                    // (A renewal answered meanwhile may have found the loss
                    // and counted it already.)
                    if hold.lost_at_release() {
                        crate::meter::lost(&key);
                        tracing::warn!(
                            %key,
                            "a locked call's lock was no longer held when it was released \
                             after the call returned (freed by force, or by the server): the \
                             call's result was returned already; `on_lost = \"confirm\"` \
                             makes such a call end in LockError::Lost"
                        );
                    }
                }
                Err(error) => {
                    tracing::debug!(%key, %error, "a locked call's release failed; retrying in the background");
                    backend.release_in_background(lock_key, holder, fair);
                }
            }
            drop(pending);
        });
    }

    /// Polls `fut` once now, in the runtime's context, and has the worker
    /// thread finish it if it is not done. Callable without a tokio context
    /// and from `Drop`.
    fn start_on_worker(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        // Out of tokio's cooperative budget: a caller whose task used its
        // budget up would otherwise see the first poll stop at the
        // connection's channel, unwritten, and the write would lose its
        // place ahead of what the caller sends next.
        let mut fut = Box::pin(tokio::task::unconstrained(fut));
        let first = {
            let _entered = self.inner.handle.enter();
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            std::future::Future::poll(fut.as_mut(), &mut cx)
        };
        if first.is_pending() {
            // (The worker polls it at once, with its own waker.)
            drop(self.inner.handle.spawn(fut));
        }
    }

    /// Locked calls' releases not yet answered.
    pub(crate) fn behind(&self) -> &Arc<PendingReleases> {
        &self.inner.behind
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
            waiting: self.inner.waiters.waiting_tasks(),
            watched_keys: self.inner.waiters.watched_keys(),
            watchdog: self.inner.watchdog.stats(),
            passed_locally: self.inner.passed_locally.load(Ordering::Relaxed),
            joined_locally: self.inner.joined_locally.load(Ordering::Relaxed),
            connections_lost: u64::from(self.inner.waiters.connection_epoch()),
            lost_at_release: self.inner.lost_at_release.load(Ordering::Relaxed),
        }
    }

    /// Counts a hold passed between tasks of this process.
    pub(crate) fn count_passed(&self) {
        self.inner.passed_locally.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_joined(&self) {
        self.inner.joined_locally.fetch_add(1, Ordering::Relaxed);
    }

    /// Backend name of `key` (prefix and, on Redis, hash tag applied), e.g.
    /// `lock:{order:1}` on Redis, `lock:order:1` on etcd.
    pub fn backend_key(&self, key: &str) -> String {
        self.inner
            .backend
            .lock_name(&self.inner.settings.prefix, key)
    }

    /// The key prefix of every name this runtime writes.
    pub(crate) fn prefix(&self) -> &str {
        &self.inner.settings.prefix
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

    pub(crate) fn default_lease(&self) -> Duration {
        self.inner.settings.default_lease
    }

    pub(crate) fn default_fair(&self) -> bool {
        self.inner.settings.default_fair
    }

    pub(crate) fn default_wait(&self) -> Option<Duration> {
        self.inner.settings.default_wait
    }

    /// How far a hold may be passed between tasks of this process (off on
    /// backends that reserve no tokens for it).
    pub(crate) fn cohort(&self) -> crate::cohort::Cohort {
        self.inner.settings.cohort
    }

    pub(crate) fn try_timeout(&self) -> Duration {
        self.inner.settings.try_timeout
    }
}

/// Locks a shutdown error names at most.
const SHOWN_UNCONFIRMED: usize = 10;

/// What a shutdown whose releases were not all confirmed says: the backend,
/// the drain limit, and the locks (backend names) left to their leases.
fn unconfirmed_message(
    backend: &str,
    limit: Duration,
    unconfirmed: &std::collections::BTreeSet<String>,
) -> String {
    if unconfirmed.is_empty() {
        return format!(
            "shutdown: {backend} did not answer the acquires in flight within the drain \
             limit ({limit:?}); their leases free whatever they took"
        );
    }
    let mut shown: Vec<&str> = unconfirmed
        .iter()
        .take(SHOWN_UNCONFIRMED)
        .map(String::as_str)
        .collect();
    if unconfirmed.len() > shown.len() {
        shown.push("…");
    }
    format!(
        "shutdown: {backend} did not confirm the release of {} lock(s) within the drain \
         limit ({limit:?}): {}; they stay held until their leases end",
        unconfirmed.len(),
        shown.join(", ")
    )
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

/// A locked call's release counted as pending until it is answered, or
/// dropped unanswered (the worker stopped).
struct Behind {
    pending: Arc<PendingReleases>,
    lock_key: String,
    /// Whether this process's acquires of the lock wait for it (not when
    /// it goes out ahead of them on the same connection).
    blocking: bool,
}

impl Behind {
    fn new(pending: Arc<PendingReleases>, lock_key: &str, ordered: bool) -> Self {
        if ordered {
            pending.add_nonblocking(lock_key);
        } else {
            pending.add(lock_key);
        }
        Behind {
            pending,
            lock_key: lock_key.to_owned(),
            blocking: !ordered,
        }
    }
}

impl Drop for Behind {
    fn drop(&mut self) {
        if self.blocking {
            self.pending.done([self.lock_key.as_str()]);
        } else {
            self.pending.done_nonblocking(&self.lock_key);
        }
    }
}
