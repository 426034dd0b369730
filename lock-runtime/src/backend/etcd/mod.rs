//! The etcd backend: etcd's own lock recipe (the `concurrency` package's
//! mutex), reached over gRPC, under the same four operations as Redis.
//!
//! A lock `name` is a directory: every contender puts a key `name/<holder
//! id>` attached to this runtime's etcd lease, and the key with the lowest
//! create revision holds the lock. So the queue is fair by construction
//! (first created, first served), a holder that dies frees the lock when
//! its lease runs out, and the fencing token is the key's create revision:
//! etcd's global revision, which only grows (until a cluster is wiped or
//! restored from an old backup: then it starts again, and this backend
//! says so in a warning). `etcdctl lock name` uses the same layout (its key
//! is `name/<lease id>`), so the two exclude each other.
//!
//! - acquire: one transaction: if our key does not exist, put it (on the
//!   lease) and read the first key of the directory, else read both. Ours
//!   first: held. Otherwise our key waits in the queue and `wait.rs`
//!   watches the key before it.
//! - release: delete our key (the next key's watcher sees it).
//! - renew: a keep-alive of the lease (`lease.rs`) and one transaction of
//!   reads confirming every held key still stands with its revision, in
//!   the hold's mode (`modes.rs`).
//!
//! Read holds (`readers.rs`): a reader's key is `name/read/<holder id>`,
//! which a writer waits for like any older key; a reader holds when no
//! writer key is older than its own, and waits for the last such one.
//! A downgrade gives the holder's write key the value `r` (a reader now,
//! still before the writers queued after it, with its token): the only
//! change of a key's mode. A holder id serves one mode (`modes.rs`): an
//! attempt never turns a place of the other mode. A release deletes both
//! names of the holder: it needs no mode.
//!
//! Every lock is fair here (see `Backend::always_fair`); a try-once
//! acquire puts its key only if the directory is empty (one transaction;
//! a read: if no writer key is there, or only readers are). No token
//! block can be reserved, so holds are not passed between tasks of a
//! process (lock cohorting is off on etcd).
//!
//! The files, one concern each: `connect.rs` (the client, its options and
//! TLS), `txn.rs` (the one call: a transaction, its answer checked, its
//! failure classified), `lease.rs` (etcd leases), `acquire.rs` (an
//! attempt's steps), `wait.rs` (a queued place's turn), `readers.rs`
//! (read keys), `modes.rs` (a holder id's keys keep their mode),
//! `release.rs` (a holder's keys deleted), `tomb.rs` (late puts made
//! harmless), `downgrade.rs`, `releaser.rs` (background releases and
//! downgrades, retried), `renew.rs`, `places.rs` (fair places: refresh,
//! give-back), `inspect.rs` (inspect, force-unlock), `identity.rs` (the
//! runtime's identity for operators). This file holds what
//! they share: the configuration, a lock's names, the backend's state.

mod acquire;
mod connect;
mod downgrade;
mod identity;
mod inspect;
mod lease;
mod modes;
mod places;
mod readers;
mod release;
mod releaser;
mod renew;
#[cfg(test)]
mod tests;
mod tomb;
mod txn;
mod wait;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{Client, GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::releases::{Job, PendingReleases, ReleaseQueue, RetriedOutage};
use super::Wakeups;
use crate::error::BackendError;
pub(crate) use connect::connect;
use lease::Leases;

/// Most operations in one transaction (etcd's default `--max-txn-ops` is
/// 128).
const TXN_OPS: usize = 128;

/// Where the etcd servers are, and who we are to them.
#[derive(Clone, Debug)]
pub(crate) struct EtcdConfig {
    /// `host:port` or `http(s)://host:port`, one per member.
    pub(crate) endpoints: Vec<String>,
    /// User name and password (etcd's own auth), if any.
    pub(crate) user: Option<(String, String)>,
    /// The runtime's key prefix: every key it reads or writes starts with
    /// it (etcd's role-based access may grant a user that range only).
    pub(crate) prefix: String,
    /// The runtime's default lease: its etcd lease is granted at connect,
    /// so that first acquires go out in the order they were made.
    pub(crate) default_lease: Duration,
}

/// The etcd name of the lock `key` under `prefix`: the two joined, with
/// every `/` of the key written `%2F` (and `%` written `%25`). A lock's
/// keys are `name/<holder>`: unescaped, the lock `a`'s directory `a/`
/// would hold the lock `a/b`'s keys too, and `a`'s waiters would queue
/// behind `a/b`'s holders. A key without `/` or `%` is its name as it is,
/// as `etcdctl lock` writes it.
pub(crate) fn lock_name(prefix: &str, key: &str) -> String {
    let mut name = String::with_capacity(prefix.len() + key.len());
    name.push_str(prefix);
    for c in key.chars() {
        match c {
            '/' => name.push_str("%2F"),
            '%' => name.push_str("%25"),
            c => name.push(c),
        }
    }
    name
}

/// The lock `name`'s directory: `name/`.
fn dir(lock: &str) -> String {
    format!("{lock}/")
}

/// The key of `holder` in the lock `name`: `name/<holder>`.
fn node(lock: &str, holder: &str) -> String {
    format!("{lock}/{holder}")
}

/// The read of a directory's first key (the holder).
fn first_of(lock: &str) -> TxnOp {
    let first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    TxnOp::get(dir(lock), Some(first))
}

/// The etcd backend of one runtime.
#[derive(Clone, Debug)]
pub(crate) struct EtcdBackend {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    client: Client,
    /// The endpoints, for messages.
    endpoints: String,
    leases: Arc<Leases>,
    waits: wait::Waits,
    releases: ReleaseQueue<Job>,
    wakeups: Weak<dyn Wakeups>,
    timeout: Duration,
    /// The runtime's tokio runtime (tasks are spawned there, whoever polls).
    handle: tokio::runtime::Handle,
    /// The last request was answered (a failure after an answer tells the
    /// waiters that news may have been lost).
    healthy: AtomicBool,
    /// The highest revision an answer carried: a lower one means the
    /// cluster was wiped or restored.
    revision: AtomicI64,
    /// The key a ping reads: `<prefix>%ping`, inside the runtime's range and
    /// no lock's name (`lock_name` never writes `%p`).
    ping_key: String,
    /// Keys whose put went out unanswered (see `tomb.rs`).
    unanswered: tomb::Unanswered,
    /// Holders whose background downgrade is queued and not superseded
    /// by a release of theirs, as (lock, holder).
    downgrading: Mutex<HashSet<(String, String)>>,
    /// Background releases failing (warned once per outage).
    release_outage: RetriedOutage,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.waits.stop_all();
    }
}

impl EtcdBackend {
    /// For logs: `etcd at host:port,...`.
    pub(crate) fn describe(&self) -> String {
        format!("etcd at {}", self.inner.endpoints)
    }

    /// One read of a key.
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let txn = Txn::new().and_then([TxnOp::get(self.inner.ping_key.as_str(), None)]);
        self.inner.txn(txn).await.map(drop)
    }

    /// The background releases not yet answered.
    pub(crate) fn pending(&self) -> &Arc<PendingReleases> {
        self.inner.releases.pending()
    }
}
