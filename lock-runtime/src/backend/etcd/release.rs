//! A release: both keys of the holder deleted in one transaction (a
//! release needs no mode), with the holder's tombstone where a put of
//! either went out unanswered (`tomb.rs`); on a failure, queued for the
//! background releaser (`releaser.rs`).
//!
//! Owns the deletes of a holder's keys; answers no waiter (the next key's
//! watch, `wait.rs`, sees the delete).

use etcd_client::{PutOptions, Txn, TxnOp};

use super::readers::read_node;
use super::txn::deleted;
use super::{node, tomb, EtcdBackend, Inner};
use crate::backend::releases::{Job, Op};
use crate::backend::Holding;
use crate::backend::Release;
use crate::error::BackendError;

impl Inner {
    /// The operations deleting `holder`'s keys of `lock` (its write and
    /// its read key: a release needs no mode): with its tombstone, when a
    /// put of either went out unanswered (see `tomb.rs`) and `tombstone` is
    /// set.
    fn deletes(&self, lock: &str, holder: &str, tombstone: bool) -> Vec<TxnOp> {
        let keys = [node(lock, holder), read_node(lock, holder)];
        let lease = tombstone
            .then(|| keys.iter().find_map(|key| self.unanswered.lease_of(key)))
            .flatten();
        let mut ops: Vec<TxnOp> = keys.map(|key| TxnOp::delete(key, None)).into();
        if let Some(lease) = lease {
            let on = PutOptions::new().with_lease(lease);
            ops.push(TxnOp::put(tomb::key(lock, holder), "", Some(on)));
        }
        ops
    }

    /// Both keys of `holder` in `lock` are deleted (with a tombstone where
    /// needed): no late put of either can write anything any more.
    fn settled(&self, lock: &str, holder: &str) {
        self.unanswered.settled(&node(lock, holder));
        self.unanswered.settled(&read_node(lock, holder));
    }

    /// Deletes these holders' keys, `(lock, holder)`, in one transaction,
    /// with the tombstones they need; `true` if one was there.
    pub(super) async fn delete_keys(
        &self,
        keys: &[(String, String)],
    ) -> Result<bool, BackendError> {
        let ops = keys
            .iter()
            .flat_map(|(lock, holder)| self.deletes(lock, holder, true))
            .collect::<Vec<_>>();
        match self.txn(Txn::new().and_then(ops)).await {
            Ok(answer) => {
                for (lock, holder) in keys {
                    self.settled(lock, holder);
                }
                Ok(deleted(&answer))
            }
            // A tombstone's lease ran out (or was revoked): the late put on
            // it can write nothing now, so that key needs no tombstone. Which
            // one: key by key.
            Err(error) if tomb::lease_gone(&error) => {
                let mut any = false;
                for (lock, holder) in keys {
                    let ops = self.deletes(lock, holder, true);
                    let answer = match self.txn(Txn::new().and_then(ops)).await {
                        Err(error) if tomb::lease_gone(&error) => {
                            let ops = self.deletes(lock, holder, false);
                            self.txn(Txn::new().and_then(ops)).await?
                        }
                        answer => answer?,
                    };
                    self.settled(lock, holder);
                    any |= deleted(&answer);
                }
                Ok(any)
            }
            Err(error) => Err(error),
        }
    }
}

impl EtcdBackend {
    /// Deletes `holder`'s keys of `lock` (write and read: whichever it
    /// has). A background downgrade of the holder still queued is
    /// superseded: its answer no longer says anything of the hold.
    pub(crate) async fn release(&self, hold: Holding<'_>) -> Result<Release, BackendError> {
        let (lock, holder, fair) = (hold.lock_key, hold.holder, hold.fair);
        self.inner.waits.stop(lock, holder);
        self.inner.superseded(lock, holder);
        let deleted = match self
            .inner
            .delete_keys(&[(lock.to_owned(), holder.to_owned())])
            .await
        {
            Ok(deleted) => deleted,
            Err(error) => {
                // The key would outlive this failure: the runtime's lease is
                // kept alive. The background releaser tries until etcd
                // answers.
                self.release_in_background(lock.to_owned(), holder.to_owned(), fair);
                return Err(error);
            }
        };
        Ok(if deleted {
            Release::Freed
        } else {
            Release::NotHeld
        })
    }

    /// Queues the deletion of `holder`'s keys of `lock`.
    pub(crate) fn release_in_background(&self, lock: String, holder: String, fair: bool) {
        self.inner.waits.stop(&lock, &holder);
        self.inner.superseded(&lock, &holder);
        let job = Job {
            lock_key: lock.clone(),
            holder,
            op: Op::Release { fair },
        };
        if !self.inner.releases.send_job(&lock, job) {
            tracing::debug!("lock runtime stopped; a lock will be freed by its etcd lease");
        }
    }
}
