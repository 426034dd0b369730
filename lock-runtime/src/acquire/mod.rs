//! One acquisition, as named steps: [`Acquisition::run`].
//!
//! An acquire first takes what needs no round trip: a re-entry (a hold of
//! its own scope's ancestry in this runtime) or, in fair mode, a handoff that
//! a release made to this process's place. Otherwise it sends one acquire
//! script; if the lock is busy it registers as a waiter of the key
//! (subscribing to the key's release news), retries once, and then sleeps
//! until a release, the holder's remaining lease, or its own deadline —
//! whichever comes first. There is no polling for the lock. (In fair mode
//! the process's place in the key's Redis queue is kept alive by the
//! watchdog's tick, in batches: see `waiters/fair.rs`; the handoff itself
//! arrives by message.) While the backend fails, a bounded wait backs off
//! and retries until its deadline.
//!
//! Cancellation is safe at every await: an acquire dropped while its script
//! is in flight queues a release of its (unique) holder id, which frees the
//! lock if the script did take it and does nothing otherwise.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::QUEUE_ENTRY_LIFE;
use crate::cohort::Terms;
use crate::error::{BackendError, LockError, TimeoutCause};
use crate::guard::{LockGuard, Unentered};
use crate::held::Hold;
use crate::meter::{self, Outcome};
use crate::mode::LockMode;
use crate::owner::Node;
use crate::runtime::LockRuntime;
use crate::waiters::WaitTicket;

mod attempt;
mod local;
mod script;
mod wake;

use attempt::Attempted;

/// How long a fair-mode waiter whose place another local waiter's attempt
/// is using sleeps at most (a third of a queue entry's life).
const QUEUE_REFRESH: Duration = Duration::from_millis(QUEUE_ENTRY_LIFE.as_millis() as u64 / 3);

/// Backoff between attempts while the backend fails (bounded waits only).
const ERROR_BACKOFF_MIN: Duration = Duration::from_millis(20);
const ERROR_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// How long after the holder's known lease end a waiter queued behind
/// others of its process tries by itself (the head tries at the lease end).
const QUEUED_SLACK: Duration = Duration::from_millis(20);

/// The name of the span around an acquire (see `request.rs`).
pub(crate) const ACQUIRE_SPAN: &str = "lock_acquire";

/// What a validated request asks for.
pub(crate) struct Want {
    /// The key as the caller gave it.
    pub(crate) key: String,
    /// The lock's name in the backend.
    pub(crate) lock_key: String,
    /// The owner scope the hold will belong to.
    pub(crate) scope: Arc<Node>,
    pub(crate) lease: Duration,
    /// `None`: wait for ever.
    pub(crate) wait: Option<Duration>,
    /// Whether the watchdog renews the lease.
    pub(crate) renew: bool,
    /// Fair mode (backends that queue across processes only).
    pub(crate) fair: bool,
    /// Read, write or exclusive.
    pub(crate) mode: LockMode,
}

/// Reports how an acquisition ended, and passes it on: the fields
/// `waited_us` and `outcome` of the `lock_acquire` span around the acquire
/// (opened in `request.rs`), a `lock_acquire` debug event with key, mode,
/// wait and outcome (nothing without a subscriber), and the acquisition
/// metrics (nothing without the feature `metrics`).
fn ended(
    key: &str,
    fair: bool,
    try_once: bool,
    start: Instant,
    outcome: Result<LockGuard, LockError>,
) -> Result<LockGuard, LockError> {
    // A new hold took the request's key (`Acquisition::hold`): the guard
    // has it.
    let key = match &outcome {
        Ok(guard) => guard.key(),
        Err(_) => key,
    };
    let reported = match &outcome {
        Ok(_) => Outcome::Acquired,
        Err(LockError::Timeout { .. }) if try_once => Outcome::Busy,
        Err(LockError::Timeout { .. }) => Outcome::Timeout,
        Err(LockError::SelfDeadlock { .. }) => Outcome::SelfDeadlock,
        Err(LockError::ShutDown) => Outcome::ShutDown,
        Err(_) => Outcome::Error,
    };
    let waited = start.elapsed();
    meter::acquire_ended(key, reported, waited);
    let waited_us = waited.as_micros() as u64;
    let name = reported.as_str();
    if tracing::enabled!(tracing::Level::DEBUG) {
        let span = tracing::Span::current();
        // Only our own span: when a filter dropped it, the current span is
        // the caller's, whose fields are not ours to fill.
        if span.metadata().is_some_and(|m| m.name() == ACQUIRE_SPAN) {
            span.record("waited_us", waited_us);
            span.record("outcome", name);
        }
    }
    let mode = if fair { "fair" } else { "plain" };
    tracing::debug!(key, mode, waited_us, outcome = name, "lock_acquire");
    outcome
}

/// One acquisition in progress: what it wants, and where its wait stands.
pub(crate) struct Acquisition {
    runtime: LockRuntime,
    want: Want,
    start: Instant,
    /// `None`: no deadline.
    deadline: Option<Instant>,
    try_once: bool,
    /// Its place among the key's local waiters, once it has one.
    ticket: Option<WaitTicket>,
    backoff: Duration,
    /// No attempt was made yet.
    first: bool,
    /// The attempt about to go out is the last one: the try-once, or the one
    /// try a bounded wait makes after its deadline passed while it slept.
    last_try: bool,
    /// The backend's connection epoch when the last attempt was sent (see
    /// `Heartbeats::connection_epoch`).
    epoch: u32,
    /// The entry gate sent this acquisition back to the server once.
    sent_back: bool,
    /// The backend's failures during this wait, for its timeout to name.
    /// (Boxed: rare, and kept out of every waiting acquire's state.)
    trouble: Option<Box<Trouble>>,
}

/// Backend failures one wait saw: the last error, and when the first and
/// the last came.
struct Trouble {
    last: String,
    first_at: Instant,
    last_at: Instant,
}

impl Acquisition {
    /// An acquisition of `want` on `runtime`, starting now.
    pub(crate) fn new(runtime: LockRuntime, want: Want) -> Acquisition {
        let start = Instant::now();
        Acquisition {
            runtime,
            // A wait too long to represent (`Duration::MAX`) is a wait forever.
            deadline: want.wait.and_then(|w| start.checked_add(w)),
            try_once: want.wait == Some(Duration::ZERO),
            want,
            start,
            ticket: None,
            backoff: ERROR_BACKOFF_MIN,
            first: true,
            last_try: false,
            epoch: 0,
            sent_back: false,
            trouble: None,
        }
    }

    /// Takes the lock, or says why not. (An `async` block, not an `async
    /// fn`: the latter would keep a second copy of the acquisition in every
    /// waiting acquire's state.)
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn run(mut self) -> impl Future<Output = Result<LockGuard, LockError>> {
        async move {
            let outcome = 'run: loop {
                let unentered = match self.take_without_round_trip().await {
                    Some(Ok(unentered)) => unentered,
                    Some(Err(error)) => break 'run Err(error),
                    None => match self.ask_the_backend().await {
                        Ok(Some(unentered)) => unentered,
                        Ok(None) => continue,
                        Err(error) => break 'run Err(error),
                    },
                };
                // Every way in passes the entry gate: the hold is entered on
                // the evidence present now, or given back (`gate.rs`).
                let entered = match unentered.enter_now() {
                    Ok(entered) => entered,
                    // (Boxed: a rare path, kept out of every acquire's state.)
                    Err(unconfirmed) => Box::pin(unconfirmed.enter(self.entry_bound())).await,
                };
                match entered {
                    Some(guard) => break 'run Ok(guard),
                    None => {
                        if let Err(error) = self.sent_back() {
                            break 'run Err(error);
                        }
                    }
                }
            };
            // Every way out passes here once: reported, then returned.
            ended(
                &self.want.key,
                self.want.fair,
                self.try_once,
                self.start,
                outcome,
            )
        }
    }

    /// Steps 2 to 4: the deadline, then an attempt at the backend (or a
    /// place behind this process's own waiters), then a wait for a wake-up.
    /// `Ok(None)`: go round again.
    async fn ask_the_backend(&mut self) -> Result<Option<Unentered>, LockError> {
        self.check_deadline()?;
        let queued_behind = self.queue_behind_local_waiters();
        // Listen before trying, so a release between the try and the sleep
        // is not missed.
        let slot = self.ticket.as_ref().map(|t| t.slot().clone());
        let mut woken = pin!(slot.as_ref().map(|s| s.wake.notified()));
        if let Some(woken) = woken.as_mut().as_pin_mut() {
            woken.enable();
        }
        let now = Instant::now();
        let alarm = if queued_behind {
            self.lease_alarm(now, None)
        } else if self.held_back_by_a_local_writer() {
            if self.try_once || self.last_try {
                return Err(self.gave_up());
            }
            if self.ticket.is_none() {
                // (A writer queued since this read last looked: take a place
                // behind it, and sleep on it from the next turn. Without one
                // there is nothing to sleep on.)
                self.ticket = Some(self.register());
                return Ok(None);
            }
            self.lease_alarm(now, None)
        } else {
            // (Boxed: a waiting acquire holds no attempt, and the attempt's
            // state must not grow every waiting acquire's.)
            match Box::pin(self.attempt()).await? {
                Attempted::Held(unentered) => return Ok(Some(unentered)),
                Attempted::Registered => return Ok(None),
                Attempted::Busy(ttl) => self.lease_alarm(Instant::now(), ttl),
                Attempted::PlaceInUse => self.place_alarm(now),
                Attempted::Failed(error) => {
                    self.back_off(error).await?;
                    return Ok(None);
                }
            }
        };
        self.wait_for_wake_up(woken.as_mut(), alarm).await;
        Ok(None)
    }

    /// How long the entry gate may wait for a hold's confirmation: until
    /// the wait's deadline, and at least a try's bound (a try-once's
    /// deadline is its start). No deadline: until the hold is confirmed or
    /// lost, which its lease bounds.
    fn entry_bound(&self) -> Option<Instant> {
        let least = Instant::now() + self.runtime.try_timeout();
        self.deadline.map(|deadline| deadline.max(least))
    }

    /// The entry gate gave the hold back (news from before a lost
    /// connection that a renewal did not confirm, a hold lost before its
    /// task ran): ask the server anew. That was no busy key, so a try-once
    /// (or a last try) gets one more try, once. Sent back again past the
    /// deadline, the wait ends: a re-entry that no renewal confirms (the
    /// connection down) would otherwise go round the gate until one does.
    fn sent_back(&mut self) -> Result<(), LockError> {
        if !std::mem::replace(&mut self.sent_back, true) {
            self.last_try = false;
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(self.gave_up());
        }
        Ok(())
    }

    /// Step 2: a deadline that passed allows one last try, then ends the
    /// wait.
    fn check_deadline(&mut self) -> Result<(), LockError> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            if self.last_try {
                return Err(self.gave_up());
            }
            self.last_try = true;
        }
        Ok(())
    }

    /// Fairness: when callers of this process already wait for the key, a
    /// newcomer queues behind them (the release wakes the longest waiter
    /// first) instead of racing them to the backend. `true`: queued, no
    /// attempt now.
    fn queue_behind_local_waiters(&mut self) -> bool {
        if !std::mem::take(&mut self.first) || self.last_try {
            return false;
        }
        let waiters = self.runtime.waiters();
        if waiters.waiting_keys() == 0 || !waiters.is_waiting(&self.want.lock_key) {
            return false;
        }
        let ticket = self.register();
        // The waiters seen a moment ago may all have left since (one took
        // the key and may have released it already, waking nobody): at the
        // head, nobody's release is left to wake this one, so it tries now.
        let behind = !ticket.is_head();
        self.ticket = Some(ticket);
        behind
    }

    /// A place among the key's local waiters, at the back.
    fn register(&self) -> WaitTicket {
        self.runtime.waiters().register(
            self.want.lock_key.clone(),
            self.want.scope.clone(),
            self.terms(),
            self.want.mode.is_read(),
        )
    }

    /// Step 4 (on backend failure): a bounded wait rides out backend
    /// trouble until its deadline, backing off, and ends in a `Timeout`
    /// naming it; an unbounded one and a try-once report it at once, and so
    /// does every wait a failed replica sync or a refusal for lack of a
    /// permission.
    async fn back_off(&mut self, error: BackendError) -> Result<(), LockError> {
        if error.is_permission_denied() {
            // Refused for good: the wait would end as a timeout, later.
            let key = self.want.key.clone();
            return Err(LockError::PermissionDenied { key, source: error });
        }
        let Some(deadline) = self.deadline else {
            return Err(error.into());
        };
        if error.is_replica_sync_failure() {
            // The lock was taken and released again: trying again would
            // only add replication timeouts to the wait.
            return Err(error.into());
        }
        if self.try_once {
            // (Never "busy" for an unknown answer: the backend's error.)
            return Err(error.into());
        }
        let now = Instant::now();
        let trouble = self.trouble.get_or_insert_with(|| {
            Box::new(Trouble {
                last: String::new(),
                first_at: now,
                last_at: now,
            })
        });
        trouble.last = error.what_failed();
        trouble.last_at = now;
        if self.last_try || now >= deadline {
            // The wait ran out in the outage: a timeout that says so, with
            // the backend's last error (not a bare backend error, as if the
            // wait had never begun; nor contention).
            return Err(self.gave_up());
        }
        tracing::debug!(%error, "lock acquire failed; retrying until the deadline");
        tokio::time::sleep_until((Instant::now() + self.backoff).min(deadline)).await;
        self.backoff = (self.backoff * 2).min(ERROR_BACKOFF_MAX);
        Ok(())
    }

    /// The error of a wait that ended without the lock: `Timeout`, also when
    /// a guard that this task took holds the key. The runtime cannot know
    /// that the task still has that guard (see `HeldTable::taken_by_this_task`),
    /// and a false `SelfDeadlock` (a verdict callers treat as a bug, not as
    /// contention) is worse than none; the wait's start warned instead.
    ///
    /// The timeout names what else the wait saw: the backend's failures
    /// (an outage must not read as contention), and a holder in this same
    /// process, in a scope the waiter is not part of (a task spawned from a
    /// locked body is the usual one: it is pointed to `inherit`).
    fn gave_up(&self) -> LockError {
        let backend = self.trouble.as_ref().map(|t| {
            let since = t.first_at.saturating_duration_since(self.start);
            let until = t.last_at.saturating_duration_since(self.start);
            (t.last.clone(), since, until)
        });
        let held_here = self.runtime.table().holds(&self.want.lock_key);
        LockError::Timeout {
            key: self.want.key.clone(),
            waited: self.start.elapsed(),
            cause: TimeoutCause::new(backend, held_here),
        }
    }

    /// The lease a fair release hands the lock over with: for a renewed lock
    /// a claim of at most the queue entry's life, which the watchdog extends
    /// to the full lease soon after (so a waiter that died just before its
    /// turn costs the key seconds, not a whole lease); a fixed lease as is.
    fn handoff_lease(&self) -> Duration {
        if self.want.renew {
            self.want.lease.min(QUEUE_ENTRY_LIFE)
        } else {
            self.want.lease
        }
    }

    /// The mode of this waiter's fair place, on a backend whose places have
    /// one (see [`Backend::places_have_modes`]): whether it reads.
    fn place_mode(&self) -> Option<bool> {
        let backend = self.runtime.backend();
        backend
            .places_have_modes()
            .then(|| self.want.mode.is_read())
    }

    /// What a hold must be like for this acquisition to take it over from
    /// another task of the process (lock cohorting): only renewed leases,
    /// whose length the watchdog keeps, on the same lease and mode.
    fn terms(&self) -> Option<Terms> {
        self.want.renew.then_some(Terms {
            lease: self.want.lease,
            fair: self.want.fair,
            read: self.want.mode.is_read(),
        })
    }

    /// The hold this acquisition becomes:
    /// `tokens` are its token and the last one reserved with it, `since`
    /// when the backend acquisition was sent.
    fn hold(&mut self, holder: String, tokens: (u64, u64), since: Instant) -> Hold {
        let (fence, upto) = tokens;
        // (Copies: the entry gate may send this acquisition back to the
        // server.)
        Hold {
            key: self.want.key.clone(),
            lock_key: self.want.lock_key.clone(),
            holder,
            owner: self.want.scope.id,
            fence,
            upto,
            since,
            epoch: self.epoch,
            lease: self.want.lease,
            renew: self.want.renew,
            fair: self.want.fair,
            mode: self.want.mode,
        }
    }
}
