//! A queued place's turn: each node of this process waiting in a lock's
//! queue watches the node it waits for (a data watch, as Curator sets it):
//! a write or exclusive node the one just before it, a read node the last
//! write or exclusive node before it; never the lock's children, so a
//! release wakes one process, not every waiter.
//!
//! When that node goes (released, its session expired, or a force
//! unlock), the place lists the children again: a new predecessor is
//! watched in turn; none means the lock is the place's (the list is the
//! server's word, read after the predecessor's delete), and the waiters
//! are told to try: their attempt with the place takes the lock, with our
//! node's czxid as the token. Not handed over from here: a place is shared
//! by the process's waiters of every lease, and its node lives on the
//! session of the lease that queued it; only the attempt knows the lease
//! it takes the lock for (a fixed lease counts from its send time, and a
//! lease longer than the node's session queues the place again on its own:
//! see `ZookeeperBackend::acquire`). A place whose node is gone (its
//! session expired, a force unlock) tells its waiters the lock was
//! released: their next attempt queues again.
//!
//! Owns the wait task of each queued node; creates and deletes no node.

use std::sync::{Arc, Weak};

use super::{path, Inner};
use crate::backend::place_tasks::{read_until_answered, Backoff};

/// The places being waited for, by (lock, holder id).
pub(super) use crate::backend::place_tasks::PlaceTasks as Waits;

/// Starts watching for the turn of `holder`'s node in `lock`, unless that
/// is watched already. `before`: the node it waits for, as the listing
/// that just placed it found (watched at once, with no listing of its own:
/// as Curator does, one request fewer per contended acquisition).
pub(super) fn start(inner: &Arc<Inner>, lock: &str, holder: &str, before: &str) {
    inner.waits.start(&inner.handle, lock, holder, || {
        let (lock, holder) = (lock.to_owned(), holder.to_owned());
        wait_turn(Arc::downgrade(inner), lock, holder, Some(before.to_owned()))
    });
}

/// What a listing found of our node.
enum Found {
    /// Gone (or made by a session that has since expired).
    Gone,
    /// It holds: the lock is the place's.
    First,
    /// Ours waits for this node.
    Behind(String),
}

/// Waits for the turn of `holder`'s node in `lock`; tells the waiters when
/// it comes, or when the node is gone.
///
/// `known`: the node it waits for, found by the listing that placed it:
/// the first look is then that listing's (the node may be gone by now:
/// its watch then finds no node, and the place lists again).
async fn wait_turn(inner: Weak<Inner>, lock: String, holder: String, known: Option<String>) {
    let mut backoff = Backoff::new();
    let (lock_name, holder_id) = (lock.as_str(), holder.as_str());
    let mut known = known;
    loop {
        let found = match known.take() {
            Some(before) => inner.upgrade().map(|backend| (backend, Found::Behind(before))),
            None => {
                let look = read_until_answered(&inner, &mut backoff, |backend| async move {
                    read(&backend, lock_name, holder_id).await
                });
                look.await
            }
        };
        let Some((backend, found)) = found else {
            return;
        };
        let before = match found {
            Found::Gone => {
                backend.waits.ended(&lock, &holder);
                backend.forget(&lock, &holder);
                if let Some(wakeups) = backend.wakeups.upgrade() {
                    wakeups.released(&lock);
                }
                return;
            }
            Found::First => {
                backend.waits.ended(&lock, &holder);
                if let Some(wakeups) = backend.wakeups.upgrade() {
                    wakeups.released(&lock);
                }
                return;
            }
            Found::Behind(before) => before,
        };
        let Some(place) = backend.place(&lock, &holder) else {
            return;
        };
        let client = place.session.client();
        let watching = client.get_and_watch_data(&path::child(&lock, &before));
        match backend.within(watching).await {
            Ok((_, _, watcher)) => {
                backoff.reset();
                drop(backend);
                // Deleted, changed, or the session broke: list again.
                let _event = watcher.changed().await;
            }
            // Gone between the listing and the watch: list again.
            Err(zookeeper_client::Error::NoNode) => {}
            Err(_) => {
                drop(backend);
                backoff.pause().await;
            }
        }
    }
}

/// Lists the lock's children and finds our node's place among them.
async fn read(backend: &Inner, lock: &str, holder: &str) -> Result<Found, ()> {
    let Some(place) = backend.place(lock, holder) else {
        return Ok(Found::Gone);
    };
    if place.session.id() != place.owner {
        // The session that made it expired: the node went with it.
        return Ok(Found::Gone);
    }
    let client = place.session.client();
    let mut children = backend.list(&client, lock).await.map_err(drop)?;
    if backend
        .drop_twins(&client, lock, holder, &place.name, &children)
        .await
        .map_err(drop)?
    {
        children = backend.list(&client, lock).await.map_err(drop)?;
    }
    let sorted = path::sorted(children);
    Ok(match path::turn(&sorted, &place.name) {
        path::Turn::Gone => Found::Gone,
        path::Turn::Holds => Found::First,
        path::Turn::Behind(before) => Found::Behind(before.to_owned()),
    })
}
