//! A release: every node of the holder deleted (found by its uuid on the
//! session its creates went out on, when one lost its answer), after a
//! downgrade of it in flight; on a failure, sent again in the background.
//!
//! Owns the delete of a holder's nodes; retries nothing itself
//! (`releaser.rs`).

use super::{path, Inner, ZookeeperBackend};
use crate::backend::Holding;
use crate::backend::Release;
use crate::error::BackendError;

impl Inner {
    /// Deletes `holder`'s node of `lock`: freed (it was there) or not held.
    ///
    /// A holder of which a create lost its answer may have nodes this
    /// process does not know (instead of, or besides, the one it knows):
    /// every node of it is found by its uuid, listed on the session those
    /// creates went out on. ZooKeeper answers one session's requests in
    /// order, so the listing comes after the creates however late they are
    /// applied; a listing on another session (the reader's) may come first,
    /// find nothing, and leave a node to appear later, unknown to anyone,
    /// standing for as long as our session lives: the lock blocked.
    ///
    /// A downgrade of the holder in flight is waited for first: it moves
    /// the hold to another node. One that began after this release read
    /// the holder's node (a read frame released on another thread while
    /// the write frame's downgrade starts) is caught after the delete: the
    /// place then names the read node, which is deleted in turn.
    pub(super) async fn delete(&self, lock: &str, holder: &str) -> Result<Release, BackendError> {
        self.after_downgrade(lock, holder).await;
        let key = (lock.to_owned(), holder.to_owned());
        let mut freed = false;
        let mut deleted = Vec::new();
        for _round in 0..3 {
            let unsettled = self.unsettled().get(&key).cloned();
            let (client, names) = match (self.place(lock, holder), unsettled) {
                (Some(place), None) => (place.session.client(), vec![place.name]),
                (place, unsettled) => {
                    // Every node of the holder (a create whose answer was
                    // lost may have been applied besides the one known, if
                    // any).
                    let session = unsettled
                        .or_else(|| place.as_ref().map(|p| p.session.clone()))
                        .unwrap_or_else(|| self.reader.clone());
                    let client = session.client();
                    let children = self.list(&client, lock).await?;
                    let mut names: Vec<String> = children
                        .into_iter()
                        .filter(|c| path::is_holders(c, holder))
                        .collect();
                    if let Some(place) = place.filter(|p| !names.contains(&p.name)) {
                        names.push(place.name);
                    }
                    (client, names)
                }
            };
            for name in names {
                let node = path::child(lock, &name);
                // Versioned: nobody writes a lock node's data, so version 0
                // is the node we made (a node of the same path made later
                // would have another sequence anyway).
                let mut removed = self.within(client.delete(&node, Some(0))).await;
                if matches!(removed, Err(zookeeper_client::Error::BadVersion)) {
                    removed = self.within(client.delete(&node, None)).await;
                }
                tracing::debug!(lock, node = %name, outcome = ?removed, "ZooKeeper lock node deleted");
                match removed {
                    Ok(()) => freed = true,
                    Err(zookeeper_client::Error::NoNode) => {}
                    Err(error) => return Err(self.failed("release failed", error)),
                }
                deleted.push(name);
            }
            if self.forget_unless_moved(&key, &deleted) {
                break;
            }
        }
        Ok(if freed {
            Release::Freed
        } else {
            Release::NotHeld
        })
    }

    /// Forgets the place `key`, unless it names a node other than those
    /// `deleted` (a downgrade moved the hold meanwhile): then `false`.
    fn forget_unless_moved(&self, key: &(String, String), deleted: &[String]) -> bool {
        {
            let mut places = self.places();
            if places.get(key).is_some_and(|p| !deleted.contains(&p.name)) {
                return false;
            }
            places.remove(key);
        }
        self.unsettled().remove(key);
        self.forget_fixed_end(key);
        true
    }
}

impl ZookeeperBackend {
    /// Deletes `holder`'s node of `lock`. A delete whose answer was lost is
    /// sent again in the background (the node would otherwise stand as
    /// long as our session), and reported as a failure.
    pub(crate) async fn release(&self, hold: Holding<'_>) -> Result<Release, BackendError> {
        let (lock, holder) = (hold.lock_key, hold.holder);
        self.inner.waits.stop(lock, holder);
        match self.inner.delete(lock, holder).await {
            Ok(release) => Ok(release),
            Err(error) => {
                self.release_in_background(lock.to_owned(), holder.to_owned(), true);
                Err(error)
            }
        }
    }

    /// Queues the deletion of `holder`'s node of `lock`.
    pub(crate) fn release_in_background(&self, lock: String, holder: String, fair: bool) {
        self.inner.waits.stop(&lock, &holder);
        if !self.inner.releases.send(lock, holder, fair) {
            tracing::debug!("lock runtime stopped; a lock will be freed when its session closes");
        }
    }
}
