//! Step 3 of an acquisition: one attempt at the backend, and what its reply
//! means (held, busy, the first miss, a failure).

use std::time::Duration;

use tokio::time::Instant;

use super::{Acquisition, ERROR_BACKOFF_MIN};
use crate::backend::{Acquire, Queue};
use crate::error::{BackendError, LockError};
use crate::guard::LockGuard;
use crate::held::HeldLock;
use crate::owner;
use crate::runtime::LockRuntime;

/// What one attempt found.
pub(super) enum Attempted {
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

impl Acquisition {
    /// Step 3: one attempt at the backend, and what its reply means.
    pub(super) async fn attempt(&mut self) -> Result<Attempted, LockError> {
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
        self.epoch = self.runtime.waiters().connection_epoch();
        let (outcome, sent_at) = self.send(&in_flight.holder, queue).await?;
        let attempted = match outcome {
            Ok(Acquire::Held { fence, upto, .. }) => {
                self.took(&mut in_flight, (fence, upto), sent_at)
            }
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
        if runtime.is_shut_down() {
            // Nothing goes out after shutdown (it may be waiting for the
            // releases to drain).
            return Err(LockError::ShutDown);
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
    fn took(
        &mut self,
        in_flight: &mut InFlight,
        (fence, upto): (u64, u64),
        sent_at: Instant,
    ) -> Attempted {
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
        let held = HeldLock::new(self.hold(holder, (fence, upto), sent_at));
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
        if self.runtime.table().taken_by_this_task(&self.want.lock_key) {
            tracing::warn!(
                key = %self.want.key,
                "waiting for a lock that a guard this same task took with `acquire()` holds: \
                 if the task still has that guard, this wait ends only when another branch \
                 of the task drops it, or with `Timeout` at its deadline; run the call \
                 inside `guard.scope(...)` to re-enter"
            );
        }
        let waiters = self.runtime.waiters();
        let ticket = waiters.register(
            self.want.lock_key.clone(),
            self.want.scope.clone(),
            self.terms(),
        );
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
