//! Acquisitions in flight, and the gate every new hold passes on its way
//! into the runtime: what lets [`shutdown`](crate::LockRuntime::shutdown)
//! give back everything, also what an acquire took after shutdown began.
//!
//! An acquire script runs as a task of the runtime's worker, not inside the
//! caller's future: a caller may never be polled again (a process that
//! exits right after `shutdown().await`), and its script must still be
//! answered, and what it took given back. Each attempt is registered here
//! from before its script goes out until its caller claims the outcome (or
//! goes away). Shutdown closes the gate, gives back what answered attempts
//! took that no caller claimed, waits (bounded) for the scripts still out —
//! an attempt answered after the gate closed gives back what it took itself —
//! and only then gives back the fair places and drains the releases, so
//! nothing an attempt takes outlives the shutdown.
//!
//! The gate: a hold enters the table (an acquisition, a fair handoff, a hold
//! passed to a local waiter) only through [`InFlight::admit`], under the
//! same lock that closes the gate, so a hold is either in the table when
//! shutdown closes it, or refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

/// What an attempt may have left in the backend under a fresh holder id,
/// to be given back if nobody claims it.
#[derive(Debug)]
pub(crate) struct Taken {
    pub(crate) lock_key: String,
    pub(crate) holder: String,
    pub(crate) fair: bool,
}

/// What [`InFlight::abandon`] found.
#[derive(Debug)]
pub(crate) enum Abandoned {
    /// The script is still out.
    StillOut,
    /// Answered, and this must be given back.
    Holding(Taken),
    /// Nothing to give back.
    Nothing,
}

#[derive(Debug)]
enum Phase {
    /// The script is out.
    Sent,
    /// Its caller went away before the answer.
    Abandoned,
    /// Answered; what it left under its fresh id, if anything, waits for the
    /// caller's claim.
    Answered(Option<Taken>),
    /// Answered with nobody to claim it: its task is queueing the give-back
    /// (still out, for shutdown, until [`InFlight::given_back`]).
    GivingBack,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    attempts: HashMap<u64, Phase>,
}

/// The attempts in flight of one runtime, and its gate.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    state: Mutex<State>,
    /// Closed by shutdown (read without the lock by `is_closed`).
    closed: AtomicBool,
    /// Notified when an attempt is answered.
    answered: Notify,
}

impl InFlight {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether shutdown closed the gate.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Registers an attempt about to send its script; `None` once the gate
    /// is closed (nothing goes out after shutdown began).
    pub(crate) fn start(&self) -> Option<u64> {
        let mut state = self.state();
        if self.is_closed() {
            return None;
        }
        state.next = state.next.wrapping_add(1);
        let id = state.next;
        state.attempts.insert(id, Phase::Sent);
        Some(id)
    }

    /// The script of attempt `id` was answered; `taken`: what it left under
    /// a fresh holder id. Returns what must be given back now (the caller
    /// went away, or the gate closed: the caller will not claim it); the
    /// task then queues its release and calls [`given_back`](Self::given_back).
    pub(crate) fn answered(&self, id: u64, taken: Option<Taken>) -> Option<Taken> {
        let mut state = self.state();
        let give_back = match state.attempts.get_mut(&id) {
            Some(Phase::Sent) if !self.is_closed() => {
                state.attempts.insert(id, Phase::Answered(taken));
                None
            }
            Some(Phase::Sent | Phase::Abandoned) => match taken {
                Some(taken) => {
                    state.attempts.insert(id, Phase::GivingBack);
                    Some(taken)
                }
                None => {
                    state.attempts.remove(&id);
                    None
                }
            },
            _ => taken,
        };
        drop(state);
        if give_back.is_none() {
            self.answered.notify_waiters();
        }
        give_back
    }

    /// The give-back that [`answered`](Self::answered) asked of attempt
    /// `id`'s task is queued (shutdown's drain waits for it from now).
    pub(crate) fn given_back(&self, id: u64) {
        self.state().attempts.remove(&id);
        self.answered.notify_waiters();
    }

    /// The caller of attempt `id` goes away without claiming its outcome.
    /// [`Abandoned::Holding`]: the answer came, and what it took must be
    /// given back now (the caller queues its release, then calls
    /// [`given_back`](Self::given_back)); [`Abandoned::StillOut`]: the
    /// script is still out (its task gives back what it takes when the
    /// answer comes).
    pub(crate) fn abandon(&self, id: u64) -> Abandoned {
        let mut state = self.state();
        match state.attempts.remove(&id) {
            Some(Phase::Sent) => {
                state.attempts.insert(id, Phase::Abandoned);
                Abandoned::StillOut
            }
            Some(Phase::Answered(Some(taken))) => {
                // Out until its release is queued (see `given_back`).
                state.attempts.insert(id, Phase::GivingBack);
                Abandoned::Holding(taken)
            }
            Some(Phase::Answered(None)) | None => Abandoned::Nothing,
            // Its task is giving it back already (or it was abandoned).
            Some(phase) => {
                state.attempts.insert(id, phase);
                Abandoned::Nothing
            }
        }
    }

    /// Admits a new hold (or a fair place) into the runtime: runs `admit`
    /// under the gate, after taking attempt `id` (if any) out of the
    /// registry. `None`: the gate is closed, nothing was admitted, and what
    /// the attempt took is given back by shutdown or its task; a caller
    /// without an attempt (a fair handoff) gives back what it has itself.
    pub(crate) fn admit<T>(&self, id: Option<u64>, admit: impl FnOnce() -> T) -> Option<T> {
        let mut state = self.state();
        if let Some(id) = id {
            // (Once the gate is closed, shutdown took what it left.)
            state.attempts.remove(&id);
        }
        if self.is_closed() {
            return None;
        }
        Some(admit())
    }

    /// Closes the gate (shutdown), running `closing` under its lock; returns
    /// what answered attempts took that no caller claimed, to give back.
    pub(crate) fn close(&self, closing: impl FnOnce()) -> Vec<Taken> {
        let mut state = self.state();
        self.closed.store(true, Ordering::SeqCst);
        closing();
        let answered: Vec<u64> = state
            .attempts
            .iter()
            .filter(|(_, phase)| matches!(phase, Phase::Answered(Some(_))))
            .map(|(id, _)| *id)
            .collect();
        answered
            .into_iter()
            .filter_map(|id| match state.attempts.remove(&id) {
                Some(Phase::Answered(taken)) => taken,
                _ => None,
            })
            .collect()
    }

    /// Resolves when no script is out any more.
    pub(crate) async fn all_answered(&self) {
        loop {
            let answered = self.answered.notified();
            let out =
                self.state().attempts.values().any(|phase| {
                    matches!(phase, Phase::Sent | Phase::Abandoned | Phase::GivingBack)
                });
            if !out {
                return;
            }
            answered.await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn taken() -> Option<Taken> {
        Some(Taken {
            lock_key: "lock:{k}".to_owned(),
            holder: "h".to_owned(),
            fair: false,
        })
    }

    #[test]
    fn an_answer_nobody_claims_is_given_back_by_whoever_comes_last() {
        let gate = InFlight::default();
        // The caller goes first, then the answer: the task gives it back.
        let id = gate.start().unwrap();
        assert!(matches!(gate.abandon(id), Abandoned::StillOut));
        assert!(gate.answered(id, taken()).is_some());
        gate.given_back(id);
        // The answer first, then the caller: the caller gives it back.
        let id = gate.start().unwrap();
        assert!(gate.answered(id, taken()).is_none());
        assert!(matches!(gate.abandon(id), Abandoned::Holding(_)));
        gate.given_back(id);
        // Claimed: nothing to give back.
        let id = gate.start().unwrap();
        assert!(gate.answered(id, taken()).is_none());
        assert_eq!(gate.admit(Some(id), || 7), Some(7));
        assert!(matches!(gate.abandon(id), Abandoned::Nothing));
    }

    #[test]
    fn shutdown_gives_back_answers_not_claimed_and_later_answers() {
        let gate = InFlight::default();
        let early = gate.start().unwrap();
        let late = gate.start().unwrap();
        assert!(gate.answered(early, taken()).is_none());
        let mut closed = false;
        let given = gate.close(|| closed = true);
        assert!(closed);
        assert_eq!(given.len(), 1, "the answered, unclaimed attempt");
        assert!(gate.start().is_none(), "nothing goes out after shutdown");
        assert!(
            gate.answered(late, taken()).is_some(),
            "answered after close"
        );
        assert_eq!(gate.admit(Some(early), || ()), None);
        assert_eq!(gate.admit(None, || ()), None);
    }
}
