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

mod path;
mod sessions;
mod wait;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use zookeeper_client::{Acls, Client, CreateMode, MultiReadResult};

use super::releases::{PendingReleases, ReleaseJob, ReleaseQueue};
use super::{
    Acquire, ConnectSettings, PlaceRefresh, Queue, Recorded, RecordedReader, Refreshed, Release,
    Wakeups, Watched, Watches,
};
use crate::error::{BackendError, LockError};
use crate::held::HeldLock;
use crate::mode::LockMode;
pub(crate) use path::lock_path;
use sessions::{Session, Sessions};

/// Most reads in one multi-read.
const MULTI_OPS: usize = 128;

/// How often a background release is tried before this process's acquires
/// of its lock stop waiting for it (it goes on trying, less often, while
/// the session lives, and shutdown waits for it).
const RELEASE_ATTEMPTS: u32 = 5;

/// How often a background release is tried in all.
const RELEASE_ATTEMPTS_MAX: u32 = 600;

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
    releases: ReleaseQueue,
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
        let key = (lock.to_owned(), holder.to_owned());
        self.unsettled().remove(&key);
        self.places().remove(&key);
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

    /// The children of `lock` (none when it does not exist).
    pub(super) async fn list(
        &self,
        client: &Client,
        lock: &str,
    ) -> Result<Vec<String>, BackendError> {
        match self.within(client.list_children(lock)).await {
            Ok(children) => Ok(children),
            Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
            Err(error) => Err(self.failed("listing a lock's contenders failed", error)),
        }
    }

    /// The children of `lock` as the leader has them: a `sync` first,
    /// pipelined with the listing (one round trip). A follower's plain
    /// read may not show a delete another session just made (ZooKeeper
    /// orders reads per session, not across them); that never lets two in,
    /// but an attempt right after a release would find the lock still busy.
    async fn list_latest(&self, client: &Client, lock: &str) -> Result<Vec<String>, BackendError> {
        let syncing = self.within(client.sync(lock));
        let listing = self.list(client, lock);
        let (synced, listed) = tokio::join!(syncing, listing);
        match synced {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => listed,
            Err(error) => Err(self.failed("sync before listing a lock's contenders failed", error)),
        }
    }

    /// Creates `holder`'s node in `lock` on `session` (and the lock path,
    /// as container nodes, when missing); the node and the children seen
    /// right after.
    ///
    /// A create that fails without an answer may still be applied later
    /// (a follower holds it for a leader that does not answer now; a leader
    /// killed after it logged the create applies it once it is back), also
    /// after the holder found no node and created another: the session it
    /// went out on is kept for `holder`'s release, which must find every
    /// such node (see [`Inner::delete`]).
    async fn create(
        &self,
        session: &Arc<Session>,
        lock: &str,
        holder: &str,
        mode: LockMode,
    ) -> Result<(Place, Vec<String>), BackendError> {
        let key = (lock.to_owned(), holder.to_owned());
        // Before the create goes out: a release that runs meanwhile (the
        // caller gone) lists on its session, after it.
        self.unsettled().insert(key.clone(), session.clone());
        let mut lost = false;
        let created = self.create_on(session, lock, holder, mode, &mut lost).await;
        if created.is_err() || lost {
            // (Again: a release that ran meanwhile may have settled it.)
            self.unsettled().insert(key, session.clone());
        } else {
            self.unsettled().remove(&key);
        }
        created
    }

    /// [`create`](Self::create)'s round trips; `lost` is set when a
    /// create's answer was lost.
    async fn create_on(
        &self,
        session: &Arc<Session>,
        lock: &str,
        holder: &str,
        mode: LockMode,
        lost: &mut bool,
    ) -> Result<(Place, Vec<String>), BackendError> {
        let client = session.client();
        let prefix = path::node_prefix(holder, mode);
        let full = path::child(lock, &prefix);
        let data = path::node_data(holder, session.timeout.as_millis());
        let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let mut last = None;
        for _attempt in 0..4 {
            // One round trip: the server answers a session's requests in
            // order, so the listing sees the node just created.
            let creating = self.within(client.create(&full, &data, &ephemeral));
            let listing = self.within(client.list_children(lock));
            let (created, listed) = tokio::join!(creating, listing);
            match created {
                Ok((stat, sequence)) => {
                    let place = Place {
                        name: format!("{prefix}{sequence}"),
                        czxid: stat.czxid,
                        fence: stat.czxid,
                        owner: client.session_id().0,
                        session: session.clone(),
                    };
                    self.remember(lock, holder, place.clone());
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => self.list(&client, lock).await?,
                    };
                    return Ok((place, children));
                }
                Err(zookeeper_client::Error::NoNode) => {
                    let parents = CreateMode::Container.with_acls(Acls::anyone_all());
                    if let Err(error) = self.within(client.mkdir(lock, &parents)).await {
                        let what = format!("creating the lock path {lock} failed");
                        return Err(self.failed(&what, error));
                    }
                }
                Err(
                    error @ (zookeeper_client::Error::ConnectionLoss
                    | zookeeper_client::Error::Timeout),
                ) => {
                    // Protected mode: the create may have gone through
                    // without its answer; our uuid finds it.
                    *lost = true;
                    if let Some(found) = self.find(session, lock, holder).await? {
                        return Ok(found);
                    }
                    last = Some(error);
                }
                Err(error) => {
                    let what = format!("creating a lock node under {lock} failed");
                    return Err(self.failed(&what, error));
                }
            }
        }
        Err(match last {
            Some(error) => self.failed(&format!("creating a lock node under {lock} failed"), error),
            None => BackendError::msg(format!(
                "creating a lock node under {lock} failed on ZooKeeper at {}: \
                 the lock path kept vanishing",
                self.sessions.shown()
            )),
        })
    }

    /// `holder`'s node in `lock` made by `session`, if there is one (after
    /// a create whose answer was lost).
    async fn find(
        &self,
        session: &Arc<Session>,
        lock: &str,
        holder: &str,
    ) -> Result<Option<(Place, Vec<String>)>, BackendError> {
        let client = session.client();
        let children = self.list(&client, lock).await?;
        let Some(name) = children.iter().find(|c| path::is_holders(c, holder)) else {
            return Ok(None);
        };
        let stat = match self.within(client.get_data(&path::child(lock, name))).await {
            Ok((_, stat)) => stat,
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(error) => return Err(self.failed("reading a lock node failed", error)),
        };
        if stat.ephemeral_owner != client.session_id().0 {
            return Ok(None);
        }
        let place = Place {
            name: name.clone(),
            czxid: stat.czxid,
            fence: stat.czxid,
            owner: stat.ephemeral_owner,
            session: session.clone(),
        };
        self.remember(lock, holder, place.clone());
        Ok(Some((place, children)))
    }

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
                if backend.delete(&lock, &holder).await.is_ok() {
                    return;
                }
                drop(backend);
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
        });
    }

    /// Deletes the nodes of `holder` among `children` of `lock` other than
    /// `keep` (the one it knows): twins from a create whose answer was lost
    /// and that was applied after the holder made another, which would
    /// otherwise stand before or behind it for as long as our session.
    /// Whether there were any.
    pub(super) async fn drop_twins(
        &self,
        client: &Client,
        lock: &str,
        holder: &str,
        keep: &str,
        children: &[String],
    ) -> Result<bool, BackendError> {
        let twins: Vec<&String> = children
            .iter()
            .filter(|c| c.as_str() != keep && path::is_holders(c, holder))
            .collect();
        for twin in &twins {
            match self
                .within(client.delete(&path::child(lock, twin), None))
                .await
            {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                Err(error) => {
                    return Err(self.failed("deleting a lost create's node failed", error))
                }
            }
        }
        Ok(!twins.is_empty())
    }

    /// Deletes `holder`'s node of `lock`: freed (it was there) or not held.
    ///
    /// A holder of which a create lost its answer may have nodes this
    /// process does not know (instead of, or besides, the one it knows):
    /// every node of it is found by its uuid, listed on the session those
    /// creates went out on. ZooKeeper answers one session's requests in
    /// order, so the listing comes after the creates however late they are
    /// applied; a listing on another session (the reader's) may come first,
    /// find nothing, and leave a node to appear later, unknown to anyone,
    /// standing for as long as our session lives: the lock blocked.
    ///
    /// A downgrade of the holder in flight is waited for first: it moves
    /// the hold to another node. One that began after this release read
    /// the holder's node (a read frame released on another thread while
    /// the write frame's downgrade starts) is caught after the delete: the
    /// place then names the read node, which is deleted in turn.
    async fn delete(&self, lock: &str, holder: &str) -> Result<Release, BackendError> {
        self.after_downgrade(lock, holder).await;
        let key = (lock.to_owned(), holder.to_owned());
        let mut freed = false;
        let mut deleted = Vec::new();
        for _round in 0..3 {
            let unsettled = self.unsettled().get(&key).cloned();
            let (client, names) = match (self.place(lock, holder), unsettled) {
                (Some(place), None) => (place.session.client(), vec![place.name]),
                (place, unsettled) => {
                    // Every node of the holder (a create whose answer was
                    // lost may have been applied besides the one known, if
                    // any).
                    let session = unsettled
                        .or_else(|| place.as_ref().map(|p| p.session.clone()))
                        .unwrap_or_else(|| self.reader.clone());
                    let client = session.client();
                    let children = self.list(&client, lock).await?;
                    let mut names: Vec<String> = children
                        .into_iter()
                        .filter(|c| path::is_holders(c, holder))
                        .collect();
                    if let Some(place) = place.filter(|p| !names.contains(&p.name)) {
                        names.push(place.name);
                    }
                    (client, names)
                }
            };
            for name in names {
                let node = path::child(lock, &name);
                // Versioned: nobody writes a lock node's data, so version 0
                // is the node we made (a node of the same path made later
                // would have another sequence anyway).
                let mut removed = self.within(client.delete(&node, Some(0))).await;
                if matches!(removed, Err(zookeeper_client::Error::BadVersion)) {
                    removed = self.within(client.delete(&node, None)).await;
                }
                match removed {
                    Ok(()) => freed = true,
                    Err(zookeeper_client::Error::NoNode) => {}
                    Err(error) => return Err(self.failed("release failed", error)),
                }
                deleted.push(name);
            }
            if self.forget_unless_moved(&key, &deleted) {
                break;
            }
        }
        Ok(if freed {
            Release::Freed
        } else {
            Release::NotHeld
        })
    }

    /// Forgets the place `key`, unless it names a node other than those
    /// `deleted` (a downgrade moved the hold meanwhile): then `false`.
    fn forget_unless_moved(&self, key: &(String, String), deleted: &[String]) -> bool {
        {
            let mut places = self.places();
            if places.get(key).is_some_and(|p| !deleted.contains(&p.name)) {
                return false;
            }
            places.remove(key);
        }
        self.unsettled().remove(key);
        true
    }

    fn downgrades(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), watch::Receiver<bool>>> {
        self.downgrades
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a release of `holder` must go alone (not in a batch of the
    /// releaser, which deletes the node it knows): a downgrade of it is in
    /// flight, or a create of it lost its answer.
    fn goes_alone(&self, lock: &str, holder: &str) -> bool {
        let downgrading = self.downgrades();
        let unsettled = self.unsettled();
        if downgrading.is_empty() && unsettled.is_empty() {
            return false;
        }
        let key = (lock.to_owned(), holder.to_owned());
        downgrading.contains_key(&key) || unsettled.contains_key(&key)
    }

    /// Waits for a downgrade of `holder`'s hold of `lock` in flight, if
    /// any: a release applied before it would leave the read node it
    /// creates standing for as long as our session.
    async fn after_downgrade(&self, lock: &str, holder: &str) {
        let waiting = {
            let downgrades = self.downgrades();
            if downgrades.is_empty() {
                return;
            }
            downgrades
                .get(&(lock.to_owned(), holder.to_owned()))
                .cloned()
        };
        if let Some(mut done) = waiting {
            // (An error: the downgrade's task is gone with the runtime.)
            let _ = done.wait_for(|done| *done).await;
        }
    }

    /// Starts the downgrade of `holder`'s hold of `lock` as a task of the
    /// runtime, registered until it ends so that a release of the holder
    /// waits for it; its outcome as [`ZookeeperBackend::downgrade`] says.
    fn start_downgrade(
        self: &Arc<Self>,
        lock: &str,
        holder: &str,
    ) -> tokio::task::JoinHandle<Result<bool, BackendError>> {
        let key = (lock.to_owned(), holder.to_owned());
        let (done, waiting) = watch::channel(false);
        self.downgrades().insert(key.clone(), waiting);
        let inner = self.clone();
        self.handle.spawn(async move {
            let outcome = inner.downgrade_now(&key.0, &key.1).await;
            inner.downgrades().remove(&key);
            done.send_replace(true);
            outcome
        })
    }

    /// The downgrade's round trips: one transaction, on the hold's
    /// session, that creates the read node and deletes the write node,
    /// pipelined with a read of both nodes that tells the outcome even when
    /// the transaction's answer is lost (one session's requests are
    /// applied in order). Tried again while neither answer comes.
    async fn downgrade_now(&self, lock: &str, holder: &str) -> Result<bool, BackendError> {
        let Some(place) = self.place(lock, holder) else {
            return Ok(false); // released meanwhile
        };
        let client = place.session.client();
        if place.owner != client.session_id().0 {
            return Ok(false); // its session expired: the node went with it
        }
        if path::reads(&place.name) {
            return Ok(true);
        }
        let Some(read_name) = path::read_name(&place.name) else {
            return Err(BackendError::msg(format!(
                "downgrade of {lock} on ZooKeeper: {} is no lock node",
                place.name
            )));
        };
        let write = path::child(lock, &place.name);
        let read = path::child(lock, &read_name);
        let data = path::downgraded_data(holder, place.fence, place.session.timeout.as_millis());
        let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
        let mut last = None;
        for _attempt in 0..3 {
            let mut writer = client.new_multi_writer();
            writer
                .add_create(&read, &data, &ephemeral)
                .and_then(|()| writer.add_delete(&write, None))
                .map_err(|e| self.failed("downgrade failed", e))?;
            // Sent in this order (each call sends its request at once).
            let committing = writer.commit();
            let reading = client.get_data(&read);
            let checking = client.check_stat(&write);
            let committing = self.within(async { committing.await.map_err(Into::into) });
            let (committed, read_node, write_node) =
                tokio::join!(committing, self.within(reading), self.within(checking));
            if let Err(error) = committed {
                last = Some(error);
            }
            let read_node = match read_node {
                Ok((_, stat)) => Some(stat),
                Err(zookeeper_client::Error::NoNode) => None,
                Err(error) => {
                    last = Some(error);
                    continue;
                }
            };
            let write_stands = match write_node {
                Ok(stat) => stat.is_some(),
                Err(error) => {
                    last = Some(error);
                    continue;
                }
            };
            return match read_node {
                Some(stat) if stat.ephemeral_owner == place.owner => {
                    if write_stands {
                        // (Not from the transaction, which is atomic; from a
                        // create that went out on its own, were there one.)
                        let _ = self.within(client.delete(&write, None)).await;
                    }
                    Ok(self
                        .moved(lock, holder, &place, read_name, stat.czxid)
                        .await)
                }
                // Not applied: again (a node of that name of another session
                // cannot be: the uuid is this holder's).
                None if write_stands => continue,
                // The write node is gone, and no read node came: the hold is
                // gone (its session expired, a force unlock).
                _ => Ok(false),
            };
        }
        // Unknown: the transaction may yet be applied. The holder's release
        // then lists its nodes by uuid on this session (after it), as after
        // a lost create; a renewal meanwhile finds the write node or not.
        self.unsettled()
            .insert((lock.to_owned(), holder.to_owned()), place.session.clone());
        Err(match last {
            Some(error) => self.failed("downgrade failed", error),
            None => BackendError::msg(format!(
                "downgrade of {lock} on ZooKeeper at {}: no answer",
                self.sessions.shown()
            )),
        })
    }

    /// Records that `holder`'s hold (`place`) moved to its read node
    /// `read_name`, made at `czxid`: renewals check that node from now on,
    /// and the hold keeps its token. If the holder was released while the
    /// downgrade was out (its place forgotten, the write node's name
    /// deleted), the read node is deleted here instead: `false`.
    async fn moved(
        &self,
        lock: &str,
        holder: &str,
        place: &Place,
        read_name: String,
        czxid: i64,
    ) -> bool {
        let key = (lock.to_owned(), holder.to_owned());
        {
            let mut places = self.places();
            if let Some(now) = places.get_mut(&key).filter(|p| p.fence == place.fence) {
                now.name = read_name;
                now.czxid = czxid;
                return true;
            }
        }
        let node = path::child(lock, &read_name);
        let client = place.session.client();
        match self.within(client.delete(&node, None)).await {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
            // The releaser finds it by its uuid.
            Err(_) => {
                self.releases.send(key.0, key.1, true);
            }
        }
        false
    }
}

/// Connects (learning the longest session timeout the servers grant, and
/// opening the default lease's session), and starts the background
/// releaser.
pub(crate) async fn connect(
    config: ZookeeperConfig,
    settings: &ConnectSettings,
    wakeups: Weak<dyn Wakeups>,
) -> Result<(ZookeeperBackend, Arc<dyn Watches>), LockError> {
    if let Some(why) = path::invalid(&lock_path(&config.prefix, "k")) {
        return Err(LockError::InvalidConfig(format!(
            "the key prefix {:?} makes no ZooKeeper path ({why}): use a path such as `/locks/`",
            config.prefix
        )));
    }
    let auth = config
        .auth
        .as_ref()
        .map(|(user, password)| format!("{user}:{password}").into_bytes());
    let sessions = Sessions::start(
        config.connect.clone(),
        auth,
        settings.connect_timeout,
        wakeups.clone(),
    )
    .await?;
    if let Some(refused) = refuse_lease(&sessions, config.default_lease) {
        return Err(refused);
    }
    let reader = sessions.for_lease(config.default_lease).await?;
    let (releases, jobs) = ReleaseQueue::new();
    let inner = Arc::new(Inner {
        sessions,
        reader,
        places: Mutex::default(),
        unsettled: Mutex::default(),
        waits: wait::Waits::default(),
        downgrades: Mutex::default(),
        releases,
        wakeups,
        timeout: settings.response_timeout,
        handle: tokio::runtime::Handle::current(),
    });
    let backend = ZookeeperBackend { inner };
    backend.ping().await?;
    tokio::spawn(releaser(
        Arc::downgrade(&backend.inner),
        jobs,
        backend.inner.releases.pending().clone(),
    ));
    let watches: Arc<dyn Watches> = Arc::new(ZookeeperWatches {
        backend: Arc::downgrade(&backend.inner),
    });
    Ok((backend, watches))
}

/// The refusal of a lease longer than any session the servers grant.
fn refuse_lease(sessions: &Sessions, lease: Duration) -> Option<LockError> {
    (lease > sessions.longest).then(|| {
        LockError::InvalidConfig(format!(
            "a lease of {lease:?} is longer than the longest ZooKeeper session timeout the \
             servers at {} grant ({:?}, their maxSessionTimeout): a holder's node could \
             vanish while it still counts on its lease; use a lease of at most {:?}, or \
             raise maxSessionTimeout",
            sessions.shown(),
            sessions.longest,
            sessions.longest
        ))
    })
}

impl ZookeeperBackend {
    /// For logs: `zookeeper at host:port,...`.
    pub(crate) fn describe(&self) -> String {
        format!("zookeeper at {}", self.inner.sessions.shown())
    }

    /// Why a lock of `key` (at `lock`) with `lease` cannot be taken here:
    /// a key that makes no ZooKeeper path, or a lease longer than any
    /// session the servers grant.
    pub(crate) fn refuses(&self, key: &str, lock: &str, lease: Duration) -> Option<LockError> {
        if let Err(refused) = path::check_key(key, lock) {
            return Some(refused);
        }
        refuse_lease(&self.inner.sessions, lease)
    }

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
        let named = path::node_prefix(holder, mode);
        for _attempt in 0..3 {
            let (place, children, created) = match inner.place(lock, holder) {
                Some(place)
                    if place.owner == place.session.id()
                        && place.session.timeout >= lease
                        && place.name.starts_with(&named) =>
                {
                    let children = inner.list_latest(&place.session.client(), lock).await?;
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
                    inner.waits.stop(lock, holder);
                    inner.delete(lock, holder).await?;
                    let (place, children) = inner.create(&session, lock, holder, mode).await?;
                    (place, children, true)
                }
                _ => {
                    // New, or made by a session that expired since.
                    inner.forget(lock, holder);
                    let (place, children) = inner.create(&session, lock, holder, mode).await?;
                    (place, children, true)
                }
            };
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

    /// Deletes `holder`'s node of `lock`. A delete whose answer was lost is
    /// sent again in the background (the node would otherwise stand as
    /// long as our session), and reported as a failure.
    pub(crate) async fn release(
        &self,
        lock: &str,
        holder: &str,
        _fair: bool,
    ) -> Result<Release, BackendError> {
        self.inner.waits.stop(lock, holder);
        match self.inner.delete(lock, holder).await {
            Ok(release) => Ok(release),
            Err(error) => {
                self.release_in_background(lock.to_owned(), holder.to_owned(), true);
                Err(error)
            }
        }
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

    /// The holders (the lowest node, or the leading run of read nodes),
    /// the time a node outlives a holder that dies now (its session
    /// timeout), and the queue.
    pub(crate) async fn inspect(&self, lock: &str) -> Result<Option<Recorded>, BackendError> {
        let client = self.inner.reader.client();
        let sorted = path::sorted(self.inner.list(&client, lock).await?);
        if sorted.is_empty() {
            return Ok(None);
        }
        let mut reader = client.new_multi_reader();
        for name in &sorted {
            reader
                .add_get_data(&path::child(lock, name))
                .map_err(|e| self.inner.failed("inspect failed", e))?;
        }
        let read = self
            .inner
            .within(reader.commit())
            .await
            .map_err(|e| self.inner.failed("inspect failed", e))?;
        let (names, nodes): (Vec<String>, Vec<RecordedReader>) = sorted
            .into_iter()
            .zip(read)
            .filter_map(|(name, result)| {
                let MultiReadResult::Data { data, stat } = result else {
                    return None; // deleted meanwhile
                };
                // A node of another client (Curator's) shows by its name.
                let (holder, session_ms, token) = path::parse_data(&data)
                    .map_or((name.clone(), None, None), |(holder, ms, token)| {
                        (holder, Some(ms), token)
                    });
                let node = RecordedReader {
                    holder,
                    remaining: session_ms.map(Duration::from_millis),
                    // A downgraded hold's read node has the hold's token
                    // in its data.
                    fence: token.or(u64::try_from(stat.czxid).ok()),
                };
                Some((name, node))
            })
            .unzip();
        let holding = path::holders(&names).len();
        let mut nodes = nodes.into_iter();
        let held: Vec<RecordedReader> = nodes.by_ref().take(holding).collect();
        let queue = nodes.map(|node| node.holder).collect();
        let read = names.first().is_some_and(|first| path::reads(first));
        // For a read hold, the reader that a writer waits for longest.
        let Some(shown) = held.iter().max_by_key(|node| node.remaining).cloned() else {
            return Ok(None);
        };
        Ok(Some(Recorded {
            holder: shown.holder,
            holds: 1,
            remaining: shown.remaining,
            fence: shown.fence,
            queue,
            mode: if read {
                LockMode::Read
            } else {
                LockMode::Write
            },
            readers: if read { held } else { Vec::new() },
        }))
    }

    /// Deletes the holders' nodes (the lowest node, or the leading run of
    /// read nodes), whoever they are; `true` when there was one.
    pub(crate) async fn force_unlock(&self, lock: &str) -> Result<bool, BackendError> {
        let client = self.inner.reader.client();
        let sorted = path::sorted(self.inner.list(&client, lock).await?);
        let mut deleted = false;
        for holder in path::holders(&sorted) {
            match self
                .inner
                .within(client.delete(&path::child(lock, holder), None))
                .await
            {
                Ok(()) => deleted = true,
                Err(zookeeper_client::Error::NoNode) => {}
                Err(error) => return Err(self.inner.failed("force unlock failed", error)),
            }
        }
        Ok(deleted)
    }

    /// Turns `holder`'s write (or exclusive) hold of `lock` into a read
    /// hold (see the module docs); `Ok(false)` when the hold is gone. It
    /// runs as a task of the runtime, so a caller that goes away does not
    /// cut it short between its request and the record of its answer; a
    /// release of the holder waits for it.
    pub(crate) async fn downgrade(&self, lock: &str, holder: &str) -> Result<bool, BackendError> {
        match self.inner.start_downgrade(lock, holder).await {
            Ok(outcome) => outcome,
            Err(_) => Err(BackendError::msg(format!(
                "downgrade of {lock} on ZooKeeper at {}: the runtime stopped",
                self.inner.sessions.shown()
            ))),
        }
    }

    /// [`downgrade`](Self::downgrade) with nobody to await it (a dropped
    /// guard): counted as pending for the key until answered, like a
    /// background release (this process's next acquire of the key, and
    /// shutdown, wait for it), and ahead of any later release of the
    /// holder, which waits for it. `Ok(false)` marks `held` lost; a
    /// failure leaves the write node to the renewals (it stands, more
    /// exclusive than asked, until the release; or it is found gone).
    pub(crate) fn downgrade_in_background(&self, held: &Arc<HeldLock>) {
        let pending = self.inner.releases.pending().clone();
        pending.add(&held.lock_key);
        let downgrading = self.inner.start_downgrade(&held.lock_key, &held.holder);
        let held = held.clone();
        self.inner.handle.spawn(async move {
            match downgrading.await {
                Ok(Ok(true)) | Err(_) => {}
                Ok(Ok(false)) => held.mark_lost(),
                Ok(Err(error)) => tracing::warn!(
                    %error,
                    key = %held.key,
                    "downgrade failed: the hold stays a write hold on ZooKeeper until its release"
                ),
            }
            pending.done([held.lock_key.as_str()]);
        });
    }

    /// Queues the deletion of `holder`'s node of `lock`.
    pub(crate) fn release_in_background(&self, lock: String, holder: String, fair: bool) {
        self.inner.waits.stop(&lock, &holder);
        if !self.inner.releases.send(lock, holder, fair) {
            tracing::debug!("lock runtime stopped; a lock will be freed when its session closes");
        }
    }

    /// The background releases not yet answered.
    pub(crate) fn pending(&self) -> &Arc<PendingReleases> {
        self.inner.releases.pending()
    }

    /// Confirms every held node of `batch`: one multi-read per session
    /// (which also tells the server the session is alive).
    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        let mut outcome = vec![None; batch.len()];
        // The held nodes of each session, with their place in `batch`.
        type Group = (Arc<Session>, Vec<(usize, Place)>);
        let mut groups: Vec<Group> = Vec::new();
        for (i, lock) in batch.iter().enumerate() {
            let Some(place) = self.inner.place(&lock.lock_key, &lock.holder) else {
                outcome[i] = Some(false);
                continue;
            };
            // (The hold's token, which a downgrade keeps; `confirm` checks
            // the node's own czxid.)
            if u64::try_from(place.fence).ok() != Some(lock.fence()) {
                outcome[i] = Some(false);
                continue;
            }
            match groups
                .iter_mut()
                .find(|(s, _)| Arc::ptr_eq(s, &place.session))
            {
                Some((_, items)) => items.push((i, place)),
                None => groups.push((place.session.clone(), vec![(i, place)])),
            }
        }
        let checks = groups.iter().flat_map(|(session, items)| {
            items
                .chunks(MULTI_OPS)
                .map(move |chunk| self.confirm(session, chunk, batch))
        });
        for found in futures_util::future::join_all(checks).await {
            for (i, held) in found {
                outcome[i] = held;
            }
        }
        Ok(outcome)
    }

    /// Whether each node of `chunk` (all of `session`) still stands, made
    /// by the session as it is now.
    async fn confirm(
        &self,
        session: &Session,
        chunk: &[(usize, Place)],
        batch: &[Arc<HeldLock>],
    ) -> Vec<(usize, Option<bool>)> {
        let client = session.client();
        let id = client.session_id().0;
        let mut reader = client.new_multi_reader();
        for (i, place) in chunk {
            if reader
                .add_get_data(&path::child(&batch[*i].lock_key, &place.name))
                .is_err()
            {
                return chunk.iter().map(|(i, _)| (*i, None)).collect();
            }
        }
        let Ok(read) = self.inner.within(reader.commit()).await else {
            return chunk.iter().map(|(i, _)| (*i, None)).collect();
        };
        chunk
            .iter()
            .zip(read)
            .map(|((i, place), result)| {
                let held = match result {
                    MultiReadResult::Data { stat, .. } => Some(
                        stat.czxid == place.czxid
                            && stat.ephemeral_owner == id
                            && place.owner == id,
                    ),
                    MultiReadResult::Error {
                        err: zookeeper_client::Error::NoNode,
                    } => Some(false),
                    _ => None,
                };
                (*i, held)
            })
            .collect()
    }

    /// Confirms fair places: each node still queued (standing, not first).
    pub(crate) async fn refresh_places(
        &self,
        batch: &[PlaceRefresh],
    ) -> Result<Vec<Option<Refreshed>>, BackendError> {
        let gone = Refreshed {
            queued: false,
            lock_ttl: -2,
        };
        let client = self.inner.reader.client();
        let mut outcome = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(MULTI_OPS) {
            let places: Vec<Option<Place>> = chunk
                .iter()
                .map(|p| self.inner.place(&p.lock_key, &p.holder))
                .collect();
            let mut reader = client.new_multi_reader();
            for p in chunk {
                reader
                    .add_get_children(&p.lock_key)
                    .map_err(|e| self.inner.failed("fair place refresh failed", e))?;
            }
            let read = self
                .inner
                .within(reader.commit())
                .await
                .map_err(|e| self.inner.failed("fair place refresh failed", e))?;
            for (place, result) in places.into_iter().zip(read) {
                let Some(place) = place else {
                    outcome.push(Some(gone));
                    continue;
                };
                outcome.push(match result {
                    MultiReadResult::Children { children } => {
                        let sorted = path::sorted(children);
                        Some(match path::turn(&sorted, &place.name) {
                            path::Turn::Gone => gone,
                            path::Turn::Holds => Refreshed {
                                queued: false,
                                lock_ttl: -1,
                            },
                            path::Turn::Behind(_) => Refreshed {
                                queued: true,
                                lock_ttl: -1,
                            },
                        })
                    }
                    MultiReadResult::Error {
                        err: zookeeper_client::Error::NoNode,
                    } => Some(gone),
                    _ => None,
                });
            }
        }
        Ok(outcome)
    }
}

/// Deletes the nodes of dropped guards, cancelled acquires and unused
/// places: those of a session in one transaction (one commit for many, as
/// a dropped batch of guards needs), and any that fails in it one by one,
/// retrying: a node left standing would block its lock for as long as our
/// session lives.
async fn releaser(
    inner: Weak<Inner>,
    mut jobs: mpsc::UnboundedReceiver<ReleaseJob>,
    pending: Arc<PendingReleases>,
) {
    let mut batch = Vec::with_capacity(MULTI_OPS);
    while jobs.recv_many(&mut batch, MULTI_OPS).await > 0 {
        let batch = std::mem::replace(&mut batch, Vec::with_capacity(MULTI_OPS));
        let Some(backend) = inner.upgrade() else {
            pending.done(batch.iter().map(|(lock, _, _)| lock.as_str()));
            return;
        };
        let pending = pending.clone();
        let inner = Arc::downgrade(&backend);
        tokio::spawn(async move {
            let left = backend.delete_together(&batch).await;
            drop(backend);
            let (alone, done): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .enumerate()
                .partition(|(i, _)| left.contains(i));
            pending.done(done.iter().map(|(_, (lock, _, _))| lock.as_str()));
            for (_, (lock, holder, _)) in alone {
                tokio::spawn(release_retrying(
                    inner.clone(),
                    lock,
                    holder,
                    pending.clone(),
                ));
            }
        });
    }
}

impl Inner {
    /// Deletes the nodes of `batch` this process knows, one transaction
    /// per session; the indices of the jobs still to do one by one.
    async fn delete_together(&self, batch: &[ReleaseJob]) -> Vec<usize> {
        let mut left = Vec::new();
        let mut groups: Vec<(Arc<Session>, Vec<usize>)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, (lock, holder, _)) in batch.iter().enumerate() {
            let place = self.place(lock, holder);
            match place {
                Some(place)
                    if place.owner == place.session.id()
                        && !self.goes_alone(lock, holder)
                        && seen.insert((lock, holder)) =>
                {
                    match groups
                        .iter_mut()
                        .find(|(s, _)| Arc::ptr_eq(s, &place.session))
                    {
                        Some((_, jobs)) => jobs.push(i),
                        None => groups.push((place.session.clone(), vec![i])),
                    }
                }
                _ => left.push(i),
            }
        }
        for (session, jobs) in groups {
            let client = session.client();
            let mut writer = client.new_multi_writer();
            let mut paths = Vec::with_capacity(jobs.len());
            for &i in &jobs {
                let (lock, holder, _) = &batch[i];
                if let Some(place) = self.place(lock, holder) {
                    paths.push(path::child(lock, &place.name));
                }
            }
            let added = paths.iter().all(|p| writer.add_delete(p, None).is_ok());
            let committed = added
                && paths.len() == jobs.len()
                && tokio::time::timeout(self.timeout, writer.commit())
                    .await
                    .is_ok_and(|r| r.is_ok());
            if committed {
                for &i in &jobs {
                    let (lock, holder, _) = &batch[i];
                    self.forget(lock, holder);
                }
            } else {
                left.extend(jobs);
            }
        }
        left
    }
}

/// Deletes one node, retrying while the session lives. After a few attempts
/// it stops holding up this process's next acquire of the lock (which then
/// goes ahead; the node goes on being deleted), but it stays unanswered
/// for shutdown, which promised to confirm it, until it is answered.
async fn release_retrying(
    inner: Weak<Inner>,
    lock: String,
    holder: String,
    pending: Arc<PendingReleases>,
) {
    let mut blocking = true;
    let mut given_up = true;
    for attempt in 1..=RELEASE_ATTEMPTS_MAX {
        let Some(backend) = inner.upgrade() else {
            given_up = false; // (the runtime is gone, and its session)
            break;
        };
        let still_ours = backend
            .place(&lock, &holder)
            .is_none_or(|p| p.owner == p.session.id());
        if !still_ours {
            // Its session expired: the node went with it.
            backend.forget(&lock, &holder);
            given_up = false;
            break;
        }
        match backend.delete(&lock, &holder).await {
            Ok(_) => {
                given_up = false;
                break;
            }
            Err(error) if error.is_permission_denied() => {
                // (An ACL on the lock's path: it would be refused again.)
                tracing::warn!(
                    %error,
                    lock,
                    "background release refused for lack of a permission: given up"
                );
                break;
            }
            Err(error) => {
                drop(backend);
                if attempt == RELEASE_ATTEMPTS {
                    tracing::warn!(
                        %error,
                        lock,
                        "background release failed; still trying while the session lives"
                    );
                    pending.unblock(&lock);
                    blocking = false;
                }
                let pause = if attempt < RELEASE_ATTEMPTS {
                    Duration::from_millis(50 * u64::from(attempt))
                } else {
                    Duration::from_secs(1)
                };
                tokio::time::sleep(pause).await;
            }
        }
    }
    match (blocking, given_up) {
        (true, false) => pending.done([lock.as_str()]),
        (true, true) => pending.given_up([lock.as_str()]),
        (false, false) => pending.done_nonblocking(&lock),
        (false, true) => pending.given_up_nonblocking(&lock),
    }
}

/// The waiters' side: the per-place watches start with the acquire that
/// queued the place, so a lock's watch is ready at once; an unused place's
/// node is deleted.
#[derive(Debug)]
struct ZookeeperWatches {
    backend: Weak<Inner>,
}

impl Watches for ZookeeperWatches {
    fn watch(&self, _lock: &str, watched: Arc<dyn Watched>) {
        watched.set_ready();
    }

    fn unwatch(&self, _lock: &str) {}

    fn give_back_place(&self, lock: String, holder: String) {
        if let Some(inner) = self.backend.upgrade() {
            ZookeeperBackend { inner }.release_in_background(lock, holder, true);
        }
    }
}
