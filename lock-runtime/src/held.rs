//! Locks this runtime holds, and in-process reentrancy.
//!
//! Every lock held through this runtime has one [`HeldLock`], shared by the
//! guard(s) holding it and by the watchdog. The table maps a lock to the
//! `HeldLock`s of its owner scopes, so a nested acquire by the same scope
//! re-enters with a local count and no round trip to the backend: the outer
//! hold's lease is renewed by the watchdog for as long as any hold is alive,
//! and the backend sees one hold per scope. A lost lock is never re-entered:
//! the next acquire by its scope goes to the backend again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

/// One lock held by one owner scope of this process.
#[derive(Debug)]
pub(crate) struct HeldLock {
    /// Process-unique id (watchdog bookkeeping).
    pub(crate) id: u64,
    /// The key as the caller wrote it.
    pub(crate) key: String,
    /// Backend name of the lock (prefix and hash tag applied).
    pub(crate) hash: String,
    /// Holder id recorded in the backend.
    pub(crate) holder: String,
    /// Owner scope that holds it.
    pub(crate) owner: u64,
    /// Fencing token of this hold.
    pub(crate) fence: u64,
    /// Lease (the backend TTL) in force.
    pub(crate) lease: Duration,
    /// Whether the watchdog renews it.
    pub(crate) renew: bool,
    /// Whether it was taken in fair mode (its release hands it on).
    pub(crate) fair: bool,
    holds: AtomicUsize,
    lost: AtomicBool,
    lost_changed: Notify,
}

/// What a new [`HeldLock`] is made of (the fields of the same names).
pub(crate) struct Hold {
    pub(crate) key: String,
    pub(crate) hash: String,
    pub(crate) holder: String,
    pub(crate) owner: u64,
    pub(crate) fence: u64,
    pub(crate) lease: Duration,
    pub(crate) renew: bool,
    pub(crate) fair: bool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl HeldLock {
    pub(crate) fn new(hold: Hold) -> Arc<Self> {
        Arc::new(HeldLock {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            key: hold.key,
            hash: hold.hash,
            holder: hold.holder,
            owner: hold.owner,
            fence: hold.fence,
            lease: hold.lease,
            renew: hold.renew,
            fair: hold.fair,
            holds: AtomicUsize::new(1),
            lost: AtomicBool::new(false),
            lost_changed: Notify::new(),
        })
    }

    /// Whether the lock was found lost.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Marks the lock lost and wakes everyone watching for that.
    pub(crate) fn mark_lost(&self) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::warn!(key = %self.key, "lock lost while held");
        }
        self.lost_changed.notify_waiters();
    }

    /// Resolves when the lock is lost (never, if it stays held).
    pub(crate) async fn lost(&self) {
        loop {
            let changed = self.lost_changed.notified();
            if self.is_lost() {
                return;
            }
            changed.await;
        }
    }
}

/// The held locks of one runtime, by backend lock name.
#[derive(Debug, Default)]
pub(crate) struct HeldTable {
    locks: Mutex<HashMap<String, Vec<Arc<HeldLock>>>>,
}

impl HeldTable {
    /// Re-enters `hash` when `owner` holds it already (and has not lost it).
    pub(crate) fn reenter(&self, hash: &str, owner: u64) -> Option<Arc<HeldLock>> {
        let locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        let held = locks
            .get(hash)?
            .iter()
            .find(|h| h.owner == owner && !h.is_lost())?;
        held.holds.fetch_add(1, Ordering::Relaxed);
        Some(held.clone())
    }

    /// Records a fresh backend hold; lost holds of the same scope are dropped
    /// from the table (their guards still release them by holder id).
    pub(crate) fn insert(&self, held: Arc<HeldLock>) {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        let list = locks.entry(held.hash.clone()).or_default();
        list.retain(|h| !(h.owner == held.owner && h.is_lost()));
        list.push(held);
    }

    /// Gives back one hold; `true` when it was the last one, and the backend
    /// hold must now be released.
    pub(crate) fn release(&self, held: &Arc<HeldLock>) -> bool {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        if held.holds.fetch_sub(1, Ordering::Relaxed) > 1 {
            return false;
        }
        if let Some(list) = locks.get_mut(&held.hash) {
            list.retain(|h| !Arc::ptr_eq(h, held));
            if list.is_empty() {
                locks.remove(&held.hash);
            }
        }
        true
    }

    /// Number of distinct backend holds.
    pub(crate) fn len(&self) -> usize {
        self.locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(Vec::len)
            .sum()
    }
}
