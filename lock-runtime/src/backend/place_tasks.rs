//! What the queued places of etcd and ZooKeeper share, backends whose
//! places watch the entry before them (etcd's keys, ZooKeeper's nodes):
//! their wait tasks, one per (lock, holder id), started once, stopped when
//! the place holds the lock or is given back, and all stopped with the
//! backend (`PlaceTasks`); a wait task's read, retried at a doubling pace
//! until answered (`read_until_answered`, `Backoff`); and the waiters'
//! side (`PlaceWatches`), which has nothing to watch, since each place
//! watches for itself, and gives unused places back.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::task::AbortHandle;

use crate::backend::{Watched, Watches};

/// The running wait tasks, by (lock, holder id).
#[derive(Debug, Default)]
pub(crate) struct PlaceTasks {
    tasks: Mutex<HashMap<(String, String), AbortHandle>>,
}

impl PlaceTasks {
    fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), AbortHandle>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Spawns `task()` on `handle` as the wait of `holder` in `lock`,
    /// unless one runs already.
    pub(crate) fn start<F>(
        &self,
        handle: &tokio::runtime::Handle,
        lock: &str,
        holder: &str,
        task: impl FnOnce() -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut tasks = self.tasks();
        let id = (lock.to_owned(), holder.to_owned());
        if tasks.get(&id).is_some_and(|t| !t.is_finished()) {
            return;
        }
        tasks.insert(id, handle.spawn(task()).abort_handle());
    }

    /// Stops the wait of `holder` in `lock` (it holds the lock, or its
    /// entry is being deleted).
    pub(crate) fn stop(&self, lock: &str, holder: &str) {
        if let Some(task) = self.tasks().remove(&(lock.to_owned(), holder.to_owned())) {
            task.abort();
        }
    }

    /// Stops every wait (the backend is going away).
    pub(crate) fn stop_all(&self) {
        for (_, task) in self.tasks().drain() {
            task.abort();
        }
    }

    /// The wait of `holder` in `lock` ends by itself.
    pub(crate) fn ended(&self, lock: &str, holder: &str) {
        self.tasks().remove(&(lock.to_owned(), holder.to_owned()));
    }
}

/// The pause of a wait task after a failed read or watch: from 20 ms,
/// doubled after each failure up to 1 s, back to 20 ms once a watch is set.
#[derive(Debug)]
pub(crate) struct Backoff(Duration);

impl Backoff {
    const MIN: Duration = Duration::from_millis(20);
    const MAX: Duration = Duration::from_secs(1);

    /// The pace of a task that has not failed yet.
    pub(crate) fn new() -> Self {
        Self(Self::MIN)
    }

    /// A watch was set: the next failure pauses briefly again.
    pub(crate) fn reset(&mut self) {
        self.0 = Self::MIN;
    }

    /// Sleeps after a failure, and doubles the next pause.
    pub(crate) async fn pause(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Self::MAX);
    }
}

/// The backend behind `inner` and what `read` found on it; a failed read
/// is tried again after a pause, during which the task keeps no hold of the
/// backend (so a backend shut down meanwhile is let go). `None` once the
/// backend is gone: the task ends.
pub(crate) async fn read_until_answered<B, T, Fut>(
    inner: &Weak<B>,
    backoff: &mut Backoff,
    mut read: impl FnMut(Arc<B>) -> Fut,
) -> Option<(Arc<B>, T)>
where
    Fut: Future<Output = Result<T, ()>>,
{
    loop {
        let backend = inner.upgrade()?;
        match read(Arc::clone(&backend)).await {
            Ok(found) => return Some((backend, found)),
            Err(()) => {
                drop(backend);
                backoff.pause().await;
            }
        }
    }
}

/// A backend whose queued places wait for their turn themselves (etcd,
/// ZooKeeper): how it gives back a place nobody uses.
pub(crate) trait GivesBackPlaces: Send + Sync + 'static {
    /// Deletes `holder`'s place in `lock` in the background.
    fn give_back(self: Arc<Self>, lock: String, holder: String);
}

/// The waiters' side of a [`GivesBackPlaces`] backend, which it holds
/// weakly: each place's wait task started with the attempt that queued it,
/// so a lock's watch is ready at once and there is nothing to stop; a place
/// nobody uses is given back.
pub(crate) struct PlaceWatches<I>(Weak<I>);

impl<I: GivesBackPlaces> PlaceWatches<I> {
    /// The waiters' side of the backend `inner`.
    pub(crate) fn of(inner: &Arc<I>) -> Arc<dyn Watches> {
        Arc::new(Self(Arc::downgrade(inner)))
    }
}

impl<I> std::fmt::Debug for PlaceWatches<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlaceWatches")
    }
}

impl<I: GivesBackPlaces> Watches for PlaceWatches<I> {
    fn watch(&self, _lock: &str, watched: Arc<dyn Watched>) {
        watched.set_ready();
    }

    fn unwatch(&self, _lock: &str) {}

    fn give_back_place(&self, lock: String, holder: String) {
        if let Some(inner) = self.0.upgrade() {
            inner.give_back(lock, holder);
        }
    }
}
