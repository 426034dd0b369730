//! Asking for a lock: [`LockRequest`], the wait loop, and [`with_lock`].
//!
//! An acquire first looks for a hold of the same owner scope in this runtime
//! (re-entry costs no round trip). Otherwise it sends one acquire script; if
//! the lock is busy it registers as a waiter of the key (subscribing to the
//! key's release channel), retries once, and then sleeps until a release
//! message, the holder's remaining lease, or its own deadline — whichever
//! comes first. There is no fixed-interval polling anywhere.
//!
//! Cancellation is safe at every await: an acquire dropped while its script
//! is in flight queues a release of its (unique) holder id, which frees the
//! lock if the script did take it and does nothing otherwise.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Acquire, LockNames};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::held::HeldLock;
use crate::owner::{self, Scope};
use crate::runtime::LockRuntime;

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
    wait: Option<Option<Duration>>,
    watchdog: bool,
    on_lost: OnLost,
}

impl LockRequest {
    pub(crate) fn new(runtime: Option<LockRuntime>, key: String) -> Self {
        LockRequest {
            runtime,
            key,
            lease: None,
            wait: None,
            watchdog: true,
            on_lost: OnLost::Abort,
        }
    }

    /// The lease: how long the lock outlives a holder that stops renewing it
    /// (crash, partition). Default: the runtime's (30 s unless configured).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The longest time to wait for a busy lock; `Duration::ZERO` tries once.
    /// Default: the runtime's (forever unless configured).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(Some(wait));
        self
    }

    /// Waits as long as it takes, whatever the runtime's default.
    pub fn wait_forever(mut self) -> Self {
        self.wait = Some(None);
        self
    }

    /// Whether the watchdog renews the lease while the lock is held (default
    /// `true`). With `false` the lease is fixed: the lock is lost when it ends.
    pub fn watchdog(mut self, renew: bool) -> Self {
        self.watchdog = renew;
        self
    }

    /// What [`with_lock`] does when the lock is lost while the body runs.
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
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
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let owner = owner::current_or_new_owner();
        self.acquire_as(owner).await
    }

    /// Tries once: `Ok(None)` when someone else holds the lock.
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        match self.wait(Duration::ZERO).acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn apply(
        mut self,
        lease: Option<Duration>,
        wait: Option<Duration>,
        watchdog: bool,
        on_lost: OnLost,
    ) -> Self {
        if lease.is_some() {
            self.lease = lease;
        }
        if let Some(wait) = wait {
            self.wait = Some(Some(wait));
        }
        self.watchdog = watchdog;
        self.on_lost = on_lost;
        self
    }

    async fn acquire_as(self, owner: u64) -> Result<LockGuard, LockError> {
        let runtime = self.runtime.ok_or(LockError::NotInstalled)?;
        validate_key(&self.key)?;
        let lease = self.lease.unwrap_or(runtime.default_lease());
        validate_lease(lease)?;
        let wait = self.wait.unwrap_or(runtime.default_wait());
        let hash = LockNames::hash(runtime.prefix(), &self.key);
        let want = Want {
            key: self.key,
            hash,
            owner,
            lease,
            wait,
            renew: self.watchdog,
        };
        wait_loop(runtime, want).await
    }
}

fn validate_key(key: &str) -> Result<(), LockError> {
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

/// A validated request.
struct Want {
    key: String,
    hash: String,
    owner: u64,
    lease: Duration,
    wait: Option<Duration>,
    renew: bool,
}

/// Queues a release of `holder` if dropped before disarmed: an acquire
/// script may have taken the lock after its caller gave up.
struct InFlight<'a> {
    runtime: &'a LockRuntime,
    hash: &'a str,
    holder: Option<String>,
}

impl InFlight<'_> {
    fn disarm(mut self) -> String {
        self.holder.take().unwrap_or_default()
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(holder) = self.holder.take() {
            self.runtime
                .backend()
                .release_in_background(self.hash.to_owned(), holder);
        }
    }
}

/// Backoff between attempts while the backend fails (bounded waits only).
const ERROR_BACKOFF_MIN: Duration = Duration::from_millis(20);
const ERROR_BACKOFF_MAX: Duration = Duration::from_millis(500);

async fn wait_loop(runtime: LockRuntime, want: Want) -> Result<LockGuard, LockError> {
    let start = Instant::now();
    // A wait too long to represent (`Duration::MAX`) is a wait forever.
    let deadline = want.wait.and_then(|w| start.checked_add(w));
    let timeout = |want: &Want| LockError::Timeout {
        key: want.key.clone(),
        waited: start.elapsed(),
    };
    let mut ticket = None;
    let mut backoff = ERROR_BACKOFF_MIN;
    let mut first = true;
    loop {
        if let Some(held) = runtime.table().reenter(&want.hash, want.owner) {
            return Ok(LockGuard::new(runtime, held));
        }
        // Past the deadline only the very first attempt (`wait(ZERO)`) is sent.
        if !first && deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(timeout(&want));
        }
        if std::mem::take(&mut first) && want.wait != Some(Duration::ZERO) {
            // Fairness: when callers of this process already wait for the key,
            // queue behind them (the release wakes the longest waiter first)
            // instead of racing them to the backend.
            if let Some(queued) = queue_behind_local_waiters(&runtime, &want, deadline).await {
                ticket = Some(queued);
                continue;
            }
        }
        // Listen before trying, so a release between the try and the sleep
        // is not missed.
        let slot = ticket
            .as_ref()
            .map(|t: &crate::waiters::WaitTicket| t.slot().clone());
        let mut woken = pin!(slot.as_ref().map(|s| s.wake.notified()));
        if let Some(woken) = woken.as_mut().as_pin_mut() {
            woken.enable();
        }

        let holder = owner::new_holder_id();
        let in_flight = InFlight {
            runtime: &runtime,
            hash: &want.hash,
            holder: Some(holder),
        };
        let sent_at = Instant::now();
        let attempt = runtime.backend().acquire(
            &want.hash,
            in_flight.holder.as_deref().unwrap_or_default(),
            want.lease,
        );
        let outcome = match deadline {
            Some(d) if d > sent_at => match tokio::time::timeout_at(d, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => return Err(timeout(&want)), // in_flight releases
            },
            _ => attempt.await,
        };
        let ttl = match outcome {
            Ok(Acquire::Held { fence }) => {
                let holder = in_flight.disarm();
                // Leave the queue first: `adopt` wakes the waiters of this
                // scope (to re-enter), and we are no longer one of them.
                if let Some(ticket) = ticket.take() {
                    ticket.leave_with_lock();
                }
                let held = HeldLock::new(
                    want.key, want.hash, holder, want.owner, fence, want.lease, want.renew,
                );
                return Ok(runtime.adopt(held, sent_at));
            }
            Ok(Acquire::Busy { ttl }) => {
                in_flight.disarm();
                backoff = ERROR_BACKOFF_MIN;
                ttl
            }
            Err(error) => {
                drop(in_flight);
                // A bounded wait rides out backend trouble until its deadline
                // (then `Timeout`); an unbounded one reports it at once.
                let Some(d) = deadline else {
                    return Err(error.into());
                };
                if Instant::now() >= d {
                    return Err(error.into());
                }
                tracing::debug!(%error, "lock acquire failed; retrying until the deadline");
                tokio::time::sleep_until((Instant::now() + backoff).min(d)).await;
                backoff = (backoff * 2).min(ERROR_BACKOFF_MAX);
                continue;
            }
        };

        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(timeout(&want));
        }
        let Some(registered) = &ticket else {
            // First miss: become a waiter of this key, then try again at once.
            let new_ticket = runtime
                .waiters()
                .register(LockNames::channel(&want.hash), want.owner);
            let ready = new_ticket.ready();
            match deadline {
                Some(d) => {
                    let _ = tokio::time::timeout_at(d, ready).await;
                }
                None => ready.await,
            }
            ticket = Some(new_ticket);
            continue;
        };
        let _ = registered;
        // Sleep until a release message, the holder's lease, or our deadline.
        let lease_end = now
            .checked_add(ttl.unwrap_or(want.lease))
            .unwrap_or(now + want.lease);
        let wake_at = deadline.map_or(lease_end, |d| d.min(lease_end));
        tokio::select! {
            _ = async { if let Some(w) = woken.as_mut().as_pin_mut() { w.await } } => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }
}

/// Registers as a waiter and sleeps until woken (or the lease or deadline
/// passes) if other local callers are already waiting for the key.
async fn queue_behind_local_waiters(
    runtime: &LockRuntime,
    want: &Want,
    deadline: Option<Instant>,
) -> Option<crate::waiters::WaitTicket> {
    let waiters = runtime.waiters();
    if waiters.waiting_keys() == 0 {
        return None;
    }
    let channel = LockNames::channel(&want.hash);
    if !waiters.is_waiting(&channel) {
        return None;
    }
    let ticket = waiters.register(channel, want.owner);
    let lease_end = Instant::now() + want.lease;
    let wake_at = deadline.map_or(lease_end, |d| d.min(lease_end));
    tokio::select! {
        () = ticket.slot().wake.notified() => {}
        () = tokio::time::sleep_until(wake_at) => {}
    }
    Some(ticket)
}

/// Runs `body` while holding the lock of `request`, and releases it after.
///
/// The body runs in the request's owner scope, so locked calls nested inside
/// it re-enter, and [`fence`](crate::fence) returns this lock's token there.
/// If the lock is lost while the body runs, [`OnLost::Abort`] (the default)
/// drops the body at its next await and returns `Err(LockError::Lost)`;
/// [`OnLost::Continue`] lets it finish and logs the loss. A panic or a
/// cancelled call frees the lock through the runtime's background releaser.
///
/// This is what `#[distributed_lock]` expands to.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{lock, with_lock, LockError};
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// let total = with_lock(lock("cart:9"), async {
///     // Nested use of the same key re-enters instead of waiting on itself.
///     with_lock(lock("cart:9"), async { Ok::<_, LockError>(2) }).await
/// })
/// .await?;
/// assert_eq!(total, 2);
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub async fn with_lock<T, E, F>(request: LockRequest, body: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let on_lost = request.on_lost;
    let owner = owner::current_or_new_owner();
    let guard = request.acquire_as(owner).await?;
    let scope = Scope {
        owner,
        fence: Some(guard.fence()),
    };
    let body = owner::enter(scope, body);
    let result = match on_lost {
        OnLost::Abort => {
            let held: &Arc<HeldLock> = guard.held();
            tokio::select! {
                biased;
                result = body => result,
                () = held.lost() => {
                    let key = guard.key().to_owned();
                    drop(guard);
                    return Err(LockError::Lost { key }.into());
                }
            }
        }
        OnLost::Continue => body.await,
    };
    match guard.release().await {
        Ok(()) => result,
        Err(LockError::Lost { key } | LockError::NotHeld { key })
            if on_lost == OnLost::Abort && result.is_ok() =>
        {
            Err(LockError::Lost { key }.into())
        }
        Err(error) => {
            tracing::warn!(%error, "lock trouble after the body finished; returning its result");
            result
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// The locked future is `Send` whenever the body is, so annotated
    /// handlers stay usable with `tokio::spawn` and multi-threaded servers.
    #[test]
    fn locked_future_is_send_when_the_body_is() {
        let request = LockRequest::new(None, "k".to_owned());
        let fut = with_lock(request, async { Ok::<_, LockError>(1) });
        assert_send(&fut);
        let fut =
            crate::__private::locked("k".to_owned(), crate::__private::Options::DEFAULT, async {
                Ok::<_, LockError>(())
            });
        assert_send(&fut);
    }

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
