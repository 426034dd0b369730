//! Redlock's acquire: one vote on every master at once, decided as soon as
//! the answers allow, then the token written back (`fence.rs`) and, when
//! anything went wrong, what was taken given back (`undo`).
//!
//! Owns the reading of a master's acquire ballot (held with a token,
//! refused for how long); the majority arithmetic is `quorum.rs`'s, the
//! calls and their bound `mod.rs`'s.

use std::time::Duration;

use tokio::time::Instant;

use super::gather::gather;
use super::{quorum, Answer, Redlock, FAIR_UNSUPPORTED};
use crate::backend::redis::{Ballot, Vote};
use crate::backend::{Acquire, Ask, Holding, Queue};
use crate::error::BackendError;
use crate::mode::LockMode;

/// Every master's acquire ballot, `None` where none came.
type Ballots = Vec<Option<Answer<Ballot>>>;

/// The token of a master's answer that it holds the lock for us.
pub(super) fn held_token(answer: &Option<Answer<Ballot>>) -> Option<u64> {
    match answer {
        Some(Ok(Ballot {
            vote: Vote::Acquire(Acquire::Held { fence, .. }),
            ..
        })) => Some(*fence),
        _ => None,
    }
}

/// For a master that refused the lock (busy, or quarantined: it lost its
/// data less than a lease ago), how long until it may say yes (`None` in
/// it: unknown); `None` for any other answer.
pub(super) fn refused_for(answer: &Option<Answer<Ballot>>) -> Option<Option<Duration>> {
    match answer {
        Some(Ok(Ballot {
            vote: Vote::Acquire(Acquire::Busy { ttl }),
            ..
        })) => Some(*ttl),
        Some(Ok(Ballot {
            vote: Vote::Quarantined { left, .. },
            ..
        })) => Some(Some(*left)),
        _ => None,
    }
}

impl Redlock {
    pub(crate) async fn acquire(&self, ask: Ask<'_>) -> Result<Acquire, BackendError> {
        let (lock_key, holder, lease) = (ask.lock_key, ask.holder, ask.lease);
        let (queue, mode) = (ask.queue, ask.mode);
        if queue != Queue::No {
            return Err(BackendError::msg(FAIR_UNSUPPORTED));
        }
        let started = Instant::now();
        let quorum = self.inner.quorum;
        let answers = self.vote(lock_key, holder, lease, mode).await;
        let (held, busy) = self.tally(&answers);
        let in_time = || quorum::validity(lease, started.elapsed()).is_some();
        if held.len() >= quorum && in_time() {
            match self.claim(lock_key, holder, &held, &answers).await {
                Ok(fence) if in_time() => {
                    return Ok(Acquire::Held {
                        fence,
                        upto: fence,
                        handed: false,
                    })
                }
                Ok(_) => {}
                Err(error) => {
                    self.undo(lock_key, holder, &answers);
                    return Err(error);
                }
            }
        }
        self.undo(lock_key, holder, &answers);
        if held.len() >= quorum {
            return Err(BackendError::msg(format!(
                "Redlock acquire: a majority said yes, but after {:?}, which leaves less \
                 than the clock-drift allowance ({:?}) of the {lease:?} lease; given back",
                started.elapsed(),
                quorum::drift(lease)
            )));
        }
        if held.len() + busy.len() < quorum {
            return Err(self.no_quorum("acquire", &answers));
        }
        Ok(Acquire::Busy {
            ttl: quorum::busy_ttl(quorum, held.len(), &busy),
        })
    }

    /// Runs the acquire script on every master at once (each with the
    /// padded lease and the boot-marker check) and waits until a majority
    /// said held; or until it can no longer, and it is known whether that
    /// is because the lock is busy (a majority answered) or because too few
    /// masters answer. A quarantined master counts as busy until its
    /// quarantine ends.
    async fn vote(&self, lock_key: &str, holder: &str, lease: Duration, mode: LockMode) -> Ballots {
        let quorum = self.inner.quorum;
        let ttl = quorum::padded(lease);
        let check = self.boot_check(ttl, false);
        // A read hold is a majority of read grants, a write (or exclusive)
        // hold a majority of write grants: the rest is the same vote.
        let calls = if mode.is_read() {
            self.calls(|m| self.read_checked(m, lock_key, holder, ttl, check))
        } else {
            self.calls(|m| m.acquire_checked(lock_key, holder, ttl, check))
        };
        gather(calls, |answers| {
            let count =
                |f: fn(&Option<Answer<Ballot>>) -> bool| answers.iter().filter(|a| f(a)).count();
            let held = count(|a| held_token(a).is_some());
            let busy = count(|a| refused_for(a).is_some());
            let open = count(Option::is_none);
            held >= quorum
                || (held + open < quorum && (held + busy >= quorum || held + busy + open < quorum))
        })
        .await
    }

    /// Takes in every ballot (see `heard`), and splits them: the masters
    /// that hold the lock for us with their tokens, and how long each that
    /// refused it says it stays busy.
    fn tally(&self, answers: &Ballots) -> (Vec<(usize, u64)>, Vec<Option<Duration>>) {
        let mut held = Vec::new();
        let mut busy = Vec::new();
        for (i, answer) in answers.iter().enumerate() {
            if let Some(Ok(ballot)) = answer {
                self.heard(i, ballot);
            }
            if let Some(fence) = held_token(answer) {
                held.push((i, fence));
            } else if let Some(ttl) = refused_for(answer) {
                busy.push(ttl);
            }
        }
        (held, busy)
    }

    /// A majority holds the lock for us: its token is the largest any of
    /// them gave, written back to the masters (`fence.rs`).
    async fn claim(
        &self,
        lock_key: &str,
        holder: &str,
        held: &[(usize, u64)],
        answers: &Ballots,
    ) -> Result<u64, BackendError> {
        let fence = held.iter().map(|(_, token)| *token).max().unwrap_or(0);
        let unanswered = answers.iter().enumerate().filter(|(_, a)| a.is_none());
        let unanswered: Vec<usize> = unanswered.map(|(i, _)| i).collect();
        self.record_fence(lock_key, holder, fence, held, &unanswered)
            .await?;
        Ok(fence)
    }

    /// Gives back, in the background, what a failed attempt may have taken:
    /// on every master that said held, failed or did not answer (its acquire
    /// may still land: the release follows it on the same connection; one
    /// that failed may have run the script and lost only the reply). Each
    /// is a task on the worker thread rather than a queued background
    /// release, which the next acquire of the key would wait for: with
    /// masters down it would wait for them to time out, to undo a hold
    /// nobody else sees. Only a master that said busy or quarantined surely
    /// took nothing.
    fn undo(&self, lock_key: &str, holder: &str, answers: &[Option<Answer<Ballot>>]) {
        for (answer, master) in answers.iter().zip(&self.inner.masters) {
            let taken = refused_for(answer).is_none();
            if let (true, Some(connected)) = (taken, master.slot.get()) {
                let backend = connected.backend.clone();
                let (lock_key, holder) = (lock_key.to_owned(), holder.to_owned());
                let bound = self.inner.timeout;
                self.inner.worker.spawn(async move {
                    let release = backend.release(Holding {
                        lock_key: &lock_key,
                        holder: &holder,
                        fair: false,
                    });
                    if let Ok(Err(error)) = tokio::time::timeout(bound, release).await {
                        tracing::debug!(%error, "Redlock: undoing a partial hold failed; its lease frees it");
                    }
                });
            }
        }
    }
}
