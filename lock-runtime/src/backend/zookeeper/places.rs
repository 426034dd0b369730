//! Fair places on ZooKeeper: their refresh (each node still queued:
//! standing, not first) and the waiters' side of the watches (a place's
//! watch starts with the acquire that queued it; a place given back has
//! its node deleted in the background).
//!
//! Owns no wait of a place (`wait.rs`) and no delete (`release.rs`).

use std::sync::Arc;

use zookeeper_client::MultiReadResult;

use super::{path, Inner, Place, ZookeeperBackend, MULTI_OPS};
use crate::backend::place_tasks::GivesBackPlaces;
use crate::backend::{PlaceRefresh, Refreshed};
use crate::error::BackendError;

impl ZookeeperBackend {
    /// Confirms fair places: each node still queued (standing, not first).
    pub(crate) async fn refresh_places(
        &self,
        batch: &[PlaceRefresh],
    ) -> Result<Vec<Option<Refreshed>>, BackendError> {
        let gone = Refreshed {
            queued: false,
            lock_ttl: -2,
        };
        let client = self.inner.reader.client();
        let mut outcome = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(MULTI_OPS) {
            let places: Vec<Option<Place>> = chunk
                .iter()
                .map(|p| self.inner.place(&p.lock_key, &p.holder))
                .collect();
            let locks = chunk.iter().map(|p| p.lock_key.clone());
            let read = self
                .inner
                .read_each(&client, locks, true)
                .await
                .map_err(|e| self.inner.failed("fair place refresh failed", e))?;
            for (place, result) in places.into_iter().zip(read) {
                let Some(place) = place else {
                    outcome.push(Some(gone));
                    continue;
                };
                outcome.push(match result {
                    MultiReadResult::Children { children } => {
                        let sorted = path::sorted(children);
                        Some(match path::turn(&sorted, &place.name) {
                            path::Turn::Gone => gone,
                            path::Turn::Holds => Refreshed {
                                queued: false,
                                lock_ttl: -1,
                            },
                            path::Turn::Behind(_) => Refreshed {
                                queued: true,
                                lock_ttl: -1,
                            },
                        })
                    }
                    MultiReadResult::Error {
                        err: zookeeper_client::Error::NoNode,
                    } => Some(gone),
                    _ => None,
                });
            }
        }
        Ok(outcome)
    }
}

/// The waiters' side (`PlaceWatches`): an unused place's node is deleted
/// in the background.
impl GivesBackPlaces for Inner {
    fn give_back(self: Arc<Self>, lock: String, holder: String) {
        ZookeeperBackend { inner: self }.release_in_background(lock, holder, true);
    }
}
