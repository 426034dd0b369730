//! Redlock's releases and downgrade: each sent to every master at once and
//! decided by a majority; a master that did not answer gets it again from
//! its own background releaser. The background releases of the runtime
//! (dropped guards, shutdown) are each master's releaser's, counted here
//! over the majority that matters.

use super::gather::{gather, Call};
use super::{quorum, Answer, Redlock};
use crate::backend::Holding;
use crate::backend::Release;
use crate::error::BackendError;

impl Redlock {
    pub(crate) async fn release(&self, hold: Holding<'_>) -> Result<Release, BackendError> {
        let quorum = self.inner.quorum;
        let calls = self.calls(|m| m.release(hold));
        let answers = gather(calls, |answers| {
            answers
                .iter()
                .filter(|a| matches!(a, Some(Ok(Release::Freed))))
                .count()
                >= quorum
        })
        .await;
        let count = |wanted: Release| {
            answers
                .iter()
                .filter(|a| matches!(a, Some(Ok(r)) if *r == wanted))
                .count()
        };
        let (freed, still, not_held) = (
            count(Release::Freed),
            count(Release::StillHeld),
            count(Release::NotHeld),
        );
        // Masters that have not answered (frozen, reconnecting) or failed
        // get the release again from their background releaser, which
        // retries: their copy of the hold must not wait for its TTL. (A
        // second release of a holder id is harmless: it finds nothing.)
        for (answer, master) in answers.iter().zip(&self.inner.masters) {
            if let (None | Some(Err(_)), Some(connected)) = (answer, master.slot.get()) {
                connected.backend.release_in_background(
                    hold.lock_key.to_owned(),
                    hold.holder.to_owned(),
                    hold.fair,
                );
            }
        }
        if still > 0 {
            Ok(Release::StillHeld)
        } else if freed >= quorum {
            Ok(Release::Freed)
        } else if freed + not_held >= quorum {
            Ok(Release::NotHeld)
        } else {
            Err(self.no_quorum("release", &answers))
        }
    }

    /// Turns `holder`'s write hold into a read hold on every master
    /// (`downgrade.lua`): done when a majority downgraded it, `Ok(false)`
    /// (lost) when more than a minority no longer record it, an error when
    /// too few answered to tell.
    ///
    /// Best effort per master: one that did not answer, or answered late,
    /// still records our write hold, which keeps writers out as the read
    /// hold does (and readers too: more exclusive, never less). So the hold
    /// stands while a majority records it in either mode, and is renewed
    /// and released there as whatever each master records (`renew.lua` and
    /// `release.lua` are mode-aware).
    pub(crate) async fn downgrade(
        &self,
        lock_key: &str,
        holder: &str,
    ) -> Result<bool, BackendError> {
        let masters = self.masters();
        let verdict = |answers: &[Option<Answer<bool>>]| {
            let said = |wanted: bool| {
                answers
                    .iter()
                    .filter(|a| matches!(a, Some(Ok(done)) if *done == wanted))
                    .count()
            };
            quorum::renewal(masters, said(true), said(false))
        };
        // (Plain: Redlock has no fair mode.)
        let hold = Holding {
            lock_key,
            holder,
            fair: false,
        };
        let calls = self.calls(|m| m.downgrade(hold));
        let answers = gather(calls, |answers| verdict(answers).is_some()).await;
        verdict(&answers).ok_or_else(|| self.no_quorum("downgrade", &answers))
    }

    pub(crate) fn release_in_background(&self, lock_key: String, holder: String, fair: bool) {
        for connected in self.inner.masters.iter().filter_map(|m| m.slot.get()) {
            connected
                .backend
                .release_in_background(lock_key.clone(), holder.clone(), fair);
        }
    }

    /// Whether background releases of `lock_key` are still out on so many
    /// masters that a majority cannot be free yet. (Out on a minority only —
    /// a frozen master, say — they do not stand in the way of the next
    /// acquire, which must not wait for that master.)
    pub(crate) fn release_pending(&self, lock_key: &str) -> bool {
        let pending = self
            .inner
            .masters
            .iter()
            .filter_map(|m| m.slot.get())
            .filter(|c| c.backend.pending().is_pending(lock_key))
            .count();
        pending > self.masters() - self.inner.quorum
    }

    /// Resolves once a majority of masters has no background release of
    /// `lock_key` out.
    pub(crate) async fn releases_settled(&self, lock_key: &str) {
        let quorum = self.inner.quorum;
        let calls = self.calls(|m| async move {
            m.pending().settled(lock_key).await;
            Ok::<(), BackendError>(())
        });
        let _ = gather(calls, |answers| answers.iter().flatten().count() >= quorum).await;
    }

    /// Resolves once every background release queued so far on every
    /// master has been answered (or given up).
    pub(crate) async fn all_releases_settled(&self) {
        let settled = self
            .inner
            .masters
            .iter()
            .filter_map(|m| m.slot.get())
            .map(|c| Box::pin(c.backend.pending().all_settled()) as Call<'_, ()>)
            .collect();
        let _ = gather(settled, |_| false).await;
    }

    /// See `Backend::record_given_up_releases`: on every master.
    pub(crate) fn record_given_up_releases(&self) {
        for master in self.inner.masters.iter().filter_map(|m| m.slot.get()) {
            master.backend.pending().record_given_up();
        }
    }

    /// The locks of which a background release is unconfirmed on any
    /// master (shutdown waits for every master, as it does for the drain).
    pub(crate) fn unconfirmed_releases(&self) -> std::collections::BTreeSet<String> {
        let masters = self.inner.masters.iter().filter_map(|m| m.slot.get());
        masters
            .flat_map(|master| master.backend.pending().unconfirmed())
            .collect()
    }
}
