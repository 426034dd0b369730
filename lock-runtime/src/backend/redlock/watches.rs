//! Waiters' watches over every master: a lock's release channel is watched
//! on each of them, and the watch counts as ready once a majority of the
//! masters have answered the subscription.
//!
//! Why a majority: a holder holds (and so frees, and announces the release
//! on) a majority of the masters, and any two majorities share a master, so
//! a waiter subscribed on a majority hears every release of a valid hold.
//! Waiting for every master instead would hold each new waiter up for the
//! response timeout whenever one master is frozen.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use super::Connected;
use crate::backend::{Watched, Watches};

/// The [`Watches`] of a Redlock backend: one per master, where connected.
#[derive(Debug)]
pub(super) struct RedlockWatches {
    pub(super) masters: Vec<Arc<OnceLock<Connected>>>,
    pub(super) quorum: usize,
}

impl Watches for RedlockWatches {
    fn watch(&self, lock: &str, watched: Arc<dyn Watched>) {
        let shared = Arc::new(Majority {
            inner: watched,
            answered: AtomicUsize::new(0),
            quorum: self.quorum,
        });
        for master in &self.masters {
            let one = Arc::new(OneMaster {
                shared: shared.clone(),
                answered: AtomicBool::new(false),
            });
            match master.get() {
                Some(connected) => connected.watches.watch(lock, one),
                // Not connected: no subscription is coming from it.
                None => one.set_ready(),
            }
        }
    }

    fn unwatch(&self, lock: &str) {
        for connected in self.masters.iter().filter_map(|m| m.get()) {
            connected.watches.unwatch(lock);
        }
    }

    fn give_back_place(&self, lock: String, holder: String) {
        // Fair mode is refused on Redlock, so no place is ever taken; a
        // stray one is released like a hold, everywhere.
        for connected in self.masters.iter().filter_map(|m| m.get()) {
            connected
                .watches
                .give_back_place(lock.clone(), holder.clone());
        }
    }
}

/// One lock's waiters, as every master's subscription sees them.
#[derive(Debug)]
struct Majority {
    inner: Arc<dyn Watched>,
    answered: AtomicUsize,
    quorum: usize,
}

/// One lock's waiters, as one master's subscription sees them: its first
/// answer counts once towards the majority.
#[derive(Debug)]
struct OneMaster {
    shared: Arc<Majority>,
    answered: AtomicBool,
}

impl Watched for OneMaster {
    fn is_closed(&self) -> bool {
        self.shared.inner.is_closed()
    }

    fn set_ready(&self) {
        if self.answered.swap(true, Ordering::AcqRel) {
            return;
        }
        let answered = self.shared.answered.fetch_add(1, Ordering::AcqRel) + 1;
        if answered == self.shared.quorum {
            self.shared.inner.set_ready();
        }
    }

    fn wake_first(&self) {
        self.shared.inner.wake_first();
    }
}
