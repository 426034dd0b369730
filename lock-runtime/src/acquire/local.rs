//! Step 1 of an acquisition: the ways in that need no round trip, all
//! within this process. A hold passed by a sibling task (lock cohorting), a
//! re-entry below the innermost hold of the scope's ancestry, a read that
//! joins a read hold of the process, and, in fair mode, a handoff a
//! release made to this process's place. Each yields a hold not entered
//! yet: the entry gate (`gate.rs`, through `run`) decides whether it is
//! still good to enter. Owns nothing of the backend round trip
//! (`attempt.rs`) or of waiting (`mod.rs`, `wake.rs`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Acquisition;
use crate::error::LockError;
use crate::gate::Way;
use crate::guard::{LockGuard, Unentered};
use crate::held::{HeldLock, Reentry};

impl Acquisition {
    /// Step 1: what needs no round trip. Shutdown ends the wait; a hold of
    /// this scope's ancestry is re-entered (after waiting for a sibling
    /// scope that is inside); a read joins a read hold of the process; in
    /// fair mode, a handoff to this process's place is taken. Each is a hold
    /// not entered yet (see `run`).
    pub(super) async fn take_without_round_trip(&mut self) -> Option<Result<Unentered, LockError>> {
        if self.runtime.is_shut_down() {
            return Some(Err(LockError::ShutDown));
        }
        // A hold passed by another task of this process (lock cohorting).
        if let Some(passed) = self.take_passed() {
            return Some(Ok(passed));
        }
        // Re-entry, strict nesting: only below the innermost hold.
        let table = self.runtime.table();
        let (lock_key, scope, mode) = (&self.want.lock_key, &self.want.scope, self.want.mode);
        let reentry = match table.reenter(lock_key, scope, mode) {
            Reentry::Sibling => {
                // A sibling scope is inside: wait for it in the process.
                // (Boxed: a rare path, kept out of every waiting acquire's
                // state.)
                let changed = table.frames_changed(lock_key, scope, self.deadline, mode);
                let changed = Box::pin(changed).await;
                if self.runtime.is_shut_down() {
                    // Shutdown closed the sibling's frame: no backend
                    // attempt now. (A frame `changed` took is closed too.)
                    return Some(Err(LockError::ShutDown));
                }
                changed
            }
            other => other,
        };
        match reentry {
            Reentry::Held(held, frame) => {
                return Some(Ok(self.frame_of(held, frame, Way::Reentry)))
            }
            // (Still a sibling inside: the deadline passed.)
            Reentry::Sibling => return Some(Err(self.gave_up())),
            Reentry::Refused => {
                return Some(Err(LockError::UpgradeRefused {
                    key: self.want.key.clone(),
                }))
            }
            Reentry::No => {}
        }
        let now = self.runtime.waiters().connection_epoch();
        if let Some((held, frame)) = self.join_local_readers(now) {
            return Some(Ok(self.frame_of(held, frame, Way::Joined)));
        }
        self.take_handoff().map(Ok)
    }

    /// A new frame of a hold in the table (re-entered or joined), for this
    /// acquisition's scope and mode.
    fn frame_of(&self, held: Arc<HeldLock>, frame: u64, way: Way) -> Unentered {
        let owner = (self.want.scope.clone(), self.want.mode);
        LockGuard::unentered(self.runtime.clone(), held, frame, owner, way)
    }

    /// Fair mode: a release may have handed the lock to our place. (A fixed
    /// lease longer than the handoff's claim is not taken from the message:
    /// the next attempt claims it and sets the full lease.)
    fn take_handoff(&mut self) -> Option<Unentered> {
        let handoff = match &self.ticket {
            Some(ticket) if self.want.fair => {
                let epoch = self.runtime.waiters().connection_epoch();
                ticket.take_handoff(self.minimum_claim(), epoch, self.place_mode())?
            }
            _ => return None,
        };
        if let Some(ticket) = self.ticket.take() {
            ticket.leave_with_lock(true);
        }
        // Its backend lease ends after `since` + the handoff lease (the
        // shortest that the place's entry carried); the watchdog counts from
        // there.
        let tokens = (handoff.fence, handoff.upto);
        // Confirmed by the message, in the epoch it came in.
        self.epoch = handoff.epoch;
        // (The run of local handoffs counts from now: the claim's `since`
        // may be a second old.)
        let held = HeldLock::new(self.hold(handoff.holder, tokens, Instant::now()));
        let owner = (self.want.scope.clone(), Way::Handoff);
        let (since, lease) = (handoff.since, handoff.lease);
        let adopted = LockGuard::adopt(&self.runtime, held.clone(), owner, since, lease, None);
        if adopted.is_none() {
            // Shut down meanwhile: the handoff goes back.
            let (lock_key, holder) = (held.lock_key.clone(), held.holder.clone());
            self.runtime
                .backend()
                .release_in_background(lock_key, holder, true);
        }
        adopted
    }

    /// A read joins a read hold another task of this process has (see
    /// `HeldTable::join`), unless a writer of the process waits ahead of it
    /// or the hold is not fit to share now. Leaves the waiters' queue,
    /// waking the next waiter (a reader behind may join too).
    fn join_local_readers(&mut self, epoch: u32) -> Option<(Arc<HeldLock>, u64)> {
        let limits = self.runtime.cohort();
        let terms = self.terms()?;
        if !terms.read || !limits.is_on() || self.held_back_by_a_local_writer() {
            return None;
        }
        let table = self.runtime.table();
        let joined = table.join(
            &self.want.lock_key,
            &self.want.scope,
            (terms, limits),
            epoch,
        )?;
        self.runtime.count_joined();
        if let Some(ticket) = self.ticket.take() {
            ticket.leave_with_lock(true);
        }
        tracing::debug!(key = %self.want.key, "a read joined a read hold of this process");
        Some(joined)
    }

    /// Writer preference in the process: a read does not go to the backend
    /// while a writer of this process waits ahead of it (a try-once read,
    /// with no place in the queue: while one waits at all). A nested read
    /// never gets here: it re-entered its hold.
    pub(super) fn held_back_by_a_local_writer(&self) -> bool {
        if !self.want.mode.is_read() {
            return false;
        }
        match &self.ticket {
            Some(ticket) => ticket.writer_ahead(),
            None => self.runtime.waiters().writer_waiting(&self.want.lock_key),
        }
    }

    /// A hold another task of this process passed to this waiter (lock
    /// cohorting), taken: its frame is in the table already. It was passed
    /// a while ago perhaps (the process stopped, the executor stalled):
    /// whether it is still good to enter is the entry gate's to say.
    fn take_passed(&mut self) -> Option<Unentered> {
        let passed = self.ticket.as_ref()?.take_passed()?;
        // (Only `guard.rs` passes holds, and only unentered ones.)
        let passed = *passed.downcast::<Unentered>().ok()?;
        // Fair mode: a place still queued stays for the next local waiter,
        // who need not try now; without one (the handoff that brought the
        // lock here used it up), the next waiter must queue the process
        // again, or its waiters would wait unseen behind other processes.
        if let Some(ticket) = self.ticket.take() {
            let wake_next = self.want.fair && !ticket.has_place();
            ticket.leave_with_lock(wake_next);
        }
        let lock_key = &passed.held().lock_key;
        self.runtime
            .table()
            .taken(lock_key, passed.frame(), &self.want.scope);
        Some(passed)
    }

    /// The shortest handoff claim this waiter may take without a round trip:
    /// the watchdog extends a renewed lock, but nothing extends a fixed one.
    /// On etcd and ZooKeeper, a handoff is the place's key reaching the
    /// queue's head, on whatever lease or session the waiter that queued it
    /// asked for (kept alive when that was a renewed one): a fixed-lease
    /// waiter never takes it from the message, its attempt claims it and
    /// puts an end to it.
    fn minimum_claim(&self) -> Duration {
        if self.want.renew {
            Duration::ZERO
        } else if self.runtime.backend().always_fair() {
            Duration::MAX
        } else {
            self.want.lease
        }
    }
}
