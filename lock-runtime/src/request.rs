//! Asking for a lock: [`LockRequest`], the wait loop, and [`with_lock`].
//!
//! An acquire first looks for a hold of the same owner scope in this runtime
//! (re-entry costs no round trip). Otherwise it sends one acquire script; if
//! the lock is busy it registers as a waiter of the key (subscribing to the
//! key's release channel), retries once, and then sleeps until a release
//! message, the holder's remaining lease, or its own deadline — whichever
//! comes first. There is no polling for the lock. (In fair mode the first
//! waiter of a key in each process also refreshes the process's place in the
//! key's Redis queue, once a second or a third of the handoff claim, at least
//! 50 ms apart: a heartbeat, not a retry loop; the handoff itself arrives by
//! message.)
//!
//! Cancellation is safe at every await: an acquire dropped while its script
//! is in flight queues a release of its (unique) holder id, which frees the
//! lock if the script did take it and does nothing otherwise.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::time::Instant;

use crate::backend::{Acquire, Queue, QUEUE_ENTRY_LIFE};
use crate::error::{BackendError, LockError};
use crate::guard::LockGuard;
use crate::held::{HeldLock, Hold, Reentry};
use crate::names::LockNames;
use crate::owner::{self, Node, Scope};
use crate::runtime::LockRuntime;
use crate::waiters::{Handoff, WaitTicket};

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
    fair: Option<bool>,
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
            fair: None,
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

    /// First come, first served across processes (default: the runtime's,
    /// off unless [`LockRuntimeBuilder::fair`](crate::LockRuntimeBuilder::fair)).
    ///
    /// With Redis, a waiter that finds the lock busy joins a queue in Redis,
    /// and a release hands the lock straight to the first live waiter in it:
    /// strict arrival order between processes (within a process waiters are
    /// always served in order), and a handoff costs no acquire round trip.
    /// The lock is handed over with a claim of at most 3 s, which the new
    /// holder's watchdog extends to its lease (with `watchdog(false)`, with
    /// the whole fixed lease). The price: a waiting process refreshes its
    /// place once a second, and a waiter that dies while queued may be handed
    /// the lock in the 3 s before its place runs out, which then stays taken
    /// until the claim runs out. Use the same mode for every caller of a key:
    /// plain acquires do not queue and may take a lock freed by expiry before
    /// queued waiters do. The embedded backend is always in order.
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = Some(fair);
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

    pub(crate) fn apply(
        mut self,
        lease: Option<Duration>,
        wait: Option<Duration>,
        watchdog: bool,
        on_lost: OnLost,
        fair: Option<bool>,
    ) -> Self {
        if lease.is_some() {
            self.lease = lease;
        }
        if fair.is_some() {
            self.fair = fair;
        }
        if let Some(wait) = wait {
            self.wait = Some(Some(wait));
        }
        self.watchdog = watchdog;
        self.on_lost = on_lost;
        self
    }

    /// Acquires for `scope`, or for the scope current at the first poll
    /// (a fresh root outside any) when `None`.
    async fn acquire_as(self, scope: Option<Arc<Node>>) -> Result<LockGuard, LockError> {
        let scope = scope.unwrap_or_else(owner::current_or_root);
        let runtime = self.runtime.ok_or(LockError::NotInstalled)?;
        validate_key(&self.key)?;
        let lease = self.lease.unwrap_or(runtime.default_lease());
        validate_lease(lease)?;
        let wait = self.wait.unwrap_or(runtime.default_wait());
        let hash = LockNames::hash(runtime.prefix(), &self.key);
        let fair = self.fair.unwrap_or(runtime.default_fair())
            && runtime.backend().queues_across_processes();
        let want = Want {
            key: self.key,
            hash,
            scope,
            lease,
            wait,
            renew: self.watchdog,
            fair,
        };
        let context = runtime.clone();
        let guard = context.run(wait_loop(runtime, want)).await?;
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
    /// The scope the hold will belong to.
    scope: Arc<Node>,
    lease: Duration,
    wait: Option<Duration>,
    renew: bool,
    /// Fair mode (Redis only).
    fair: bool,
}

impl Want {
    /// The lease a fair release hands the lock over with: for a renewed lock
    /// a claim of at most the queue entry's life, which the watchdog extends
    /// to the full lease soon after (so a waiter that died just before its
    /// turn costs the key seconds, not a whole lease); a fixed lease as is.
    fn handoff_lease(&self) -> Duration {
        if self.renew {
            self.lease.min(QUEUE_ENTRY_LIFE)
        } else {
            self.lease
        }
    }

    /// The shortest handoff claim this waiter may take without a round trip:
    /// the watchdog extends a renewed lock, but nothing extends a fixed one.
    fn minimum_claim(&self) -> Duration {
        if self.renew {
            Duration::ZERO
        } else {
            self.lease
        }
    }

    fn hold(self, holder: String, fence: u64) -> Hold {
        Hold {
            key: self.key,
            hash: self.hash,
            holder,
            owner: self.scope.id,
            fence,
            lease: self.lease,
            renew: self.renew,
            fair: self.fair,
        }
    }
}

/// The holder id of one attempt. A fresh id is released in the background if
/// this is dropped while still armed: an acquire script may have taken the
/// lock (or, in fair mode, queued the id) after its caller gave up. A fair
/// place's id is not: it belongs to the key's waiters, who give it back.
struct InFlight<'a> {
    runtime: &'a LockRuntime,
    hash: &'a str,
    holder: String,
    armed: bool,
    fair: bool,
}

impl InFlight<'_> {
    fn disarm(&mut self) -> String {
        self.armed = false;
        std::mem::take(&mut self.holder)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.runtime.backend().release_in_background(
                self.hash.to_owned(),
                std::mem::take(&mut self.holder),
                self.fair,
            );
        }
    }
}

/// The shortest refresh of a fair-mode place (for very short leases, whose
/// handoff claim may then run out before it is taken from the message; the
/// waiter's next attempt claims it instead).
const QUEUE_REFRESH_MIN: Duration = Duration::from_millis(50);

/// How often a fair-mode waiter refreshes its place (a third of its life).
const QUEUE_REFRESH: Duration = Duration::from_millis(QUEUE_ENTRY_LIFE.as_millis() as u64 / 3);

/// Backoff between attempts while the backend fails (bounded waits only).
const ERROR_BACKOFF_MIN: Duration = Duration::from_millis(20);
const ERROR_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// How long after the holder's known lease end a waiter queued behind
/// others of its process tries by itself (the head tries at the lease end).
const QUEUED_SLACK: Duration = Duration::from_millis(20);

/// The acquisition: re-entry, handoffs, attempts and sleeps until the lock
/// is ours or the wait ends. (An `async` block, not an `async fn`: the
/// latter would keep a second copy of `want` in every waiting acquire.)
#[allow(clippy::manual_async_fn)]
fn wait_loop(
    runtime: LockRuntime,
    want: Want,
) -> impl Future<Output = Result<LockGuard, LockError>> {
    async move {
        let start = Instant::now();
        // A wait too long to represent (`Duration::MAX`) is a wait forever.
        let deadline = want.wait.and_then(|w| start.checked_add(w));
        let try_once = want.wait == Some(Duration::ZERO);
        let timeout = |want: &Want| {
            let (key, waited) = (want.key.clone(), start.elapsed());
            // A wait for a hold of this very task is the likely mistake of a
            // guard or locked call still alive around the waiting call: say so.
            if !try_once && runtime.table().held_by_this_task(&want.hash) {
                LockError::SelfDeadlock { key, waited }
            } else {
                LockError::Timeout { key, waited }
            }
        };
        let mut ticket: Option<WaitTicket> = None;
        let mut backoff = ERROR_BACKOFF_MIN;
        let mut first = true;
        // The attempt about to go out is the last one: the try-once, or the one
        // try a bounded wait makes after its deadline passed while it slept.
        let mut last_try = false;
        loop {
            if runtime.is_shut_down() {
                return Err(LockError::ShutDown);
            }
            // Re-entry, strict nesting: only below the innermost hold.
            match runtime.table().reenter(&want.hash, &want.scope) {
                Reentry::Held(held, frame) => {
                    return Ok(LockGuard::new(runtime, held, frame, want.scope.clone()))
                }
                Reentry::Sibling => {
                    // A sibling scope is inside: wait for it in the process.
                    // (Boxed: a rare path, kept out of every waiting acquire's state.)
                    let table = runtime.table();
                    let turn = Box::pin(table.frames_changed(&want.hash, &want.scope, deadline));
                    match turn.await {
                        Reentry::Held(held, frame) => {
                            return Ok(LockGuard::new(runtime, held, frame, want.scope.clone()))
                        }
                        Reentry::Sibling => {
                            return Err(LockError::Timeout {
                                key: want.key.clone(),
                                waited: start.elapsed(),
                            })
                        }
                        Reentry::No => continue,
                    }
                }
                Reentry::No => {}
            }
            // Fair mode: a release may have handed the lock to our place. (A
            // fixed lease longer than the handoff's claim is not taken from the
            // message: the attempt below claims it and sets the full lease.)
            let handoff = match &ticket {
                Some(ticket) if want.fair => ticket.take_handoff(want.minimum_claim()),
                _ => None,
            };
            if let Some(handoff) = handoff {
                if let Some(ticket) = ticket.take() {
                    ticket.leave_with_lock(true);
                }
                return Ok(adopt_handoff(&runtime, want, handoff));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                if last_try {
                    return Err(timeout(&want));
                }
                last_try = true;
            }
            // Fairness: when callers of this process already wait for the key,
            // queue behind them (the release wakes the longest waiter first)
            // instead of racing them to the backend: no attempt, straight to
            // the sleep below.
            let queued_behind = std::mem::take(&mut first)
                && !last_try
                && match queue_behind_local_waiters(&runtime, &want) {
                    Some(queued) => {
                        ticket = Some(queued);
                        true
                    }
                    None => false,
                };
            // Listen before trying, so a release between the try and the sleep
            // is not missed.
            let slot = ticket.as_ref().map(|t| t.slot().clone());
            let mut woken = pin!(slot.as_ref().map(|s| s.wake.notified()));
            if let Some(woken) = woken.as_mut().as_pin_mut() {
                woken.enable();
            }

            // The holder's remaining lease, as the attempt's reply gave it (none
            // known when queued behind local waiters).
            let (now, ttl) = if queued_behind {
                (Instant::now(), None)
            } else {
                // Fair mode queues this process under one place per key; a first
                // attempt (no ticket yet) uses a fresh id, which may become the place.
                let (place, place_attempt) = match &ticket {
                    Some(ticket) if want.fair => match ticket.begin_attempt(want.handoff_lease()) {
                        Some((id, attempt)) => (Some(id), Some(attempt)),
                        None if last_try => {
                            // A sibling's attempt with our place is out, and it is
                            // our last chance: that attempt stands for ours.
                            return Err(timeout(&want));
                        }
                        None => {
                            // A sibling's attempt with our place is out: its outcome
                            // (or a handoff) wakes the head.
                            let now = Instant::now();
                            let cap = now + QUEUE_REFRESH;
                            let wake_at = deadline.map_or(cap, |d| d.min(cap));
                            tokio::select! {
                                _ = async { if let Some(w) = woken.as_mut().as_pin_mut() { w.await } } => {}
                                () = tokio::time::sleep_until(wake_at) => {}
                            }
                            continue;
                        }
                    },
                    _ => (None, None),
                };
                let mut in_flight = InFlight {
                    runtime: &runtime,
                    hash: &want.hash,
                    armed: place.is_none(),
                    holder: place.unwrap_or_else(owner::new_holder_id),
                    fair: want.fair,
                };
                let queue = match (want.fair, try_once) {
                    (false, _) => Queue::No,
                    (true, true) => Queue::Peek,
                    (true, false) => Queue::Join(want.handoff_lease()),
                };
                // The last try gets `try_timeout`; any other attempt ends with the wait.
                let bound = if last_try {
                    Some(Instant::now() + runtime.try_timeout())
                } else {
                    deadline
                };
                // A release of this key that this process queued (a dropped guard)
                // goes out first, so that the key is free for this process's next
                // acquire at once, as on the embedded backend. Briefly: a release
                // stuck on a dead connection must not hold up the attempt.
                if runtime.backend().release_pending(&want.hash) {
                    let settle_by = Instant::now() + runtime.try_timeout();
                    let settled = runtime.backend().releases_settled(&want.hash);
                    let by = bound.map_or(settle_by, |b| b.min(settle_by));
                    let _ = tokio::time::timeout_at(by, settled).await;
                }
                let sent_at = Instant::now();
                // Boxed: the backend's request future is large, and it would otherwise
                // sit inside every waiting acquire's state, also while it sleeps.
                let attempt = Box::pin(runtime.backend().acquire(
                    &want.hash,
                    &in_flight.holder,
                    want.lease,
                    queue,
                ));
                let outcome = match bound {
                    Some(b) => match tokio::time::timeout_at(b, attempt).await {
                        Ok(outcome) => outcome,
                        // (in_flight releases whatever the attempt may yet take)
                        Err(_) if try_once => {
                            return Err(BackendError::msg(format!(
                                "no answer from the lock backend within the try timeout ({:?})",
                                runtime.try_timeout()
                            ))
                            .into())
                        }
                        Err(_) => return Err(timeout(&want)),
                    },
                    None => attempt.await,
                };
                let ttl = match outcome {
                    Ok(Acquire::Held { .. })
                        if !in_flight.armed
                            && !ticket
                                .as_ref()
                                .is_some_and(|t| t.claim_place(&in_flight.holder)) =>
                    {
                        // Cannot happen with one attempt per place at a time (see
                        // `WaitTicket::begin_attempt`); if it did, the place's lock
                        // would be a sibling's: keep waiting.
                        in_flight.disarm();
                        None
                    }
                    Ok(Acquire::Held { fence, .. }) => {
                        let holder = in_flight.disarm();
                        drop(in_flight);
                        // Leave the queue first: `adopt` wakes the waiters of this
                        // scope (to re-enter), and we are no longer one of them.
                        if let Some(ticket) = ticket.take() {
                            ticket.leave_with_lock(want.fair);
                        }
                        let scope = want.scope.clone();
                        let held = HeldLock::new(want.hold(holder, fence));
                        let lease = held.lease;
                        return Ok(LockGuard::adopt(&runtime, held, scope, sent_at, lease));
                    }
                    Ok(Acquire::Busy { ttl }) => {
                        if let Some(ticket) = &ticket {
                            ticket.note_busy(ttl.and_then(|t| sent_at.checked_add(t)));
                            if want.fair {
                                ticket.confirm_place(&in_flight.holder, sent_at);
                            }
                        }
                        // A fair first attempt stays armed: its id is queued in Redis
                        // and must be given back unless it becomes the place below.
                        if !(want.fair && matches!(queue, Queue::Join(_)) && in_flight.armed) {
                            in_flight.disarm();
                        }
                        backoff = ERROR_BACKOFF_MIN;
                        ttl
                    }
                    Err(error) => {
                        // A place whose attempt failed is given up: the attempt may
                        // still reach Redis (a dropped connection), and what it does
                        // there must not be left to a place nobody uses.
                        if let (Some(ticket), Some(_)) = (&ticket, &place_attempt) {
                            if let Some(old) = ticket.abandon_place(&in_flight.holder) {
                                runtime.backend().release_in_background(
                                    want.hash.clone(),
                                    old,
                                    true,
                                );
                            }
                        }
                        drop(place_attempt);
                        drop(in_flight);
                        // A bounded wait rides out backend trouble until its deadline
                        // (then `Timeout`); an unbounded one reports it at once.
                        let Some(d) = deadline else {
                            return Err(error.into());
                        };
                        if last_try || Instant::now() >= d {
                            return Err(error.into());
                        }
                        tracing::debug!(%error, "lock acquire failed; retrying until the deadline");
                        tokio::time::sleep_until((Instant::now() + backoff).min(d)).await;
                        backoff = (backoff * 2).min(ERROR_BACKOFF_MAX);
                        continue;
                    }
                };
                // The reply is handled: siblings may use the place (and take a
                // handoff that came meanwhile) again.
                drop(place_attempt);

                let now = Instant::now();
                if last_try || deadline.is_some_and(|d| now >= d) {
                    return Err(timeout(&want));
                }
                if ticket.is_none() {
                    // First miss: become a waiter of this key, then try again at once.
                    if runtime.table().held_by_this_task(&want.hash) {
                        tracing::warn!(
                            key = %want.key,
                            "waiting for a lock that this same task holds (a guard from `acquire()` or \
                             a locked call still alive): unless another branch of this task releases \
                             it, this wait ends only with its deadline; run the call inside \
                             `guard.scope(...)` to re-enter"
                        );
                    }
                    let new_ticket = runtime
                        .waiters()
                        .register(want.hash.clone(), want.scope.clone());
                    new_ticket.note_busy(ttl.and_then(|t| sent_at.checked_add(t)));
                    if in_flight.armed {
                        // Fair mode: our first attempt queued its id in Redis.
                        let queued = in_flight.disarm();
                        if let Some(extra) =
                            new_ticket.adopt_place(queued, sent_at, want.handoff_lease())
                        {
                            runtime
                                .backend()
                                .release_in_background(want.hash.clone(), extra, true);
                        }
                    }
                    let ready = new_ticket.ready();
                    match deadline {
                        Some(d) => {
                            let _ = tokio::time::timeout_at(d, ready).await;
                        }
                        None => ready.await,
                    }
                    ticket = Some(new_ticket);
                    continue;
                }
                (now, ttl)
            };
            let Some(registered) = &ticket else {
                continue; // (registered above: not reached)
            };
            // Sleep until a release message, the holder's lease end, or our
            // deadline (in fair mode the head also wakes to refresh the
            // process's place).
            let fallback = now
                .checked_add(ttl.unwrap_or(want.lease))
                .unwrap_or(now + want.lease);
            let refresh_at = (want.fair && registered.is_head()).then(|| {
                // Often enough that the place stays alive, and that most of a
                // handoff's claim is still ahead when it is taken (its lease is
                // counted from the last refresh before it).
                now + QUEUE_REFRESH
                    .min(want.handoff_lease() / 3)
                    .max(QUEUE_REFRESH_MIN)
            });
            sleep_for_turn(registered, woken.as_mut(), deadline, fallback, refresh_at).await;
        }
    }
}

/// Sleeps until `woken` fires, the key's holder's lease ends (by the latest
/// news of any waiter or hold of this process; `fallback` when there is
/// none), `deadline`, or `refresh_at`. News that the lease ends sooner wakes
/// the sleeper early; news that it ends later (another local attempt or
/// hold learned it) keeps it asleep: either way no waiter sleeps past the
/// holder's lease as this process knows it. Waiters behind the head wake
/// [`QUEUED_SLACK`] later, so the head's attempt usually brings the news.
async fn sleep_for_turn(
    ticket: &WaitTicket,
    mut woken: Pin<&mut Option<Notified<'_>>>,
    deadline: Option<Instant>,
    fallback: Instant,
    refresh_at: Option<Instant>,
) {
    loop {
        let changed = ticket.busy_changed();
        let slack = if ticket.is_head() {
            Duration::ZERO
        } else {
            QUEUED_SLACK
        };
        let lease_end = ticket.busy_until().map_or(fallback, |u| u + slack);
        let mut wake_at = deadline.map_or(lease_end, |d| d.min(lease_end));
        if let Some(refresh) = refresh_at {
            wake_at = wake_at.min(refresh);
        }
        tokio::select! {
            _ = async { if let Some(w) = woken.as_mut().as_pin_mut() { w.await } } => return,
            () = changed => {}
            () = tokio::time::sleep_until(wake_at) => {
                let now = Instant::now();
                let news_later = ticket.busy_until().is_some_and(|u| u + slack > now);
                let must_wake = deadline.is_some_and(|d| now >= d)
                    || refresh_at.is_some_and(|r| now >= r);
                if must_wake || !news_later {
                    return;
                }
            }
        }
    }
}

/// Holds a lock that a fair release handed to this process's place. Its
/// backend lease ends after `since` + the handoff lease (the shortest that
/// the place's entry carried); the watchdog counts from there.
fn adopt_handoff(runtime: &LockRuntime, want: Want, handoff: Handoff) -> LockGuard {
    let scope = want.scope.clone();
    let held = HeldLock::new(want.hold(handoff.holder, handoff.fence));
    LockGuard::adopt(runtime, held, scope, handoff.since, handoff.lease)
}

/// Registers as a waiter of the key if other local callers already wait
/// for it (they are served first: the release wakes the longest waiter).
fn queue_behind_local_waiters(runtime: &LockRuntime, want: &Want) -> Option<WaitTicket> {
    let waiters = runtime.waiters();
    if waiters.waiting_keys() == 0 {
        return None;
    }
    if !waiters.is_waiting(&want.hash) {
        return None;
    }
    Some(waiters.register(want.hash.clone(), want.scope.clone()))
}

/// Runs `body` while holding the lock of `request`, and releases it after.
///
/// The body runs in an owner scope of its own, a child of the caller's, so
/// locked calls nested inside it re-enter, and [`fence`](crate::fence)
/// returns this lock's token there. Re-entry is strict nesting: two locked
/// calls on the same key running side by side inside the body (both arms of
/// a `join!`) do not both enter; the second waits, in the process and without
/// a round trip, until the first is done, then re-enters in turn.
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
    // The body runs in a scope of its own, a child of the caller's.
    let node = owner::new_child();
    let guard = request.acquire_as(Some(node.clone())).await?;
    let scope = Scope {
        node,
        fence: Some(guard.fence()),
    };
    let body = owner::enter(scope, body);
    let result = match on_lost {
        OnLost::Abort => {
            let held: &Arc<HeldLock> = guard.held();
            tokio::select! {
                biased;
                result = body => result,
                () = guard.runtime().run(held.lost()) => {
                    let key = guard.key().to_owned();
                    let shut_down = guard.runtime().is_shut_down();
                    drop(guard);
                    return Err(if shut_down {
                        LockError::ShutDown
                    } else {
                        LockError::Lost { key }
                    }
                    .into());
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
        Err(LockError::ShutDown) if on_lost == OnLost::Abort && result.is_ok() => {
            Err(LockError::ShutDown.into())
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

    /// Every waiting acquire keeps this state for as long as it waits
    /// (bench S7: resident bytes per waiting task). Past causes of growth:
    /// an `async fn` wrapper keeping a second copy of what it wraps, and
    /// parameters of an `async fn` copied into locals.
    #[tokio::test]
    async fn a_waiting_acquire_stays_small() {
        let runtime = LockRuntime::builder().memory().build().await.unwrap();
        let acquire = runtime.lock("k").acquire();
        let size = std::mem::size_of_val(&acquire);
        assert!(size <= 1280, "an acquire() future takes {size} bytes");
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
