//! An attempt's steps: the session of the hold's lease, the holder's node
//! (its place reused, queued again on another session or name, or
//! created), twins dropped, the turn read (`path::turn`): held, queued
//! (its wait started, `wait.rs`), or (trying once) its node deleted again;
//! a fixed lease's node deleted when the lease ends.
//!
//! Owns the decision of an attempt; creates no node itself (`nodes.rs`)
//! and renews nothing (`renew.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::sessions::Session;
use super::{path, wait, Inner, Place, ZookeeperBackend, RELEASE_ATTEMPTS};
use crate::backend::{Acquire, Queue};
use crate::error::BackendError;
use crate::mode::LockMode;

impl Inner {
    /// Deletes `holder`'s node of `lock` (the hold of token `fence`; its
    /// read node after a downgrade) at `at`, if it is still there then: a
    /// fixed lease (no watchdog) ends on the server when it runs out, as a
    /// Redis key's TTL does, although our session would keep the node.
    /// `at` is counted from when our acquire was sent, so it is never
    /// before the end of the hold's validity, which counts from before.
    fn expire(self: &Arc<Self>, lock: &str, holder: &str, fence: i64, at: tokio::time::Instant) {
        let inner = Arc::downgrade(self);
        let (lock, holder) = (lock.to_owned(), holder.to_owned());
        self.handle.spawn(async move {
            tokio::time::sleep_until(at).await;
            for attempt in 1..=RELEASE_ATTEMPTS {
                let Some(backend) = inner.upgrade() else {
                    return;
                };
                if backend
                    .place(&lock, &holder)
                    .is_none_or(|p| p.fence != fence)
                {
                    return; // released, or another node's now
                }
                tracing::debug!(%lock, fence, "ZooKeeper fixed lease ran out: its node is deleted");
                if backend.delete(&lock, &holder).await.is_ok() {
                    return;
                }
                drop(backend);
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
        });
    }
}

impl Inner {
    /// The holder's node for an attempt of `mode` on `session` (of
    /// `lease`) and the children seen with it: its place as it stands, or
    /// made again, or new; and whether it was made now.
    async fn node_for(
        &self,
        session: &Arc<Session>,
        lock: &str,
        holder: &str,
        lease: Duration,
        mode: LockMode,
    ) -> Result<(Place, Vec<String>, bool), BackendError> {
        let named = path::node_prefix(holder, mode);
        Ok(match self.place(lock, holder) {
            Some(place)
                if place.owner == place.session.id()
                    && place.session.timeout >= lease
                    && place.name.starts_with(&named) =>
            {
                let children = self.list_latest(&place.session.client(), lock).await?;
                (place, children, false)
            }
            Some(place) if place.owner == place.session.id() => {
                // This process's place, queued by a waiter of a shorter
                // lease: its node is on that lease's session, which a
                // stall longer than that lease ends (the node with it)
                // while a hold of this lease would still count on it.
                // ZooKeeper moves no node to another session: the place
                // queues again on this lease's (its turn is lost). So
                // does a place queued by an exclusive waiter and used by
                // a write one (or back): the node's name is its mode
                // (Curator reads it), and ZooKeeper renames no node. (A
                // place never serves a read and a write: the waiters
                // queue a new id for the other one, see
                // `Backend::places_have_modes`.)
                self.waits.stop(lock, holder);
                self.delete(lock, holder).await?;
                let (place, children) = self.create(session, lock, holder, mode).await?;
                (place, children, true)
            }
            _ => {
                // New, or made by a session that expired since.
                self.forget(lock, holder);
                let (place, children) = self.create(session, lock, holder, mode).await?;
                (place, children, true)
            }
        })
    }
}

impl ZookeeperBackend {
    /// One attempt for `holder` (see the module docs).
    pub(crate) async fn acquire(
        &self,
        lock: &str,
        holder: &str,
        (lease, renewed): (Duration, bool),
        queue: Queue,
        mode: LockMode,
    ) -> Result<Acquire, BackendError> {
        let sent = tokio::time::Instant::now();
        let inner = &self.inner;
        let session = inner.sessions.for_lease(lease).await?;
        if session.timeout < lease {
            return Err(BackendError::msg(format!(
                "ZooKeeper at {} granted a session timeout of {:?}, shorter than the lease \
                 {lease:?}: use a shorter lease or raise maxSessionTimeout",
                inner.sessions.shown(),
                session.timeout
            )));
        }
        for _attempt in 0..3 {
            let (place, children, created) =
                inner.node_for(&session, lock, holder, lease, mode).await?;
            let client = place.session.client();
            if inner
                .drop_twins(&client, lock, holder, &place.name, &children)
                .await?
            {
                continue; // and list again
            }
            let sorted = path::sorted(children);
            let fence = u64::try_from(place.fence).unwrap_or(0);
            match path::turn(&sorted, &place.name) {
                // Gone (a force unlock, an expiry): queue again.
                path::Turn::Gone => inner.forget(lock, holder),
                path::Turn::Holds => {
                    tracing::debug!(
                        lock, node = %place.name, fence, session = place.owner,
                        first = ?sorted.first(), created, "ZooKeeper lock held"
                    );
                    inner.waits.stop(lock, holder);
                    if !renewed {
                        inner.expire(lock, holder, place.fence, sent + lease);
                    }
                    return Ok(Acquire::Held {
                        fence,
                        upto: fence,
                        handed: !created,
                    });
                }
                path::Turn::Behind(_) if matches!(queue, Queue::Join(_)) => {
                    wait::start(inner, lock, holder);
                    return Ok(Acquire::Busy { ttl: None });
                }
                path::Turn::Behind(_) => {
                    // Trying once: leave no node behind.
                    if inner.delete(lock, holder).await.is_err() {
                        self.release_in_background(lock.to_owned(), holder.to_owned(), true);
                    }
                    return Ok(Acquire::Busy { ttl: None });
                }
            }
        }
        Err(BackendError::msg(format!(
            "acquire of {lock} on ZooKeeper at {}: our node vanished three times in a row",
            inner.sessions.shown()
        )))
    }
}
