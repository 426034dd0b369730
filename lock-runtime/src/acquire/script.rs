//! The acquire script's trip: sent from the caller's attempt, answered on
//! the runtime's worker, so that its answer is taken in (and whatever a
//! fresh holder id took is given back) even if the caller's future is
//! never polled again. Owns only that trip; what the answer means is
//! `attempt.rs`'s, the registry of scripts in flight `inflight.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Acquire, Ask, Backend, Queue};
use crate::error::BackendError;
use crate::inflight::{InFlight, Taken};
use crate::mode::LockMode;
use crate::waiters::PlaceAttempt;

/// One acquire script, registered in flight as `id`.
pub(super) struct Script {
    pub(super) backend: Backend,
    pub(super) gate: Arc<InFlight>,
    pub(super) id: u64,
    pub(super) lock_key: String,
    pub(super) holder: String,
    /// The lease, and whether the watchdog renews it.
    pub(super) lease: (Duration, bool),
    pub(super) queue: Queue,
    pub(super) mode: LockMode,
    /// A fresh holder id (not a fair place's): what it takes is given back
    /// unless its caller claims it.
    pub(super) armed: bool,
    pub(super) fair: bool,
}

impl Script {
    /// Sends the script and takes in its answer; `place_attempt` (fair
    /// mode: the attempt with the process's place) is let go when the
    /// answer comes.
    pub(super) async fn run(
        self,
        place_attempt: Option<Arc<PlaceAttempt>>,
    ) -> Result<Acquire, BackendError> {
        let Script {
            backend,
            gate,
            id,
            lock_key,
            holder,
            lease,
            queue,
            mode,
            armed,
            fair,
        } = self;
        // Should the task be dropped unanswered (its runtime stopping), the
        // entry still leaves the registry, with what it may hold.
        let unanswered = Unanswered {
            gate: gate.clone(),
            id,
            taken: armed.then(|| Taken {
                lock_key: lock_key.clone(),
                holder: holder.clone(),
                fair,
            }),
            backend: backend.clone(),
        };
        let ask = Ask {
            lock_key: &lock_key,
            holder: &holder,
            lease: lease.0,
            renewed: lease.1,
            queue,
            mode,
        };
        let outcome = backend.acquire(ask).await;
        unanswered.defuse();
        drop(place_attempt);
        // What the script may have left under a fresh id: the lock, a place
        // in the fair queue, or (no answer) either.
        let left = match &outcome {
            Ok(Acquire::Held { .. }) | Err(_) => true,
            Ok(Acquire::Busy { .. }) => matches!(queue, Queue::Join(_)),
        };
        let taken = (armed && left).then_some(Taken {
            lock_key,
            holder,
            fair,
        });
        if let Some(taken) = gate.answered(id, taken) {
            backend.release_in_background(taken.lock_key, taken.holder, taken.fair);
            gate.given_back(id);
        }
        outcome
    }
}

/// An attempt's in-flight entry while its script is out: if the worker's
/// task is dropped before the answer, it counts as answered with whatever
/// a fresh id may have taken (given back now).
struct Unanswered {
    gate: Arc<InFlight>,
    id: u64,
    taken: Option<Taken>,
    backend: Backend,
}

impl Unanswered {
    fn defuse(mut self) {
        self.taken = None;
        self.id = 0;
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.id == 0 {
            return;
        }
        if let Some(taken) = self.gate.answered(self.id, self.taken.take()) {
            self.backend
                .release_in_background(taken.lock_key, taken.holder, taken.fair);
            self.gate.given_back(self.id);
        }
    }
}
