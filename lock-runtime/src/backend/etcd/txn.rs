//! The one call every operation sends: a transaction, bounded by the
//! response timeout, its answer's revision checked against the highest
//! seen (a lower one: the cluster was wiped or restored), its failure
//! classified (a refusal for lack of a permission is marked, the first
//! failure after an answer tells the waiters news may have been lost);
//! and the readings of an answer.
//!
//! Owns `Inner::txn` and nothing of a lock's layout: what a transaction
//! holds is its caller's (`acquire.rs`, `release.rs`, ...).

use std::sync::atomic::Ordering;

use etcd_client::{Txn, TxnOpResponse, TxnResponse};

use super::Inner;
use crate::error::BackendError;

/// gRPC's status code `PERMISSION_DENIED`: etcd's answer to a call on a
/// key that no role of the user covers ("etcdserver: permission denied").
const GRPC_PERMISSION_DENIED: i32 = 7;

impl Inner {
    /// A request failed: the first failure after an answer counts as a lost
    /// connection (a watch event may have been missed meanwhile).
    pub(super) fn failed(&self, error: &etcd_client::Error) {
        tracing::debug!(%error, endpoints = %self.endpoints, "etcd request failed");
        if self.healthy.swap(false, Ordering::AcqRel) {
            if let Some(wakeups) = self.wakeups.upgrade() {
                wakeups.connection_lost();
            }
        }
    }

    /// A request sent when the highest revision seen was `floor` was
    /// answered at `revision`. Only an answer below what was seen before
    /// the request went out means another history: concurrent answers may
    /// arrive in any order (a read served before a concurrent write).
    fn answered(&self, revision: i64, floor: i64) {
        self.healthy.store(true, Ordering::Release);
        self.revision.fetch_max(revision, Ordering::AcqRel);
        if revision < floor {
            let before = floor;
            // Linearizable reads never go back: this is another history.
            tracing::warn!(
                endpoints = %self.endpoints,
                revision,
                before,
                "etcd's revision went back: the cluster was wiped or restored from a backup; \
                 fencing tokens (create revisions) start again lower"
            );
            self.revision.store(revision, Ordering::Release);
            if let Some(wakeups) = self.wakeups.upgrade() {
                wakeups.connection_lost();
            }
        }
    }

    /// One transaction, bounded by the response timeout.
    pub(super) async fn txn(&self, txn: Txn) -> Result<TxnResponse, BackendError> {
        let mut kv = self.client.kv_client();
        let floor = self.revision.load(Ordering::Acquire);
        match tokio::time::timeout(self.timeout, kv.txn(txn)).await {
            Ok(Ok(answer)) => {
                self.answered(answer.header().map_or(floor, |h| h.revision()), floor);
                Ok(answer)
            }
            Ok(Err(error)) => {
                self.failed(&error);
                // A user whose roles do not cover a name of the transaction
                // is refused for good.
                let denied = matches!(&error, etcd_client::Error::GRpcStatus(status)
                    if i32::from(status.code()) == GRPC_PERMISSION_DENIED);
                Err(
                    BackendError::new(format!("etcd transaction at {}", self.endpoints), error)
                        .denied_if(denied),
                )
            }
            Err(_) => {
                self.healthy.store(false, Ordering::Release);
                Err(BackendError::msg(format!(
                    "etcd at {}: no answer within {:?}",
                    self.endpoints, self.timeout
                )))
            }
        }
    }
}

/// Whether a delete of the answer removed a key.
pub(super) fn deleted(answer: &TxnResponse) -> bool {
    answer.op_responses().into_iter().any(|r| match r {
        TxnOpResponse::Delete(d) => d.deleted() > 0,
        _ => false,
    })
}

/// The reads of a transaction's answer, in order.
pub(super) fn gets(answer: &TxnResponse) -> Vec<etcd_client::GetResponse> {
    answer
        .op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect()
}
