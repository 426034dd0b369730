//! Renewal: a keep-alive of each etcd lease the batch's holds use
//! (`lease.rs`), and one read per holder confirming that its key still
//! stands with its create revision, in the hold's mode (`modes.rs`); a
//! key on a lease too short for its hold is moved onto the hold's own.
//!
//! Owns no key's write but that move (`EtcdBackend::reattach`).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Txn, TxnOp};
use tokio::time::Instant;

use super::readers::read_node;
use super::txn::gets;
use super::{lease, modes, node, EtcdBackend, TXN_OPS};
use crate::error::BackendError;
use crate::held::HeldLock;

impl EtcdBackend {
    /// Keeps the leases of `batch` alive and confirms that every key still
    /// stands with its create revision, in the hold's mode (see the module
    /// docs).
    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        let sent = Instant::now();
        let keeping = self.keep_alive_for(batch.iter().map(|l| l.lease));
        let mut outcome = Vec::with_capacity(batch.len());
        let reading = async {
            let mut found = Vec::with_capacity(batch.len());
            // (Both keys of each holder: a hold is its write key, its read
            // key, or a write key made a reader.)
            for chunk in batch.chunks(TXN_OPS / 2) {
                let reads = chunk.iter().flat_map(|l| {
                    [
                        TxnOp::get(node(&l.lock_key, &l.holder), None),
                        TxnOp::get(read_node(&l.lock_key, &l.holder), None),
                    ]
                });
                let answer = self
                    .inner
                    .txn(Txn::new().and_then(reads.collect::<Vec<_>>()))
                    .await?;
                let reads = gets(&answer);
                for (lock, pair) in chunk.iter().zip(reads.chunks(2)) {
                    let fence = i64::try_from(lock.fence()).unwrap_or(-1);
                    // The hold's mode as of the answer (a downgrade turns it
                    // read before it is sent): a write hold stands only on a
                    // key that is still a writer (`modes.rs`).
                    let mode = lock.mode();
                    let (names, kvs) = (
                        [
                            (node(&lock.lock_key, &lock.holder), false),
                            (read_node(&lock.lock_key, &lock.holder), true),
                        ],
                        pair.iter().map(|g| g.kvs().first()),
                    );
                    found.push(names.into_iter().zip(kvs).find_map(|((name, read), kv)| {
                        kv.filter(|kv| {
                            kv.create_revision() == fence && modes::carries(mode, read, kv.value())
                        })
                        .map(|kv| (name, kv.lease(), kv.value().to_vec()))
                    }));
                }
            }
            Ok::<_, BackendError>(found)
        };
        let ((), found) = tokio::join!(keeping, reading);
        let found = found?;
        for (lock, kv) in batch.iter().zip(found) {
            outcome.push(match kv {
                None => Some(false),
                Some((_, lease, _))
                    if self.inner.leases.confirmed_until(lease, sent + lock.lease) =>
                {
                    Some(true)
                }
                // On a lease too short for this hold (a place queued by a
                // sibling with a shorter lease, handed to this one): moved
                // onto the hold's own lease, then confirmed at the next
                // renewal; unknown until then.
                Some((key, _, value)) => {
                    if let Ok(own) = self.inner.leases.ahead(lock.lease).await {
                        let mine = i64::try_from(lock.fence()).unwrap_or(-1);
                        let _ = self.reattach(&key, mine, &value, own.id).await;
                    }
                    None
                }
            });
        }
        Ok(outcome)
    }

    /// One keep-alive of each lease that locks of these lease lengths use
    /// (failures show as leases not confirmed).
    async fn keep_alive_for(&self, leases: impl Iterator<Item = Duration>) {
        let mut ttls: Vec<u64> = leases.map(lease::ttl_secs).collect();
        ttls.sort_unstable();
        ttls.dedup();
        let all = self.inner.leases.all();
        let keeping = all
            .iter()
            .filter(|l| ttls.contains(&l.ttl_secs()))
            .map(|l| self.inner.leases.keep_alive_or_forget(l));
        futures_util::future::join_all(keeping).await;
    }
}
