//! Asking for a lock: [`LockRequest`] (key and options) and [`lock`].
//!
//! A request is validated here (key, lease, wait) and turned into an
//! acquisition (`acquire.rs`), which does the waiting; [`with_lock`]
//! (`locked.rs`) runs a body under it.

use std::future::Future;
use std::pin::Pin;

use futures_util::future::Either;

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::{Acquisition, Want};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::mode::LockMode;
use crate::owner::{self, Node};
use crate::runtime::LockRuntime;
use crate::traced::Traced;

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 4096;
/// Shortest lease accepted.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// Longest lease accepted.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// What a locked body does when its lock is lost while it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnLost {
    /// Stop the body at its next await and return `Err(LockError::Lost)`.
    #[default]
    Abort,
    /// Let the body finish and return its result; the loss is logged (warn).
    Continue,
    /// As [`Abort`](Self::Abort), and the call returns only once the
    /// backend answered its release: a loss that only the release finds (a
    /// forced release during the body that no renewal noticed yet) also
    /// ends in `Err(LockError::Lost)`, and a release the backend did not
    /// answer in `Err(LockError::Backend)`. The hold is never passed to a
    /// local waiter instead. Costs the release's round trip, which the
    /// other modes do not wait for.
    Confirm,
}

/// The options of `#[distributed_lock]`, as the expansion passes them
/// (`__private::Options`). Build with `..Options::DEFAULT` so fields can be
/// added without breaking expanded code.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// `lease = ...`; `None`: the runtime's default.
    pub lease: Option<Duration>,
    /// `wait = ...`; `None`: the runtime's default; `Some(ZERO)`: try once.
    pub wait: Option<Duration>,
    /// `watchdog = ...`.
    pub watchdog: bool,
    /// `on_lost = ...`.
    pub on_lost: OnLost,
    /// `fair = ...`; `None`: the runtime's default.
    pub fair: Option<bool>,
    /// `mode = ...`.
    pub mode: LockMode,
    /// `permits = N`; `None`: an ordinary lock.
    pub permits: Option<u32>,
}

impl Options {
    /// Everything at its default.
    pub const DEFAULT: Options = Options {
        lease: None,
        wait: None,
        watchdog: true,
        on_lost: OnLost::Abort,
        fair: None,
        mode: LockMode::Exclusive,
        permits: None,
    };
}

/// How long a request waits.
#[derive(Clone, Copy, Debug)]
enum Wait {
    /// The runtime's default.
    Default,
    /// At most this long (`ZERO`: try once).
    For(Duration),
    /// As long as it takes.
    Forever,
}

/// A lock about to be taken: key plus options. Made by [`LockRuntime::lock`]
/// or [`lock`](crate::lock); nothing happens until [`acquire`](Self::acquire).
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
/// let guard = runtime
///     .lock("invoice:7")
///     .lease(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .acquire()
///     .await?;
/// assert_eq!(guard.key(), "invoice:7");
/// guard.release().await?;
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[must_use = "a lock request does nothing until `.acquire().await`"]
#[derive(Debug, Clone)]
pub struct LockRequest {
    runtime: Option<LockRuntime>,
    key: String,
    lease: Option<Duration>,
    wait: Wait,
    watchdog: bool,
    pub(crate) on_lost: OnLost,
    fair: Option<bool>,
    mode: LockMode,
    /// `Some(n)`: one of `n` permits (see [`permits`](Self::permits)).
    permits: Option<u32>,
}

impl LockRequest {
    pub(crate) fn new(runtime: Option<LockRuntime>, key: String) -> Self {
        LockRequest {
            runtime,
            key,
            lease: None,
            wait: Wait::Default,
            watchdog: true,
            on_lost: OnLost::Abort,
            fair: None,
            mode: LockMode::Exclusive,
            permits: None,
        }
    }

    /// The lease: how long the lock outlives a holder that stops renewing it
    /// (crash, partition). Default: the runtime's (30 s unless configured).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The longest time to wait for a busy lock; `Duration::ZERO` tries once.
    /// Default: the runtime's ([`DEFAULT_WAIT`](crate::DEFAULT_WAIT), 30 s,
    /// unless configured). A wait too long to represent (`Duration::MAX`)
    /// waits forever, as does [`wait_forever`](Self::wait_forever).
    ///
    /// Bounds: a try-once takes at most the runtime's
    /// [`try_timeout`](crate::LockRuntimeBuilder::try_timeout) (250 ms by
    /// default) and fails with [`LockError::Backend`] if the backend has not
    /// answered by then. A bounded wait returns at its deadline; if the
    /// deadline passes while it sleeps, it first makes one last try, bounded
    /// by the same `try_timeout`: so it returns by the deadline plus
    /// `try_timeout` at the latest, whatever the network does.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Wait::For(wait);
        self
    }

    /// Waits as long as it takes, whatever the runtime's default.
    pub fn wait_forever(mut self) -> Self {
        self.wait = Wait::Forever;
        self
    }

    /// Whether the watchdog renews the lease while the lock is held (default
    /// `true`). With `false` the lease is fixed: the lock is lost when it ends.
    pub fn watchdog(mut self, renew: bool) -> Self {
        self.watchdog = renew;
        self
    }

    /// What [`with_lock`](crate::with_lock) does when the lock is lost while the body runs.
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    /// First come, first served across processes (default: the runtime's,
    /// [`DEFAULT_FAIR`](crate::DEFAULT_FAIR) unless
    /// [`LockRuntimeBuilder::fair`](crate::LockRuntimeBuilder::fair) says).
    ///
    /// With Redis, a waiter that finds the lock busy joins a queue in Redis,
    /// and a release hands the lock straight to the first live waiter in it:
    /// strict arrival order between processes (within a process waiters are
    /// always served in order), and a handoff costs no acquire round trip.
    /// The lock is handed over with a claim of at most 3 s, which the new
    /// holder's watchdog extends to its lease (with `watchdog(false)`, with
    /// the whole fixed lease). The price: a waiting process's watchdog
    /// refreshes its places once a second (in batches), and a waiter that
    /// dies while queued may be handed
    /// the lock in the 3 s before its place runs out, which then stays taken
    /// until the claim runs out. Use the same mode for every caller of a key:
    /// plain acquires do not queue and may take a lock freed by expiry before
    /// queued waiters do. The embedded backend is always in order.
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = Some(fair);
        self
    }

    /// A read hold: shared with other readers, across processes, and
    /// excluding writers (see [`LockMode`]).
    pub fn read(self) -> Self {
        self.mode(LockMode::Read)
    }

    /// A write hold: excludes readers and other writers (the same lock as
    /// the default, exclusive mode; see [`LockMode`]).
    pub fn write(self) -> Self {
        self.mode(LockMode::Write)
    }

    /// The hold's mode (default [`LockMode::Exclusive`]).
    pub fn mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// One of `n` permits of the key: at most `n` calls hold the key at
    /// once, across processes, each with its own permit index `0..n`
    /// ([`LockGuard::permit`], [`permit`](crate::permit) in a locked body).
    /// `permits(1)` is the ordinary exclusive lock, with permit index 0.
    /// Each permit is an ordinary lock with its own fencing token, renewal
    /// and queue: permit 0 is the lock of the key itself, permit `i > 0`
    /// the lock of the key followed by `#i` (`stock:7#3`), which is how
    /// `inspect` and `lockctl` show its holder. Exclusive mode only; `n` from
    /// 1 to [`MAX_PERMITS`](crate::MAX_PERMITS). Calls that give different
    /// `n` for one key share the low permits: at most `n` of them hold
    /// permits below `n`, for each `n` in use (docs/guarantees.md,
    /// "Permits").
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
    /// let first = runtime.lock("export").permits(2).acquire().await?;
    /// let second = runtime.lock("export").permits(2).acquire().await?;
    /// assert_ne!(first.permit(), second.permit());
    /// assert!(runtime.lock("export").permits(2).try_acquire().await?.is_none());
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn permits(mut self, n: u32) -> Self {
        self.permits = Some(n);
        self
    }

    /// The key as given.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Takes the lock for the current owner scope (a fresh owner when the
    /// caller runs in none), waiting as configured.
    ///
    /// Errors: [`LockError::Timeout`] when the wait runs out,
    /// [`LockError::NotInstalled`] for [`lock`](crate::lock) without a global
    /// runtime, [`LockError::InvalidKey`] / [`LockError::InvalidConfig`] for bad
    /// input, [`LockError::Backend`] when the backend fails.
    pub fn acquire(self) -> impl Future<Output = Result<LockGuard, LockError>> + Send {
        // Not an `async fn`: that would keep a second copy of the request in
        // every waiting acquire's state.
        self.acquire_as(None)
    }

    /// Tries once: `Ok(None)` when someone else holds the lock. Takes at most
    /// the runtime's [`try_timeout`](crate::LockRuntimeBuilder::try_timeout)
    /// (250 ms by default); no answer by then is [`LockError::Backend`].
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        match self.wait(Duration::ZERO).acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The runtime it asks (`NotInstalled`: made by [`lock`] with none).
    pub(crate) fn runtime(&self) -> Result<&LockRuntime, LockError> {
        self.runtime.as_ref().ok_or(LockError::NotInstalled)
    }

    /// How long it waits on `runtime` (`None`: as long as it takes).
    pub(crate) fn wait_on(&self, runtime: &LockRuntime) -> Option<Duration> {
        LockRequest::waited(self.wait, runtime)
    }

    fn waited(wait: Wait, runtime: &LockRuntime) -> Option<Duration> {
        match wait {
            Wait::Default => runtime.default_wait(),
            Wait::For(wait) => Some(wait),
            Wait::Forever => None,
        }
    }

    /// Whether `key` may be asked with this request's lease on `runtime`:
    /// what its acquire would refuse before any wait (the key, the lease,
    /// what the backend cannot take).
    pub(crate) fn check_key(&self, runtime: &LockRuntime, key: &str) -> Result<(), LockError> {
        validate_key(key)?;
        let lease = self.lease.unwrap_or(runtime.default_lease());
        validate_lease(lease)?;
        runtime
            .backend()
            .checked_lock_name(runtime.prefix(), key, lease)
            .map(drop)
    }

    /// This request's options for `key`, waiting `wait` (`None`: forever).
    pub(crate) fn for_key(&self, key: String, wait: Option<Duration>) -> LockRequest {
        LockRequest {
            runtime: self.runtime.clone(),
            key,
            wait: wait.map_or(Wait::Forever, Wait::For),
            ..*self
        }
    }

    /// The attribute's options over this request's.
    pub(crate) fn apply(mut self, options: Options) -> Self {
        if options.lease.is_some() {
            self.lease = options.lease;
        }
        if options.fair.is_some() {
            self.fair = options.fair;
        }
        if let Some(wait) = options.wait {
            self.wait = Wait::For(wait);
        }
        self.watchdog = options.watchdog;
        self.on_lost = options.on_lost;
        self.mode = options.mode;
        if options.permits.is_some() {
            self.permits = options.permits;
        }
        self
    }

    /// This request as an ordinary lock of `key` (a permit's, for
    /// `permits.rs`), waiting `wait` (`None`: forever).
    pub(crate) fn permit_lock(&self, key: String, wait: Option<Duration>) -> LockRequest {
        LockRequest {
            permits: None,
            ..self.for_key(key, wait)
        }
    }

    /// The mode asked for.
    pub(crate) fn mode_asked(&self) -> LockMode {
        self.mode
    }

    /// Acquires for `scope`, or for the scope current at the first poll
    /// (a fresh root outside any) when `None`.
    ///
    /// Not an `async fn`: one would keep the request in its state beside
    /// the acquisition it is moved into (a waiting acquire twice as big).
    pub(crate) fn acquire_as(
        self,
        scope: Option<Arc<Node>>,
    ) -> impl Future<Output = Result<LockGuard, LockError>> + Send {
        type Boxed = Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send>>;
        // (The permit paths boxed: kept out of every ordinary acquire's state.)
        let permits: Boxed = match self.permits {
            Some(permits) => Box::pin(async move {
                let scope = scope.unwrap_or_else(owner::current_or_root);
                crate::permits::acquire(self, permits, scope).await
            }),
            // In a permit body of the same key: that permit (`permits.rs`).
            None => match owner::permit_held_of(&self.key) {
                Some(permit) => Box::pin(crate::permits::reenter(self, permit, scope)),
                None => return Either::Right(self.acquire_lock(scope)),
            },
        };
        Either::Left(permits)
    }

    /// [`acquire_as`](Self::acquire_as) for an ordinary lock (a permit's
    /// too: `permits` is not looked at).
    pub(crate) async fn acquire_lock(
        self,
        scope: Option<Arc<Node>>,
    ) -> Result<LockGuard, LockError> {
        // Taken apart at once: a request kept whole (partly moved) would
        // stay in every waiting acquire's state.
        let LockRequest {
            runtime,
            key,
            lease,
            wait,
            watchdog,
            fair: fair_asked,
            mode,
            ..
        } = self;
        let scope = scope.unwrap_or_else(owner::current_or_root);
        let runtime = runtime.ok_or(LockError::NotInstalled)?;
        validate_key(&key)?;
        if let Some(held) = owner::out_of_order(&scope, &key) {
            return Err(LockError::OrderRefused { key, held });
        }
        let lease = lease.unwrap_or(runtime.default_lease());
        validate_lease(lease)?;
        let wait = LockRequest::waited(wait, &runtime);
        let lock_key = runtime
            .backend()
            .checked_lock_name(runtime.prefix(), &key, lease)?;
        if let (Some(true), Some(why)) = (fair_asked, runtime.backend().fair_unsupported()) {
            return Err(LockError::InvalidConfig(why.to_owned()));
        }
        let fair = runtime.backend().always_fair()
            || (fair_asked.unwrap_or(runtime.default_fair())
                && runtime.backend().queues_across_processes());
        let want = Want {
            key,
            lock_key,
            scope,
            lease,
            wait,
            renew: watchdog,
            fair,
            mode,
        };
        let context = runtime.clone();
        let acquisition = traced(runtime, want);
        let guard = context.run(acquisition).await?;
        if context.is_shut_down() {
            // Shut down while this acquire was in flight: give it back.
            drop(guard);
            return Err(LockError::ShutDown);
        }
        Ok(guard)
    }
}

impl LockRuntime {
    /// A request for the lock `key` on this runtime.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(Some(self.clone()), key.into())
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
    LockRequest::new(LockRuntime::global().ok(), key.into())
}

pub(crate) fn validate_key(key: &str) -> Result<(), LockError> {
    if key.is_empty() {
        return Err(LockError::invalid_key(key, "the key is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(LockError::invalid_key(
            key,
            "the key is longer than 4096 bytes; hash long identifiers first",
        ));
    }
    Ok(())
}

fn validate_lease(lease: Duration) -> Result<(), LockError> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(LockError::InvalidConfig(format!(
            "lease {lease:?} is out of range: use 10ms to 24h"
        )));
    }
    Ok(())
}

/// The acquisition of `want`, inside a `lock_acquire` span (key, mode;
/// `acquire::ended` fills in the wait and the outcome). Without a subscriber
/// the span is `Span::none()`: no allocation, and one pointer in the
/// acquire's state (`Traced`). A plain fn, not inline in `acquire_as`: a
/// span built there would take its full size in every waiting acquire.
fn traced(
    runtime: LockRuntime,
    want: Want,
) -> Traced<impl Future<Output = Result<LockGuard, LockError>>> {
    // (The name is `acquire::ACQUIRE_SPAN`.)
    let span = tracing::debug_span!(
        "lock_acquire",
        key = %want.key,
        mode = if want.fair { "fair" } else { "plain" },
        waited_us = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    Traced::new(span, Acquisition::new(runtime, want).run())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_leases_are_checked() {
        assert!(validate_key("").is_err());
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
        assert!(validate_key("order:{42}\nnewline").is_ok());
        assert!(validate_lease(Duration::from_millis(9)).is_err());
        assert!(validate_lease(Duration::from_secs(24 * 3600 + 1)).is_err());
        assert!(validate_lease(Duration::from_secs(30)).is_ok());
    }
}
