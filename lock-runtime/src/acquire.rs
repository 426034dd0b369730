//! One acquisition, as named steps: [`Acquisition::run`].
//!
//! An acquire first takes what needs no round trip: a re-entry (a hold of
//! its own scope's ancestry in this runtime) or, in fair mode, a handoff that
//! a release made to this process's place. Otherwise it sends one acquire
//! script; if the lock is busy it registers as a waiter of the key
//! (subscribing to the key's release news), retries once, and then sleeps
//! until a release, the holder's remaining lease, or its own deadline —
//! whichever comes first. There is no polling for the lock. (In fair mode
//! the first waiter of a key in each process also refreshes the process's
//! place in the key's Redis queue, once a second or a third of the handoff
//! claim, at least 50 ms apart: a heartbeat, not a retry loop; the handoff
//! itself arrives by message.) While the backend fails, a bounded wait backs
//! off and retries until its deadline.
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
use crate::owner::{self, Node};
use crate::runtime::LockRuntime;
use crate::waiters::WaitTicket;

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
}

/// What one attempt found.
enum Attempted {
    /// The lock is ours.
    Held(LockGuard),
    /// Busy; the holder's remaining lease as the reply gave it.
    Busy(Option<Duration>),
    /// This was the first miss: now a registered waiter, try again at once.
    Registered,
    /// Another local waiter's attempt is using this process's fair place.
    PlaceInUse,
    /// The backend failed.
    Failed(BackendError),
}

/// When a sleeping waiter wakes by itself, if no wake-up comes first.
struct Alarm {
    /// The holder's lease end if no news says otherwise.
    fallback: Instant,
    /// Whether news of the holder's lease moves the alarm.
    follow_lease: bool,
    /// Fair mode: when the head refreshes the process's place.
    refresh_at: Option<Instant>,
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
        }
    }

    /// Takes the lock, or says why not. (An `async` block, not an `async
    /// fn`: the latter would keep a second copy of the acquisition in every
    /// waiting acquire's state.)
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn run(mut self) -> impl Future<Output = Result<LockGuard, LockError>> {
        async move {
            loop {
                if let Some(done) = self.take_without_round_trip().await {
                    return done;
                }
                self.check_deadline()?;
                let queued_behind = self.queue_behind_local_waiters();
                // Listen before trying, so a release between the try and the
                // sleep is not missed.
                let slot = self.ticket.as_ref().map(|t| t.slot().clone());
                let mut woken = pin!(slot.as_ref().map(|s| s.wake.notified()));
                if let Some(woken) = woken.as_mut().as_pin_mut() {
                    woken.enable();
                }
                let now = Instant::now();
                let alarm = if queued_behind {
                    self.lease_alarm(now, None)
                } else {
                    match self.attempt().await? {
                        Attempted::Held(guard) => return Ok(guard),
                        Attempted::Registered => continue,
                        Attempted::Busy(ttl) => self.lease_alarm(Instant::now(), ttl),
                        Attempted::PlaceInUse => self.place_alarm(now),
                        Attempted::Failed(error) => {
                            self.back_off(error).await?;
                            continue;
                        }
                    }
                };
                self.wait_for_wake_up(woken.as_mut(), alarm).await;
            }
        }
    }

    /// Step 1: what needs no round trip. Shutdown ends the wait; a hold of
    /// this scope's ancestry is re-entered (after waiting for a sibling
    /// scope that is inside); in fair mode, a handoff to this process's
    /// place is taken.
    async fn take_without_round_trip(&mut self) -> Option<Result<LockGuard, LockError>> {
        if self.runtime.is_shut_down() {
            return Some(Err(LockError::ShutDown));
        }
        // Re-entry, strict nesting: only below the innermost hold.
        let table = self.runtime.table();
        let mut reentry = table.reenter(&self.want.lock_key, &self.want.scope);
        if let Reentry::Sibling = reentry {
            // A sibling scope is inside: wait for it in the process.
            // (Boxed: a rare path, kept out of every waiting acquire's state.)
            let (lock_key, scope) = (&self.want.lock_key, &self.want.scope);
            reentry = Box::pin(table.frames_changed(lock_key, scope, self.deadline)).await;
            if let Reentry::Sibling = reentry {
                return Some(Err(LockError::Timeout {
                    key: self.want.key.clone(),
                    waited: self.start.elapsed(),
                }));
            }
        }
        if let Reentry::Held(held, frame) = reentry {
            let (runtime, scope) = (self.runtime.clone(), self.want.scope.clone());
            return Some(Ok(LockGuard::new(runtime, held, frame, scope)));
        }
        // Fair mode: a release may have handed the lock to our place. (A
        // fixed lease longer than the handoff's claim is not taken from the
        // message: the next attempt claims it and sets the full lease.)
        let handoff = match &self.ticket {
            Some(ticket) if self.want.fair => ticket.take_handoff(self.minimum_claim())?,
            _ => return None,
        };
        if let Some(ticket) = self.ticket.take() {
            ticket.leave_with_lock(true);
        }
        // Its backend lease ends after `since` + the handoff lease (the
        // shortest that the place's entry carried); the watchdog counts from
        // there.
        let held = HeldLock::new(self.hold(handoff.holder, handoff.fence));
        let scope = self.want.scope.clone();
        let guard = LockGuard::adopt(&self.runtime, held, scope, handoff.since, handoff.lease);
        Some(Ok(guard))
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
        let ticket = waiters.register(self.want.lock_key.clone(), self.want.scope.clone());
        self.ticket = Some(ticket);
        true
    }

    /// Step 3: one attempt at the backend, and what its reply means.
    async fn attempt(&mut self) -> Result<Attempted, LockError> {
        // Fair mode queues this process under one place per key; a first
        // attempt (no ticket yet) uses a fresh id, which may become the place.
        let (place, place_attempt) = match &self.ticket {
            Some(ticket) if self.want.fair => match ticket.begin_attempt(self.handoff_lease()) {
                Some((id, attempt)) => (Some(id), Some(attempt)),
                // A sibling's attempt with our place is out, and it is our
                // last chance: that attempt stands for ours.
                None if self.last_try => return Err(self.gave_up()),
                None => return Ok(Attempted::PlaceInUse),
            },
            _ => (None, None),
        };
        let mut in_flight = InFlight {
            runtime: self.runtime.clone(),
            lock_key: self.want.lock_key.clone(),
            armed: place.is_none(),
            holder: place.unwrap_or_else(owner::new_holder_id),
            fair: self.want.fair,
        };
        let queue = match (self.want.fair, self.try_once) {
            (false, _) => Queue::No,
            (true, true) => Queue::Peek,
            (true, false) => Queue::Join(self.handoff_lease()),
        };
        let (outcome, sent_at) = self.send(&in_flight.holder, queue).await?;
        let attempted = match outcome {
            Ok(Acquire::Held { fence, .. }) => self.took(&mut in_flight, fence, sent_at),
            Ok(Acquire::Busy { ttl }) => {
                self.found_busy(&mut in_flight, queue, ttl, sent_at);
                Attempted::Busy(ttl)
            }
            Err(error) => {
                // A place whose attempt failed is given up: the attempt may
                // still reach Redis (a dropped connection), and what it does
                // there must not be left to a place nobody uses.
                if let (Some(ticket), Some(_)) = (&self.ticket, &place_attempt) {
                    if let Some(old) = ticket.abandon_place(&in_flight.holder) {
                        let lock_key = self.want.lock_key.clone();
                        self.runtime
                            .backend()
                            .release_in_background(lock_key, old, true);
                    }
                }
                Attempted::Failed(error)
            }
        };
        // The reply is handled: siblings may use the place (and take a
        // handoff that came meanwhile) again.
        drop(place_attempt);
        match attempted {
            Attempted::Busy(ttl) => self.after_a_miss(in_flight, ttl, sent_at).await,
            other => Ok(other),
        }
    }

    /// Sends the acquire script for `holder`, bounded by the wait (the last
    /// try by `try_timeout`); returns the reply and when it was sent.
    async fn send(
        &self,
        holder: &str,
        queue: Queue,
    ) -> Result<(Result<Acquire, BackendError>, Instant), LockError> {
        let runtime = &self.runtime;
        let bound = if self.last_try {
            Some(Instant::now() + runtime.try_timeout())
        } else {
            self.deadline
        };
        // A release of this key that this process queued (a dropped guard)
        // goes out first, so that the key is free for this process's next
        // acquire at once, as on the embedded backend. Briefly: a release
        // stuck on a dead connection must not hold up the attempt.
        if runtime.backend().release_pending(&self.want.lock_key) {
            let settle_by = Instant::now() + runtime.try_timeout();
            let settled = runtime.backend().releases_settled(&self.want.lock_key);
            let by = bound.map_or(settle_by, |b| b.min(settle_by));
            let _ = tokio::time::timeout_at(by, settled).await;
        }
        let sent_at = Instant::now();
        // Boxed: the backend's request future is large, and it would otherwise
        // sit inside every waiting acquire's state, also while it sleeps.
        let lease = self.want.lease;
        let attempt = Box::pin(runtime.backend().acquire(
            &self.want.lock_key,
            holder,
            lease,
            queue,
        ));
        let Some(bound) = bound else {
            return Ok((attempt.await, sent_at));
        };
        match tokio::time::timeout_at(bound, attempt).await {
            Ok(outcome) => Ok((outcome, sent_at)),
            // (the caller's in-flight id releases whatever the attempt may
            // yet take)
            Err(_) if self.try_once => Err(BackendError::msg(format!(
                "no answer from the lock backend within the try timeout ({:?})",
                runtime.try_timeout()
            ))
            .into()),
            Err(_) => Err(self.gave_up()),
        }
    }

    /// The attempt took the lock: the hold goes into the table and watchdog.
    fn took(&mut self, in_flight: &mut InFlight, fence: u64, sent_at: Instant) -> Attempted {
        let claimed = in_flight.armed
            || self
                .ticket
                .as_ref()
                .is_some_and(|t| t.claim_place(&in_flight.holder));
        if !claimed {
            // Cannot happen with one attempt per place at a time (see
            // `WaitTicket::begin_attempt`); if it did, the place's lock would
            // be a sibling's: keep waiting.
            in_flight.disarm();
            return Attempted::Busy(None);
        }
        let holder = in_flight.disarm();
        // Leave the queue first: `adopt` wakes the waiters of this scope (to
        // re-enter), and we are no longer one of them.
        if let Some(ticket) = self.ticket.take() {
            ticket.leave_with_lock(self.want.fair);
        }
        let held = HeldLock::new(self.hold(holder, fence));
        let (scope, lease) = (self.want.scope.clone(), held.lease);
        Attempted::Held(LockGuard::adopt(&self.runtime, held, scope, sent_at, lease))
    }

    /// The attempt found the lock busy: record what the reply said.
    fn found_busy(
        &mut self,
        in_flight: &mut InFlight,
        queue: Queue,
        ttl: Option<Duration>,
        sent_at: Instant,
    ) {
        if let Some(ticket) = &self.ticket {
            ticket.note_busy(ttl.and_then(|t| sent_at.checked_add(t)));
            if self.want.fair {
                ticket.confirm_place(&in_flight.holder, sent_at);
            }
        }
        // A fair first attempt stays armed: its id is queued in Redis and
        // must be given back unless it becomes the place (`after_a_miss`).
        if !(self.want.fair && matches!(queue, Queue::Join(_)) && in_flight.armed) {
            in_flight.disarm();
        }
        self.backoff = ERROR_BACKOFF_MIN;
    }

    /// After a busy reply: past the deadline the wait ends; on the first
    /// miss the acquire becomes a waiter of the key (its subscription set
    /// up) and tries again at once.
    async fn after_a_miss(
        &mut self,
        mut in_flight: InFlight,
        ttl: Option<Duration>,
        sent_at: Instant,
    ) -> Result<Attempted, LockError> {
        if self.last_try || self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(self.gave_up());
        }
        if self.ticket.is_some() {
            return Ok(Attempted::Busy(ttl));
        }
        if self.runtime.table().held_by_this_task(&self.want.lock_key) {
            tracing::warn!(
                key = %self.want.key,
                "waiting for a lock that this same task holds (a guard from `acquire()` or \
                 a locked call still alive): unless another branch of this task releases \
                 it, this wait ends only with its deadline; run the call inside \
                 `guard.scope(...)` to re-enter"
            );
        }
        let waiters = self.runtime.waiters();
        let ticket = waiters.register(self.want.lock_key.clone(), self.want.scope.clone());
        ticket.note_busy(ttl.and_then(|t| sent_at.checked_add(t)));
        if in_flight.armed {
            // Fair mode: our first attempt queued its id in Redis.
            let queued = in_flight.disarm();
            if let Some(extra) = ticket.adopt_place(queued, sent_at, self.handoff_lease()) {
                let lock_key = self.want.lock_key.clone();
                self.runtime
                    .backend()
                    .release_in_background(lock_key, extra, true);
            }
        }
        drop(in_flight);
        let ready = ticket.ready();
        match self.deadline {
            Some(d) => {
                let _ = tokio::time::timeout_at(d, ready).await;
            }
            None => ready.await,
        }
        self.ticket = Some(ticket);
        Ok(Attempted::Registered)
    }

    /// Step 4 (on backend failure): a bounded wait rides out backend
    /// trouble until its deadline, backing off; an unbounded one reports it
    /// at once.
    async fn back_off(&mut self, error: BackendError) -> Result<(), LockError> {
        let Some(deadline) = self.deadline else {
            return Err(error.into());
        };
        if self.last_try || Instant::now() >= deadline {
            return Err(error.into());
        }
        tracing::debug!(%error, "lock acquire failed; retrying until the deadline");
        tokio::time::sleep_until((Instant::now() + self.backoff).min(deadline)).await;
        self.backoff = (self.backoff * 2).min(ERROR_BACKOFF_MAX);
        Ok(())
    }

    /// The alarm of a waiter that learned (`ttl`, or nothing) about the
    /// holder's lease `now`: its end, and in fair mode the head's refresh.
    fn lease_alarm(&self, now: Instant, ttl: Option<Duration>) -> Alarm {
        let lease = self.want.lease;
        let is_head = self.ticket.as_ref().is_some_and(WaitTicket::is_head);
        Alarm {
            fallback: now.checked_add(ttl.unwrap_or(lease)).unwrap_or(now + lease),
            follow_lease: true,
            // Often enough that the place stays alive, and that most of a
            // handoff's claim is still ahead when it is taken (its lease is
            // counted from the last refresh before it).
            refresh_at: (self.want.fair && is_head).then(|| {
                now + QUEUE_REFRESH
                    .min(self.handoff_lease() / 3)
                    .max(QUEUE_REFRESH_MIN)
            }),
        }
    }

    /// The alarm while another local waiter's attempt uses the place: its
    /// outcome (or a handoff) wakes the head; at the latest a refresh.
    fn place_alarm(&self, now: Instant) -> Alarm {
        Alarm {
            fallback: now + QUEUE_REFRESH,
            follow_lease: false,
            refresh_at: None,
        }
    }

    /// Step 5: sleeps until `woken` fires, the alarm, or the deadline.
    /// With `follow_lease`, news that the holder's lease ends sooner (from
    /// any waiter or hold of this process) wakes the sleeper early, and news
    /// that it ends later keeps it asleep: either way no waiter sleeps past
    /// the holder's lease as this process knows it. Waiters behind the head
    /// wake [`QUEUED_SLACK`] later, so the head's attempt usually brings the
    /// news.
    async fn wait_for_wake_up(&self, mut woken: Pin<&mut Option<Notified<'_>>>, alarm: Alarm) {
        let Some(ticket) = &self.ticket else {
            return;
        };
        let deadline = self.deadline;
        loop {
            let changed = ticket.busy_changed();
            let slack = if ticket.is_head() {
                Duration::ZERO
            } else {
                QUEUED_SLACK
            };
            let news = |t: &WaitTicket| t.busy_until().filter(|_| alarm.follow_lease);
            let lease_end = news(ticket).map_or(alarm.fallback, |u| u + slack);
            let mut wake_at = deadline.map_or(lease_end, |d| d.min(lease_end));
            if let Some(refresh) = alarm.refresh_at {
                wake_at = wake_at.min(refresh);
            }
            tokio::select! {
                _ = async { if let Some(w) = woken.as_mut().as_pin_mut() { w.await } } => return,
                () = changed, if alarm.follow_lease => {}
                () = tokio::time::sleep_until(wake_at) => {
                    let now = Instant::now();
                    let news_later = news(ticket).is_some_and(|u| u + slack > now);
                    let must_wake = deadline.is_some_and(|d| now >= d)
                        || alarm.refresh_at.is_some_and(|r| now >= r);
                    if must_wake || !news_later {
                        return;
                    }
                }
            }
        }
    }

    /// The error of a wait that ended without the lock. A wait for a hold
    /// of this very task is the likely mistake of a guard or locked call
    /// still alive around the waiting call: it says so.
    fn gave_up(&self) -> LockError {
        let (key, waited) = (self.want.key.clone(), self.start.elapsed());
        if !self.try_once && self.runtime.table().held_by_this_task(&self.want.lock_key) {
            LockError::SelfDeadlock { key, waited }
        } else {
            LockError::Timeout { key, waited }
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

    /// The shortest handoff claim this waiter may take without a round trip:
    /// the watchdog extends a renewed lock, but nothing extends a fixed one.
    fn minimum_claim(&self) -> Duration {
        if self.want.renew {
            Duration::ZERO
        } else {
            self.want.lease
        }
    }

    /// The hold this acquisition becomes (it ends here: the key moves out).
    fn hold(&mut self, holder: String, fence: u64) -> Hold {
        Hold {
            key: std::mem::take(&mut self.want.key),
            hash: std::mem::take(&mut self.want.lock_key),
            holder,
            owner: self.want.scope.id,
            fence,
            lease: self.want.lease,
            renew: self.want.renew,
            fair: self.want.fair,
        }
    }
}

/// The holder id of one attempt. A fresh id is released in the background if
/// this is dropped while still armed: an acquire script may have taken the
/// lock (or, in fair mode, queued the id) after its caller gave up. A fair
/// place's id is not: it belongs to the key's waiters, who give it back.
struct InFlight {
    runtime: LockRuntime,
    lock_key: String,
    holder: String,
    armed: bool,
    fair: bool,
}

impl InFlight {
    fn disarm(&mut self) -> String {
        self.armed = false;
        std::mem::take(&mut self.holder)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.armed {
            self.runtime.backend().release_in_background(
                std::mem::take(&mut self.lock_key),
                std::mem::take(&mut self.holder),
                self.fair,
            );
        }
    }
}
