//! Fair places on etcd: their refresh (each key still queued, on a lease
//! confirmed for the place's handoff lease) and the waiters' side of the
//! watches (a place's watch starts with the acquire that queued it; a
//! place given back has its keys deleted in the background).
//!
//! Owns no wait of a place (`wait.rs`) and no delete (`release.rs`).

use std::sync::Arc;

use etcd_client::{Txn, TxnOp};
use tokio::time::Instant;

use super::readers::{self, read_node};
use super::txn::gets;
use super::{first_of, node, EtcdBackend, Inner, TXN_OPS};
use crate::backend::place_tasks::GivesBackPlaces;
use crate::backend::{PlaceRefresh, Refreshed};
use crate::error::BackendError;

impl EtcdBackend {
    /// Confirms fair places: each key still queued (standing, not first)
    /// on a lease confirmed for the place's handoff lease.
    pub(crate) async fn refresh_places(
        &self,
        batch: &[PlaceRefresh],
    ) -> Result<Vec<Option<Refreshed>>, BackendError> {
        let sent = Instant::now();
        let mut outcome = Vec::with_capacity(batch.len());
        // Per place: its two keys, the directory's first key (a writer's
        // turn) and the first writer keys (a reader's).
        for chunk in batch.chunks(TXN_OPS / 5) {
            let reads: Vec<TxnOp> = chunk
                .iter()
                .flat_map(|p| {
                    let [writers, after] = readers::first_writers(&p.lock_key);
                    [
                        TxnOp::get(node(&p.lock_key, &p.holder), None),
                        TxnOp::get(read_node(&p.lock_key, &p.holder), None),
                        first_of(&p.lock_key),
                        writers,
                        after,
                    ]
                })
                .collect();
            let answer = self.inner.txn(Txn::new().and_then(reads)).await?;
            let reads = gets(&answer);
            for (place, five) in chunk.iter().zip(reads.chunks(5)) {
                let [write, read, first, pages @ ..] = five else {
                    outcome.push(None);
                    continue;
                };
                let lock = place.lock_key.as_str();
                let own = write.kvs().first().or_else(|| read.kvs().first());
                let refreshed = match own {
                    None => Some(Refreshed {
                        queued: false,
                        lock_ttl: -2,
                    }),
                    Some(kv)
                        if if readers::is_reader(lock, kv.key(), kv.value()) {
                            readers::blocked(lock, pages, kv.create_revision()) == Some(false)
                        } else {
                            first.kvs().first().is_some_and(|f| f.key() == kv.key())
                        } =>
                    {
                        Some(Refreshed {
                            queued: false,
                            lock_ttl: -1,
                        })
                    }
                    Some(kv) => self
                        .inner
                        .leases
                        .confirmed_until(kv.lease(), sent + place.lease)
                        .then_some(Refreshed {
                            queued: true,
                            lock_ttl: -1,
                        }),
                };
                outcome.push(refreshed);
            }
        }
        Ok(outcome)
    }
}

/// The waiters' side (`PlaceWatches`): an unused place's keys are deleted
/// in the background.
impl GivesBackPlaces for Inner {
    fn give_back(self: Arc<Self>, lock: String, holder: String) {
        EtcdBackend { inner: self }.release_in_background(lock, holder, true);
    }
}
