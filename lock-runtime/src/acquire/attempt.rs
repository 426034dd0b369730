//! Step 3 of an acquisition: one attempt at the backend, and what its reply
//! means (held, busy, the first miss, a failure).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::script::Script;
use super::{Acquisition, ERROR_BACKOFF_MIN};
use crate::backend::{Acquire, Queue};
use crate::error::{BackendError, LockError};
use crate::gate::Way;
use crate::guard::{LockGuard, Unentered};
use crate::held::HeldLock;
use crate::inflight::Abandoned;
use crate::owner;
use crate::runtime::LockRuntime;
use crate::waiters::PlaceAttempt;

/// What one attempt found.
pub(super) enum Attempted {
    /// The lock is ours (not entered yet).
    Held(Unentered),
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
        self.follow_fair_processes();
        // Fair mode queues this process under one place per key; a first
        // attempt (no ticket yet) uses a fresh id, which may become the place.
        let (place, place_attempt) = match &self.ticket {
            Some(ticket) if self.want.fair => {
                match ticket.begin_attempt(self.handoff_lease(), self.place_mode()) {
                    // Shared with the script's task: the place stays in use
                    // until the script is answered, also if this future goes
                    // away first, so that no sibling's attempt and no give-back
                    // of the place overtakes it.
                    Some((id, attempt)) => (Some(id), Some(Arc::new(attempt))),
                    // A sibling's attempt with our place is out, and it is our
                    // last chance: that attempt stands for ours.
                    None if self.last_try => return Err(self.gave_up()),
                    None => return Ok(Attempted::PlaceInUse),
                }
            }
            _ => (None, None),
        };
        let mut in_flight = InFlight {
            runtime: self.runtime.clone(),
            lock_key: self.want.lock_key.clone(),
            armed: place.is_none(),
            holder: place.unwrap_or_else(owner::new_holder_id),
            fair: self.want.fair,
            sent: None,
        };
        let queue = match (self.want.fair, self.try_once) {
            (false, _) => Queue::No,
            (true, true) => Queue::Peek,
            (true, false) => Queue::Join(self.handoff_lease()),
        };
        self.epoch = self.runtime.waiters().connection_epoch();
        // (Boxed: a waiting acquire holds no attempt, and the attempt's
        // state must not grow every waiting acquire's.)
        let sending = Box::pin(self.send(&mut in_flight, queue, place_attempt.clone()));
        let (outcome, sent_at) = sending.await?;
        let attempted = match outcome {
            Ok(Acquire::Held { fence, upto, .. }) => {
                self.took(&mut in_flight, (fence, upto), sent_at)?
            }
            Ok(Acquire::Busy { ttl }) => {
                self.found_busy(&mut in_flight, queue, ttl, sent_at);
                Attempted::Busy(ttl)
            }
            Err(error) => {
                self.abandon_place(&in_flight, place_attempt.as_deref());
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

    /// Sends the acquire script for the attempt's holder id, bounded by the
    /// wait (the last try by `try_timeout`); returns the reply and when it
    /// was sent. The script goes out from here (so a release of the same id
    /// queued after it, by a caller that gives up, cannot overtake it), and
    /// the runtime's worker waits for its answer, registered as in flight
    /// (see `inflight.rs`): it is answered, and what it takes accounted for,
    /// even if this future is never polled again.
    ///
    /// `place_attempt` (fair mode: the attempt with the process's place)
    /// goes with the script and is let go when its answer comes.
    async fn send(
        &self,
        in_flight: &mut InFlight,
        queue: Queue,
        place_attempt: Option<Arc<PlaceAttempt>>,
    ) -> Result<(Result<Acquire, BackendError>, Instant), LockError> {
        let runtime = &self.runtime;
        let bound = if self.last_try {
            Some(Instant::now() + runtime.try_timeout())
        } else {
            self.deadline
        };
        let release_unanswered = self.settle_own_releases(bound).await;
        // Nothing goes out after shutdown (it may be waiting for the
        // releases to drain).
        let id = runtime.in_flight().start().ok_or(LockError::ShutDown)?;
        in_flight.sent = Some(id);
        let sent_at = Instant::now();
        let script = Script {
            backend: runtime.backend().clone(),
            gate: runtime.in_flight().clone(),
            id,
            lock_key: in_flight.lock_key.clone(),
            holder: in_flight.holder.clone(),
            lease: (self.want.lease, self.want.renew),
            queue,
            mode: self.want.mode,
            armed: in_flight.armed,
            fair: in_flight.fair,
        };
        let attempt = runtime.finish_on_worker(Box::pin(script.run(place_attempt)));
        let stopped = |_| BackendError::msg("the lock runtime's worker stopped");
        let Some(bound) = bound else {
            return Ok((attempt.await.map_err(stopped)?, sent_at));
        };
        tracing::debug!(
            key = %self.want.key, holder = %in_flight.holder,
            bound_ms = bound.saturating_duration_since(sent_at).as_millis(), "lock attempt sent"
        );
        let answered = tokio::time::timeout_at(bound, attempt).await;
        tracing::debug!(
            key = %self.want.key, answered = answered.is_ok(),
            took_ms = sent_at.elapsed().as_millis(), "lock attempt ended"
        );
        match answered {
            Ok(outcome) => Ok((outcome.map_err(stopped)?, sent_at)),
            // (the attempt's in-flight entry gives back whatever the script
            // may yet take)
            Err(_) if self.try_once => Err(BackendError::msg(format!(
                "no answer from the lock backend within the try timeout ({:?}){}",
                runtime.try_timeout(),
                if release_unanswered {
                    " (this process's own earlier release of the key was still unanswered)"
                } else {
                    ""
                }
            ))
            .into()),
            Err(_) => Err(self.gave_up()),
        }
    }

    /// Mixed modes on one key: a plain waiter on a key that other
    /// processes hand on in fair mode queues with them (or it would wait
    /// for ever: a direct handoff never leaves the key free).
    fn follow_fair_processes(&mut self) {
        if self.want.fair {
            return;
        }
        if let Some(first) = self.ticket.as_ref().and_then(|t| t.fair_in_use()) {
            if first {
                tracing::warn!(
                    key = %self.want.key,
                    "plain-mode waiters of this key queue in fair mode: other processes \
                     use the key in fair mode (set the same mode on every process)"
                );
            }
            self.want.fair = true;
        }
    }

    /// A place whose attempt failed is given up: the attempt may still
    /// reach the backend (a dropped connection), and what it does there
    /// must not be left to a place nobody uses.
    fn abandon_place(&self, in_flight: &InFlight, place_attempt: Option<&PlaceAttempt>) {
        if let (Some(ticket), Some(_)) = (&self.ticket, place_attempt) {
            if let Some(old) = ticket.abandon_place(&in_flight.holder) {
                let lock_key = self.want.lock_key.clone();
                self.runtime
                    .backend()
                    .release_in_background(lock_key, old, true);
            }
        }
    }

    /// A release of this key that this process queued (a dropped guard, or
    /// a locked call's release the backend may apply after this attempt,
    /// see `LockRuntime::release_behind`) goes out first, so that the key is
    /// free for this process's next acquire at once, as on the embedded
    /// backend. Briefly: a release stuck on a dead connection must not hold
    /// up the attempt. `true`: one was still unanswered when the wait ended.
    async fn settle_own_releases(&self, bound: Option<Instant>) -> bool {
        let runtime = &self.runtime;
        let behind = runtime.behind();
        if !runtime.backend().release_pending(&self.want.lock_key)
            && !behind.is_pending(&self.want.lock_key)
        {
            return false;
        }
        let settle_by = Instant::now() + runtime.try_timeout();
        let settled = async {
            // (A locked call's release that fails goes to the backend's
            // releaser: that one first.)
            behind.settled(&self.want.lock_key).await;
            runtime
                .backend()
                .releases_settled(&self.want.lock_key)
                .await;
        };
        let by = bound.map_or(settle_by, |b| b.min(settle_by));
        tokio::time::timeout_at(by, settled).await.is_err()
    }

    /// The attempt took the lock: the hold goes into the table and watchdog
    /// (or, shut down meanwhile, back to the backend).
    fn took(
        &mut self,
        in_flight: &mut InFlight,
        (fence, upto): (u64, u64),
        sent_at: Instant,
    ) -> Result<Attempted, LockError> {
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
            return Ok(Attempted::Busy(None));
        }
        let (sent, fresh) = (in_flight.sent.take(), in_flight.armed);
        let holder = in_flight.disarm();
        // Leave the queue first: `adopt` wakes the waiters of this scope (to
        // re-enter), and we are no longer one of them.
        // A reader wakes the next local waiter too: if that is a reader, it
        // shares the key now rather than after this hold.
        if let Some(ticket) = self.ticket.take() {
            ticket.leave_with_lock(self.want.fair || self.want.mode.is_read());
        }
        let held = HeldLock::new(self.hold(holder, (fence, upto), sent_at));
        let (owner, lease) = ((self.want.scope.clone(), Way::Answer), held.lease);
        match LockGuard::adopt(&self.runtime, held.clone(), owner, sent_at, lease, sent) {
            Some(unentered) => Ok(Attempted::Held(unentered)),
            None => {
                // Shut down meanwhile. A fresh id's lock is given back by
                // shutdown (or the attempt's task); a place's, claimed above
                // and so no longer the place shutdown gives back, here.
                if !fresh {
                    self.runtime.backend().release_in_background(
                        held.lock_key.clone(),
                        held.holder.clone(),
                        held.fair,
                    );
                }
                Err(LockError::ShutDown)
            }
        }
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
            self.want.mode.is_read(),
        );
        ticket.note_busy(ttl.and_then(|t| sent_at.checked_add(t)));
        if in_flight.armed {
            // Fair mode: our first attempt queued its id in Redis. It becomes
            // the place under the gate, so that shutdown gives it back either
            // way.
            let sent = in_flight.sent.take();
            let queued = in_flight.disarm();
            let lease = self.handoff_lease();
            let read = self.want.mode.is_read();
            let adopted = self
                .runtime
                .in_flight()
                .admit(sent, || ticket.adopt_place(queued, sent_at, lease, read))
                .ok_or(LockError::ShutDown)?;
            if let Some(extra) = adopted {
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

/// The holder id of one attempt. A fresh id's script may take the lock (or,
/// in fair mode, queue the id) after its caller gave up: if this is dropped
/// before its outcome was claimed, the attempt's in-flight entry gives back
/// what the script took, once it is answered (see `inflight.rs`). A fair
/// place's id is not given back: it belongs to the key's waiters.
struct InFlight {
    runtime: LockRuntime,
    lock_key: String,
    holder: String,
    armed: bool,
    fair: bool,
    /// The attempt's in-flight entry, once its script is out and until its
    /// outcome is claimed.
    sent: Option<u64>,
}

impl InFlight {
    /// Takes the holder id: the outcome was handled.
    fn disarm(&mut self) -> String {
        self.armed = false;
        std::mem::take(&mut self.holder)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(id) = self.sent.take() {
            let gate = self.runtime.in_flight();
            match gate.abandon(id) {
                Abandoned::Holding(taken) => {
                    self.runtime.backend().release_in_background(
                        taken.lock_key,
                        taken.holder,
                        taken.fair,
                    );
                    gate.given_back(id);
                }
                // A fresh id's script is still out: its release is queued
                // now, behind the script on the connection, so that this
                // process's next acquire of the key waits for it (see
                // `send`). The task releases once more when the answer
                // comes, should the script have gone out after this (a
                // second release of a unique id is harmless).
                Abandoned::StillOut if self.armed => {
                    self.runtime.backend().release_in_background(
                        std::mem::take(&mut self.lock_key),
                        std::mem::take(&mut self.holder),
                        self.fair,
                    );
                }
                Abandoned::StillOut | Abandoned::Nothing => {}
            }
        }
    }
}
