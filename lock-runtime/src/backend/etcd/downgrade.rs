//! A downgrade: the holder's write key keeps its name, lease and create
//! revision and takes the value `r` (a reader now, still before the
//! writers queued after it); the one change of a key's mode. A background
//! downgrade is queued with the releases (`releaser.rs`), and a release
//! of the same holder sent since supersedes its answer.
//!
//! Owns the holders whose downgrade is queued (`Inner::downgrading`);
//! deletes no key.

use std::collections::HashSet;
use std::sync::{Arc, PoisonError, Weak};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::readers::READER;
use super::{node, EtcdBackend, Inner};
use crate::backend::releases::{Job, Op};
use crate::error::BackendError;
use crate::held::HeldLock;

/// The key a downgrade turns into a reader: `holder`'s write key, given
/// the value `r` on its own lease, if it still stands with the hold's
/// token (its create revision).
pub(super) fn downgrade_txn(lock: &str, holder: &str, token: u64) -> Txn {
    let key = node(lock, holder);
    let token = i64::try_from(token).unwrap_or(-1);
    Txn::new()
        .when([Compare::create_revision(
            key.clone(),
            CompareOp::Equal,
            token,
        )])
        .and_then([TxnOp::put(
            key,
            READER,
            Some(PutOptions::new().with_ignore_lease()),
        )])
}

impl Inner {
    fn downgrading(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        self.downgrading
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A release of `holder` was sent: its queued downgrade, if any, says
    /// nothing of the hold any more.
    pub(super) fn superseded(&self, lock: &str, holder: &str) {
        let mut downgrading = self.downgrading();
        if !downgrading.is_empty() {
            downgrading.remove(&(lock.to_owned(), holder.to_owned()));
        }
    }

    /// The answer to a background downgrade of `job`'s holder: the key gone
    /// marks `held` lost, unless a release of the holder was sent since
    /// (it may have deleted the key first). No answer leaves the hold a
    /// write hold on the server until its release: more exclusive.
    pub(super) fn downgrade_answered(
        &self,
        job: &Job,
        held: &Weak<HeldLock>,
        answer: Result<bool, BackendError>,
    ) {
        let id = (job.lock_key.clone(), job.holder.clone());
        let current = self.downgrading().remove(&id);
        match answer {
            Ok(true) => {}
            Ok(false) => {
                if let Some(held) = held.upgrade().filter(|_| current) {
                    held.mark_lost();
                }
            }
            Err(error) => tracing::debug!(
                %error,
                "a background downgrade was not answered: the hold stays a write hold on \
                 etcd until its release"
            ),
        }
    }
}

impl EtcdBackend {
    /// Turns the write hold `held` into a read hold: its key keeps its
    /// name, lease and create revision (its token and its place before the
    /// writers queued after it) and takes the value `r`, which readers
    /// skip. `false`: the key is gone (the hold is lost).
    pub(crate) async fn downgrade(&self, held: &HeldLock) -> Result<bool, BackendError> {
        let txn = downgrade_txn(&held.lock_key, &held.holder, held.fence());
        Ok(self.inner.txn(txn).await?.succeeded())
    }

    /// Queues [`downgrade`](Self::downgrade) of `held` with the background
    /// releases, ahead of any later release of the holder (see `releaser`).
    pub(crate) fn downgrade_in_background(&self, held: &Arc<HeldLock>) {
        let (lock, holder) = (held.lock_key.clone(), held.holder.clone());
        self.inner
            .downgrading()
            .insert((lock.clone(), holder.clone()));
        let job = Job {
            lock_key: lock.clone(),
            holder,
            op: Op::Downgrade(Arc::downgrade(held)),
        };
        if !self.inner.releases.send_job(&lock, job) {
            tracing::debug!("lock runtime stopped; a downgrade is not sent");
        }
    }
}
