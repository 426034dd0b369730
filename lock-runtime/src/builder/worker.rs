//! The runtime's thread: a small tokio runtime of its own, the backend and
//! the watchdog started there, the parts handed back to `build`; when the
//! last handle is gone, the releases still queued sent, then the end.
//!
//! Checks no setting (`check.rs`): it starts what it is given.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::releases::PendingReleases;
use crate::backend::{Backend, BackendConfig, Heartbeats, Wakeups};
use crate::error::{BackendError, LockError};
use crate::waiters::Waiters;
use crate::watchdog::{self, Watchdog};
use crate::who::Identity;

/// What the worker thread hands back once started.
pub(super) struct Parts {
    /// The worker's tokio runtime: context for callers that have none.
    pub(super) handle: tokio::runtime::Handle,
    pub(super) backend: Backend,
    pub(super) waiters: Arc<Waiters>,
    pub(super) watchdog: Arc<Watchdog>,
    pub(super) behind: Arc<PendingReleases>,
}

/// Body of the runtime's thread: start everything, then idle until stopped.
pub(super) fn worker(
    config: BackendConfig,
    drain: Duration,
    identity: Option<Identity>,
    ready: oneshot::Sender<Result<Parts, LockError>>,
    stop: oneshot::Receiver<()>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(
                BackendError::new("cannot start the lock runtime", e).into()
            ));
            return;
        }
    };
    rt.block_on(async move {
        let waiters = Waiters::new();
        let wakeups: Weak<dyn Wakeups> = Arc::downgrade(&waiters) as Weak<dyn Wakeups>;
        let (backend, watches) = match Backend::start(config, wakeups).await {
            Ok(started) => started,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        waiters.attach(watches);
        let watchdog = Arc::new(Watchdog::default());
        let backend_for_drain = backend.clone();
        let (wd_stop_tx, wd_stop_rx) = oneshot::channel();
        let heartbeats: Weak<dyn Heartbeats> = Arc::downgrade(&waiters) as Weak<dyn Heartbeats>;
        tokio::spawn(watchdog::run(
            watchdog.clone(),
            backend.clone(),
            heartbeats,
            identity,
            wd_stop_rx,
        ));
        let behind = Arc::new(PendingReleases::default());
        let parts = Parts {
            handle: tokio::runtime::Handle::current(),
            backend,
            waiters,
            watchdog,
            behind: behind.clone(),
        };
        if ready.send(Ok(parts)).is_err() {
            return;
        }
        let _ = stop.await;
        let _ = wd_stop_tx.send(());
        // The last handle is gone, so no guard is left, but releases of
        // dropped guards and locked calls may still be out: send them
        // before stopping.
        let _ = tokio::time::timeout(drain, async {
            behind.all_settled().await;
            backend_for_drain.all_releases_settled().await;
        })
        .await;
    });
}
