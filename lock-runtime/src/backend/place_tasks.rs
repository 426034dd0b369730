//! The wait tasks of queued places, for backends whose places watch the
//! entry before them (etcd's keys, ZooKeeper's nodes): one task per (lock,
//! holder id), started once, stopped when the place holds the lock or is
//! given back, and all stopped with the backend.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, PoisonError};

use tokio::task::AbortHandle;

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
