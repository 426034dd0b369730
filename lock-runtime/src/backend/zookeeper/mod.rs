//! The ZooKeeper backend: Apache Curator's lock recipes
//! (`InterProcessMutex` for exclusive holds, `InterProcessReadWriteLock`
//! for read and write holds), so that this runtime and Java services using
//! Curator exclude each other on the same lock path.
//!
//! A lock is a path (`path.rs`); every contender creates an ephemeral
//! sequential node under it, and the node with the lowest sequence holds
//! the lock. So the queue is fair by construction (first created, first
//! served), a holder that dies frees the lock when its session expires
//! (`sessions.rs`), and the fencing token is the node's czxid: the zxid of
//! the transaction that created it, which grows across the whole ensemble
//! and across leader changes. (Not the sequence suffix: that is the
//! parent's child version, a signed 32-bit counter that wraps, and starts
//! again when the container parent is reaped.)
//!
//! - acquire: create our node (if this holder has none yet), named for the
//!   hold's mode (`path.rs`), and list the children, pipelined in one round
//!   trip. A write or exclusive node first of all, or a read node with no
//!   write or exclusive node before it: held. Otherwise the node waits in
//!   the queue and `wait.rs` watches the node it waits for. A try-once
//!   acquire deletes its node again when it does not hold.
//! - downgrade: one transaction on the hold's session creates the read
//!   node `…-__READ__<our sequence>` (ephemeral, not sequential: as Curator
//!   ≥ 5.5.0 does, CURATOR-621) and deletes the write node, so the hold
//!   keeps its place ahead of every writer queued meanwhile, and no moment
//!   exists where neither node stands. The hold keeps its token (the write
//!   node's czxid); renewals check the read node from then on. A release
//!   of the holder waits for its downgrade in flight.
//! - release: delete our node, whatever its name (the next node's watcher
//!   sees it).
//! - renew: one multi-read on the node's session confirming every held
//!   node still exists, with its czxid, owned by that session.
//!
//! No token block can be reserved, so holds are not passed between tasks
//! of a process (lock cohorting is off on ZooKeeper).
//!
//! The files, one concern each: `connect.rs` (sessions started, the
//! backend built), `sessions.rs` (one session per lease length),
//! `path.rs` (lock paths, node names by mode, whose turn), `nodes.rs`
//! (a holder's nodes listed, created, found again), `acquire.rs` (an
//! attempt's steps), `wait.rs` (a queued node's watch), `release.rs` (a
//! holder's nodes deleted), `downgrade.rs`, `releaser.rs` (background
//! releases, retried), `renew.rs`, `places.rs` (fair places: refresh,
//! give-back), `inspect.rs` (inspect, force-unlock), `identity.rs` (the
//! runtime's identity for operators). This file holds what they share:
//! the configuration, a place, the backend's state.

mod acquire;
mod connect;
mod downgrade;
mod identity;
mod inspect;
mod nodes;
mod path;
mod places;
mod release;
mod releaser;
mod renew;
mod sessions;
#[cfg(test)]
mod tests;
mod wait;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::releases::{PendingReleases, ReleaseQueue, RetriedOutage};
use super::Wakeups;
use crate::error::BackendError;
pub(crate) use connect::connect;
pub(crate) use path::lock_path;
use sessions::{Session, Sessions};

/// Most reads in one multi-read.
const MULTI_OPS: usize = 128;

/// How often a background release is tried before this process's acquires
/// of its lock stop waiting for it (it goes on trying, less often, while
/// the session lives, and shutdown waits for it).
const RELEASE_ATTEMPTS: u32 = 5;

/// Where the ZooKeeper servers are, and who we are to them.
#[derive(Clone, Debug)]
pub(crate) struct ZookeeperConfig {
    /// `host:port,host:port[/chroot]`.
    pub(crate) connect: String,
    /// User name and password for ZooKeeper's `digest` scheme, if any.
    pub(crate) auth: Option<(String, String)>,
    /// The runtime's key prefix (see `path::lock_path`).
    pub(crate) prefix: String,
    /// The runtime's default lease: its session opens at start.
    pub(crate) default_lease: Duration,
}

/// One contender node of this process.
#[derive(Clone)]
pub(super) struct Place {
    /// Its name under the lock path.
    name: String,
    /// The zxid that created it.
    czxid: i64,
    /// The hold's fencing token: `czxid`, except after a downgrade, where
    /// the hold keeps its write node's.
    fence: i64,
    /// The session that created it.
    owner: i64,
    /// That session.
    session: Arc<Session>,
}

/// The ZooKeeper backend of one runtime.
#[derive(Clone, Debug)]
pub(crate) struct ZookeeperBackend {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    sessions: Arc<Sessions>,
    /// The default lease's session, for reads that belong to no hold.
    reader: Arc<Session>,
    /// This process's nodes, by (lock, holder id).
    places: Mutex<HashMap<(String, String), Place>>,
    /// Holders of which a create lost its answer, by (lock, holder id):
    /// that create may yet be applied (besides the node the holder knows,
    /// if any). The session the creates went out on. See
    /// [`Inner::delete`].
    unsettled: Mutex<HashMap<(String, String), Arc<Session>>>,
    waits: wait::Waits,
    /// Downgrades in flight, by (lock, holder id): a release of the holder
    /// waits for its downgrade first (see [`Inner::after_downgrade`]).
    downgrades: Mutex<HashMap<(String, String), watch::Receiver<bool>>>,
    /// The fixed-lease end in force on a holder's node, by (lock, holder
    /// id): the number of the timer that deletes it (see
    /// [`Inner::end_fixed_lease`]). Each answer that holds replaces it.
    fixed_ends: Mutex<HashMap<(String, String), u64>>,
    releases: ReleaseQueue,
    /// Background releases failing (warned once per outage).
    release_outage: RetriedOutage,
    wakeups: Weak<dyn Wakeups>,
    timeout: Duration,
    /// The runtime's tokio runtime (tasks are spawned there, whoever polls).
    handle: tokio::runtime::Handle,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperBackend")
            .field("servers", &self.sessions.shown())
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.waits.stop_all();
    }
}

impl Inner {
    fn places(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Place>> {
        self.places.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn place(&self, lock: &str, holder: &str) -> Option<Place> {
        self.places()
            .get(&(lock.to_owned(), holder.to_owned()))
            .cloned()
    }

    fn unsettled(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<Session>>> {
        self.unsettled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, lock: &str, holder: &str, place: Place) {
        self.places()
            .insert((lock.to_owned(), holder.to_owned()), place);
    }

    pub(super) fn forget(&self, lock: &str, holder: &str) {
        tracing::debug!(lock, holder, "ZooKeeper place forgotten");
        let key = (lock.to_owned(), holder.to_owned());
        self.unsettled().remove(&key);
        self.places().remove(&key);
        self.forget_fixed_end(&key);
    }

    /// `fut`, bounded by the response timeout (then [`Timeout`]).
    ///
    /// [`Timeout`]: zookeeper_client::Error::Timeout
    pub(super) async fn within<T>(
        &self,
        fut: impl Future<Output = Result<T, zookeeper_client::Error>>,
    ) -> Result<T, zookeeper_client::Error> {
        tokio::time::timeout(self.timeout, fut)
            .await
            .unwrap_or(Err(zookeeper_client::Error::Timeout))
    }

    /// `error` as a [`BackendError`]: `NoAuth` (an ACL on the path that
    /// does not let our session do what it asked) is a refusal for good.
    fn failed(&self, what: &str, error: zookeeper_client::Error) -> BackendError {
        let denied = matches!(error, zookeeper_client::Error::NoAuth);
        BackendError::new(
            format!("{what} on ZooKeeper at {}", self.sessions.shown()),
            error,
        )
        .denied_if(denied)
    }
}

impl ZookeeperBackend {
    /// For logs: `zookeeper at host:port,...`.
    pub(crate) fn describe(&self) -> String {
        format!("zookeeper at {}", self.inner.sessions.shown())
    }

    /// One read (`exists /`).
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let client = self.inner.reader.client();
        self.inner
            .within(client.check_stat("/"))
            .await
            .map(drop)
            .map_err(|e| self.inner.failed("ping failed", e))
    }

    /// The background releases not yet answered.
    pub(crate) fn pending(&self) -> &Arc<PendingReleases> {
        self.inner.releases.pending()
    }
}
