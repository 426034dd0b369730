//! Renewal: one multi-read per session confirming every held node still
//! stands with its czxid, made by the session as it is now (which also
//! tells the server the session is alive).
//!
//! Owns no write: a node found gone is reported, not made again.

use std::sync::Arc;

use zookeeper_client::MultiReadResult;

use super::sessions::Session;
use super::{path, Place, ZookeeperBackend, MULTI_OPS};
use crate::error::BackendError;
use crate::held::HeldLock;

impl ZookeeperBackend {
    /// Confirms every held node of `batch`: one multi-read per session
    /// (which also tells the server the session is alive).
    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        let mut outcome = vec![None; batch.len()];
        // The held nodes of each session, with their place in `batch`.
        type Group = (Arc<Session>, Vec<(usize, Place)>);
        let mut groups: Vec<Group> = Vec::new();
        for (i, lock) in batch.iter().enumerate() {
            let Some(place) = self.inner.place(&lock.lock_key, &lock.holder) else {
                tracing::debug!(lock = %lock.lock_key, "ZooKeeper renewal: no place for a held lock");
                outcome[i] = Some(false);
                continue;
            };
            // (The hold's token, which a downgrade keeps; `confirm` checks
            // the node's own czxid.)
            if u64::try_from(place.fence).ok() != Some(lock.fence()) {
                outcome[i] = Some(false);
                continue;
            }
            match groups
                .iter_mut()
                .find(|(s, _)| Arc::ptr_eq(s, &place.session))
            {
                Some((_, items)) => items.push((i, place)),
                None => groups.push((place.session.clone(), vec![(i, place)])),
            }
        }
        let checks = groups.iter().flat_map(|(session, items)| {
            items
                .chunks(MULTI_OPS)
                .map(move |chunk| self.confirm(session, chunk, batch))
        });
        for found in futures_util::future::join_all(checks).await {
            for (i, held) in found {
                outcome[i] = held;
            }
        }
        Ok(outcome)
    }

    /// Whether each node of `chunk` (all of `session`) still stands, made
    /// by the session as it is now.
    async fn confirm(
        &self,
        session: &Session,
        chunk: &[(usize, Place)],
        batch: &[Arc<HeldLock>],
    ) -> Vec<(usize, Option<bool>)> {
        let client = session.client();
        let id = client.session_id().0;
        let nodes = chunk
            .iter()
            .map(|(i, place)| path::child(&batch[*i].lock_key, &place.name));
        let Ok(read) = self.inner.read_each(&client, nodes, false).await else {
            return chunk.iter().map(|(i, _)| (*i, None)).collect();
        };
        chunk
            .iter()
            .zip(read)
            .map(|((i, place), result)| {
                let held = match result {
                    MultiReadResult::Data { stat, .. } => Some(
                        stat.czxid == place.czxid
                            && stat.ephemeral_owner == id
                            && place.owner == id,
                    ),
                    MultiReadResult::Error {
                        err: zookeeper_client::Error::NoNode,
                    } => Some(false),
                    _ => None,
                };
                if held == Some(false) {
                    tracing::debug!(
                        lock = %batch[*i].lock_key, node = %place.name, session = id,
                        owner = place.owner, "ZooKeeper renewal found a held node gone or not ours"
                    );
                }
                (*i, held)
            })
            .collect()
    }
}
