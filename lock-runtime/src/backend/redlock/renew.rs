//! Renewing held locks on every master, combining the answers per lock,
//! and taking a renewed lock again on a master that had lost it.

use std::sync::Arc;

use super::gather::{gather, Call};
use super::{quorum, Answer, Redlock};
use crate::backend::redis::Vote;
use crate::backend::Acquire;
use crate::error::BackendError;
use crate::held::{HeldLock, Hold};

impl Redlock {
    /// Renews `batch` on every master at once and combines the answers per
    /// lock (`quorum::renewal`); ends as soon as every lock is decided.
    ///
    /// A master that lost its data answers "not ours" (`renew.lua` finds no
    /// hold of this holder id), so it never counts towards the renewal's
    /// majority: the only way the holder id gets back onto it is this
    /// holder's own retake, after a majority renewed. The renewals need no
    /// boot-marker check and stay one pipelined call per master.
    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        let masters = self.masters();
        // The masters are given the lease plus the drift allowance.
        let padded: Vec<Arc<HeldLock>> = batch.iter().map(|l| padded_copy(l)).collect();
        let calls = self.calls(|m| m.renew_many(&padded));
        let tally = |answers: &[Option<Answer<Vec<Option<bool>>>>]| -> Vec<Option<bool>> {
            (0..batch.len())
                .map(|j| {
                    let said = |wanted: bool| {
                        answers
                            .iter()
                            .filter_map(|a| match a {
                                Some(Ok(replies)) => replies.get(j).copied().flatten(),
                                _ => None,
                            })
                            .filter(|renewed| *renewed == wanted)
                            .count()
                    };
                    quorum::renewal(masters, said(true), said(false))
                })
                .collect()
        };
        let answers = gather(calls, |answers| tally(answers).iter().all(Option::is_some)).await;
        let outcome = tally(&answers);
        self.retake(&padded, &outcome, &answers).await;
        Ok(outcome)
    }

    /// Takes a renewed lock again on the masters that said it is not ours
    /// there (restarted empty, or frozen past the lease). Safe: the renewal
    /// just confirmed that a majority holds it for us, so no other holder
    /// can have a majority until our lease ends; a master taken now only
    /// joins our hold (and is freed by our release, or by its TTL), and one
    /// that another holder took meanwhile answers busy and is left alone. It
    /// restores the hold's tolerance of further failures, and raises the
    /// master's fence counter to our token, which it had forgotten. (A
    /// release sent while the retake is out may reach that master first:
    /// the retaken copy then lasts until its TTL, on one master only.)
    ///
    /// A master that lost its data is taken although it is quarantined
    /// (`boot.rs`): the quarantine keeps it from voting for a *new* holder
    /// while holds it forgot may still run, and any such hold shared a
    /// master with the majority that just renewed ours, so it has ended.
    /// The retake creates the master's marker if it is missing, so the
    /// quarantine starts no later than this.
    async fn retake(
        &self,
        padded: &[Arc<HeldLock>],
        outcome: &[Option<bool>],
        answers: &[Option<Answer<Vec<Option<bool>>>>],
    ) {
        let mut calls: Vec<Call<'_, Answer<bool>>> = Vec::new();
        for (j, lock) in padded.iter().enumerate() {
            if outcome.get(j) != Some(&Some(true)) {
                continue;
            }
            let gone = answers.iter().enumerate().filter_map(|(i, a)| match a {
                Some(Ok(replies)) if replies.get(j) == Some(&Some(false)) => Some(i),
                _ => None,
            });
            let check = self.boot_check(lock.lease, true);
            calls.extend(self.calls_on(gone, |m| async move {
                // (A read hold is taken back as a read hold.)
                let taken = if lock.mode().is_read() {
                    self.read_checked(m, &lock.lock_key, &lock.holder, lock.lease, check)
                        .await?
                } else {
                    m.acquire_checked(&lock.lock_key, &lock.holder, lock.lease, check)
                        .await?
                };
                self.learn(taken.longest);
                if !matches!(taken.vote, Vote::Acquire(Acquire::Held { .. })) {
                    return Ok(false);
                }
                tracing::info!(
                    master = m.endpoint(),
                    "Redlock: took a held lock again on a master that had lost it"
                );
                self.raise_fence(m, &lock.lock_key, &lock.holder, lock.fence())
                    .await
            }));
        }
        if !calls.is_empty() {
            let _ = gather(calls, |_| false).await;
        }
    }
}

/// A copy of `lock` whose lease is padded with the drift allowance, for the
/// masters' renewals.
fn padded_copy(lock: &HeldLock) -> Arc<HeldLock> {
    HeldLock::new(Hold {
        key: String::new(),
        lock_key: lock.lock_key.clone(),
        holder: lock.holder.clone(),
        owner: lock.owner(),
        fence: lock.fence(),
        upto: lock.fence(),
        since: tokio::time::Instant::now(),
        epoch: 0,
        lease: quorum::padded(lock.lease),
        renew: lock.renew,
        fair: lock.fair,
        mode: lock.mode(),
    })
}
