//! Lock cohorting: a hold passed between tasks of this process without a
//! round trip, a bounded number of times, before it goes back to the backend.
//!
//! When the last frame of a hold goes and a task of this process waits for
//! the same key (with the same lease, renewed, in the same mode), the hold
//! is given to that task instead of being released: the backend still
//! records one hold under the same holder id, the watchdog keeps renewing
//! it, and the new holder gets the next token of a block the acquisition
//! reserved (see `scripts/acquire.lua`). After [`Cohort::handoffs`] passes,
//! or once [`Cohort::budget`] has run since the backend acquisition, the
//! hold is released to the backend as usual, so other processes' waiters get
//! their turn (this process's waiters then race them in plain mode, or
//! queue behind them in fair mode).
//!
//! This module only decides; `guard.rs` does the passing and the waiters'
//! registry (`waiters/`) finds the task to pass to.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The most local handoffs one backend acquisition may be passed on
/// (each needs a token of the block reserved with it; a block runs that
/// many microseconds ahead of the server clock at most, see
/// `scripts/acquire.lua`).
pub const MAX_COHORT_HANDOFFS: u32 = 1000;

/// A hold is passed only with half its lease left, or this much (a hold
/// handed over in fair mode has a claim of at most 3 s until the watchdog's
/// first renewal extends it to the full lease).
pub(crate) const LEFT_TO_PASS: Duration = Duration::from_millis(1500);

/// How far one backend acquisition may be passed between tasks of this
/// process (see [`LockRuntimeBuilder::cohort`](crate::LockRuntimeBuilder::cohort)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cohort {
    /// Local handoffs after one backend acquisition (0: off).
    pub handoffs: u32,
    /// Time since the backend acquisition after which no more local
    /// handoffs are made.
    pub budget: Duration,
}

impl Cohort {
    /// No local handoffs: every release goes to the backend.
    pub const OFF: Cohort = Cohort {
        handoffs: 0,
        budget: Duration::ZERO,
    };

    /// Whether any local handoff is allowed.
    pub fn is_on(&self) -> bool {
        self.handoffs > 0 && !self.budget.is_zero()
    }
}

/// Where one backend acquisition stands in its run of local handoffs.
#[derive(Debug)]
pub(crate) struct Run {
    state: Mutex<RunState>,
}

#[derive(Debug)]
struct RunState {
    /// Token of the current holder.
    fence: u64,
    /// The last token of the reserved block.
    upto: u64,
    /// When the backend acquisition was sent.
    since: Instant,
    /// When its reply came (this run was made): joins count from here, so
    /// that a slow round trip does not use up their budget.
    made: Instant,
    handoffs: u32,
}

/// What a hold must be like for a waiter to take it over locally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Terms {
    pub(crate) lease: Duration,
    pub(crate) fair: bool,
    /// A read hold. Read holds are never passed: local readers take their
    /// own (shared) holds, and a write hold goes only to a writer.
    pub(crate) read: bool,
}

impl Run {
    /// A run starting with the backend's token `fence`, of which the tokens
    /// up to `upto` are reserved for local holders.
    pub(crate) fn new(fence: u64, upto: u64, since: Instant) -> Run {
        Run {
            state: Mutex::new(RunState {
                fence,
                upto: upto.max(fence),
                since,
                made: Instant::now(),
                handoffs: 0,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current holder's token.
    pub(crate) fn fence(&self) -> u64 {
        self.state().fence
    }

    /// Whether one more local handoff is allowed at `now` by `limits`; if
    /// so, counts it and returns the next holder's token.
    pub(crate) fn next(&self, limits: Cohort, now: Instant) -> Option<u64> {
        let mut state = self.state();
        let within = state.handoffs < limits.handoffs
            && state.fence < state.upto
            && now.saturating_duration_since(state.since) < limits.budget;
        if !within {
            return None;
        }
        state.handoffs += 1;
        state.fence += 1;
        Some(state.fence)
    }

    /// Whether one more task of the process may join this read hold at
    /// `now` by `limits` (the same count and budget as handoffs: a stream of
    /// local readers must not keep a writer of another process out for
    /// longer than a run of handoffs would); if so, counts it.
    pub(crate) fn join(&self, limits: Cohort, now: Instant) -> bool {
        let mut state = self.state();
        let within = state.handoffs < limits.handoffs
            && now.saturating_duration_since(state.made) < limits.budget;
        if within {
            state.handoffs += 1;
        }
        within
    }

    /// Local handoffs so far.
    #[cfg(test)]
    pub(crate) fn handoffs(&self) -> u32 {
        self.state().handoffs
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const LIMITS: Cohort = Cohort {
        handoffs: 3,
        budget: Duration::from_secs(1),
    };

    #[test]
    fn tokens_grow_within_the_block_and_stop_at_the_bound() {
        let start = Instant::now();
        let run = Run::new(100, 110, start);
        let tokens: Vec<u64> = (0..5).filter_map(|_| run.next(LIMITS, start)).collect();
        assert_eq!(tokens, [101, 102, 103]);
        assert_eq!(run.fence(), 103);
        assert_eq!(run.handoffs(), 3);
    }

    #[test]
    fn the_reserved_block_and_the_budget_bound_it_too() {
        let start = Instant::now();
        let run = Run::new(100, 101, start);
        assert_eq!(run.next(LIMITS, start), Some(101));
        assert_eq!(run.next(LIMITS, start), None, "block used up");
        let run = Run::new(100, 110, start);
        assert_eq!(run.next(LIMITS, start + Duration::from_secs(1)), None);
        assert_eq!(run.next(Cohort::OFF, start), None);
        // No block at all (a backend without reservations).
        let run = Run::new(100, 0, start);
        assert_eq!(run.next(LIMITS, start), None);
    }
}
