//! An attempt's steps: the session of the hold's lease, the holder's node
//! (its place reused, queued again on another session or name, or
//! created), twins dropped, the turn read (`path::turn`): held, queued
//! (its wait started, `wait.rs`), or (trying once) its node deleted again;
//! a fixed lease's node deleted when the lease ends.
//!
//! Owns the decision of an attempt; creates no node itself (`nodes.rs`)
//! and renews nothing (`renew.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::sessions::Session;
use super::{path, wait, Inner, Place, ZookeeperBackend, RELEASE_ATTEMPTS};
use crate::backend::Ask;
use crate::backend::{Acquire, Queue};
use crate::error::BackendError;
use crate::mode::LockMode;

/// Numbers the fixed-lease timers of a process.
static NEXT_END: AtomicU64 = AtomicU64::new(1);

impl Inner {
    /// Sets the end of `holder`'s hold of `lock` (token `fence`) on the
    /// server: `Some(at)` for a fixed lease (no watchdog), which ends there
    /// as a Redis key's TTL does although our session would keep the node
    /// (its read node after a downgrade is deleted then); `None` for a
    /// renewed one, which the session keeps. Either replaces the end an
    /// earlier answer on the same node set: a process's place serves its
    /// waiters in turn, and a fixed lease's timer left from a waiter that
    /// went away must not delete the node under the renewed hold of the
    /// next (the nemesis saw that: a 77 ms overlap on ZooKeeper). `at` is
    /// counted from when the acquire was sent, so it is never before the
    /// end of the hold's validity, which counts from before.
    fn end_fixed_lease(
        self: &Arc<Self>,
        lock: &str,
        holder: &str,
        fence: i64,
        at: Option<Instant>,
    ) {
        let key = (lock.to_owned(), holder.to_owned());
        let mut ends = self
            .fixed_ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(at) = at else {
            ends.remove(&key);
            return;
        };
        let number = NEXT_END.fetch_add(1, Ordering::Relaxed);
        ends.insert(key.clone(), number);
        drop(ends);
        let inner = Arc::downgrade(self);
        self.handle.spawn(async move {
            tokio::time::sleep_until(at).await;
            for attempt in 1..=RELEASE_ATTEMPTS {
                let Some(backend) = inner.upgrade() else {
                    return;
                };
                if !backend.fixed_end_stands(&key, number, fence) {
                    return; // released, replaced, or another node's now
                }
                tracing::debug!(lock = %key.0, fence, "ZooKeeper fixed lease ran out: its node is deleted");
                if backend.delete(&key.0, &key.1).await.is_ok() {
                    return;
                }
                drop(backend);
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
        });
    }

    /// Drops `key`'s fixed-lease end (its node is gone, or forgotten).
    pub(super) fn forget_fixed_end(&self, key: &(String, String)) {
        let mut ends = self
            .fixed_ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ends.remove(key);
    }

    /// Whether timer `number` still ends `key`'s hold of token `fence`.
    fn fixed_end_stands(&self, key: &(String, String), number: u64, fence: i64) -> bool {
        let ends = self
            .fixed_ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ends.get(key) == Some(&number)
            && self.place(&key.0, &key.1).is_some_and(|p| p.fence == fence)
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
    pub(crate) async fn acquire(&self, ask: Ask<'_>) -> Result<Acquire, BackendError> {
        let (lock, holder, lease) = (ask.lock_key, ask.holder, ask.lease);
        let (renewed, queue, mode) = (ask.renewed, ask.queue, ask.mode);
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
                    let ends = (!renewed).then_some(sent + lease);
                    inner.end_fixed_lease(lock, holder, place.fence, ends);
                    return Ok(Acquire::Held {
                        fence,
                        upto: fence,
                        handed: !created,
                    });
                }
                path::Turn::Behind(before) if matches!(queue, Queue::Join(_)) => {
                    wait::start(inner, lock, holder, before);
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
