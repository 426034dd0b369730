//! Where locks live, behind one seam: [`Backend`], an enum over the Redis
//! family (one server or a Cluster in `redis/`, a Sentinel service's primary
//! in `sentinel/`, Redlock over independent masters in `redlock/`), etcd
//! (`etcd/`), ZooKeeper (`zookeeper/`) and the embedded store
//! (`memory.rs`).
//!
//! Every backend offers the same operations with the same meaning: acquire
//! (plain or fair, read or write), release, downgrade, renew, inspect and
//! force-unlock. The Redis family's Lua scripts in `scripts/` define them;
//! the embedded store mirrors them, and etcd and ZooKeeper build them from
//! their own recipes. This file only dispatches: what a backend answers is
//! in `replies.rs`, what it is started with in `config.rs`, what it tells
//! the waiters and the watchdog in `news.rs`, and its releases in the
//! background in `behind.rs` (their record in `releases.rs`). Nothing
//! outside `backend/` sees a server's client type.

/// What [`Backend::describe`] says of the embedded backend.
pub(crate) const EMBEDDED_DESCRIPTION: &str =
    "embedded (in-process) backend: locks exclude only tasks of this process";

mod behind;
mod config;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
mod news;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) mod place_tasks;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod releases;
mod replies;
pub(crate) mod sentinel;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

pub(crate) use config::{BackendConfig, ConnectSettings};
pub(crate) use news::{Heartbeats, Wakeups, Watched, Watches};
pub(crate) use replies::{
    Acquire, Ask, Holding, PlaceRefresh, Published, Queue, Recorded, RecordedReader, Refreshed,
    Release, QUEUE_ENTRY_LIFE,
};

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::error::{BackendError, LockError};
use crate::held::HeldLock;

impl<'a> From<&'a HeldLock> for Holding<'a> {
    fn from(held: &'a HeldLock) -> Self {
        Holding {
            lock_key: &held.lock_key,
            holder: &held.holder,
            fair: held.fair,
        }
    }
}

/// The backend of one runtime.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    /// A Redis server.
    Redis(redis::RedisBackend),
    /// The embedded store.
    Memory(Arc<memory::MemoryBackend>),
    /// Redlock over independent Redis masters.
    Redlock(redlock::Redlock),
    /// The primary of a Redis Sentinel service.
    Sentinel(sentinel::SentinelBackend),
    /// An etcd cluster.
    #[cfg(feature = "etcd")]
    Etcd(etcd::EtcdBackend),
    /// A ZooKeeper ensemble.
    #[cfg(feature = "zookeeper")]
    Zookeeper(zookeeper::ZookeeperBackend),
}

impl Backend {
    /// Starts the backend `config` asks for (connecting, loading scripts and
    /// spawning its tasks on the calling tokio runtime: the runtime's worker
    /// thread). `wakeups` is told of releases and handoffs.
    pub(crate) async fn start(
        config: BackendConfig,
        wakeups: Weak<dyn Wakeups>,
    ) -> Result<(Backend, Option<Arc<dyn Watches>>), LockError> {
        match config {
            BackendConfig::Memory { fence_window } => {
                let memory = memory::MemoryBackend::new(wakeups, fence_window);
                Ok((Backend::Memory(Arc::new(memory)), None))
            }
            BackendConfig::Redis(url, settings) => {
                let (backend, watches) = redis::connect(&url, &settings, wakeups).await?;
                Ok((Backend::Redis(backend), Some(watches)))
            }
            BackendConfig::RedisCluster(urls, settings) => {
                let (backend, watches) = redis::connect_cluster(&urls, &settings, wakeups).await?;
                Ok((Backend::Redis(backend), Some(watches)))
            }
            BackendConfig::Redlock(urls, marker, settings) => {
                let (backend, watches) =
                    redlock::Redlock::start(&urls, marker, &settings, wakeups).await?;
                Ok((Backend::Redlock(backend), Some(watches)))
            }
            BackendConfig::Sentinel(config, settings) => {
                let (backend, watches) = sentinel::connect(config, &settings, wakeups).await?;
                Ok((Backend::Sentinel(backend), Some(watches)))
            }
            #[cfg(feature = "etcd")]
            BackendConfig::Etcd(config, settings) => {
                let (backend, watches) = etcd::connect(config, &settings, wakeups).await?;
                Ok((Backend::Etcd(backend), Some(watches)))
            }
            #[cfg(feature = "zookeeper")]
            BackendConfig::Zookeeper(config, settings) => {
                let (backend, watches) = zookeeper::connect(config, &settings, wakeups).await?;
                Ok((Backend::Zookeeper(backend), Some(watches)))
            }
        }
    }

    /// What it is, for logs: `"redis at host:port"` (no credentials) or the
    /// embedded backend's warning that it excludes only this process.
    pub(crate) fn describe(&self) -> String {
        match self {
            Backend::Redis(r) => format!("redis at {}", r.endpoint()),
            Backend::Memory(_) => EMBEDDED_DESCRIPTION.to_owned(),
            Backend::Redlock(r) => r.describe(),
            Backend::Sentinel(s) => s.describe(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.describe(),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.describe(),
        }
    }

    /// The backend's name of the lock `key` under `prefix`. Redis: the key
    /// in a hash tag (`lock:{order:1}`), so that a lock's names share a
    /// Cluster slot. etcd: the prefix and the key (`lock:order:1`), the name
    /// `etcdctl lock` is given for the same lock, with `/` and `%` escaped
    /// (see `etcd::lock_name`).
    pub(crate) fn lock_name(&self, prefix: &str, key: &str) -> String {
        match self {
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => etcd::lock_name(prefix, key),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(_) => zookeeper::lock_path(prefix, key),
            _ => crate::names::LockNames::lock_key(prefix, key),
        }
    }

    /// Whether every lock is fair, whatever it asks: the backend's recipe
    /// queues contenders by creation order (etcd). `fair = false` still
    /// excludes; it just changes nothing.
    pub(crate) fn always_fair(&self) -> bool {
        match self {
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => true,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(_) => true,
            _ => false,
        }
    }

    /// [`lock_name`](Self::lock_name), refused when the backend cannot take
    /// the lock `key` with `lease` (ZooKeeper: a key that makes no path, a
    /// lease longer than any session the servers grant). One call that
    /// yields the name: a waiting acquire's state does not grow.
    pub(crate) fn checked_lock_name(
        &self,
        prefix: &str,
        key: &str,
        lease: Duration,
    ) -> Result<String, LockError> {
        let name = self.lock_name(prefix, key);
        match self {
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => match z.refuses(key, &name, lease) {
                Some(refused) => Err(refused),
                None => Ok(name),
            },
            _ => {
                let _ = lease;
                Ok(name)
            }
        }
    }

    /// Whether a hold may be passed between tasks of this process without
    /// a round trip (lock cohorting): the backend reserves tokens for it.
    /// Not on the embedded store (no round trip to save) or Redlock (its
    /// tokens come from a majority of counters).
    pub(crate) fn passes_locally(&self) -> bool {
        matches!(self, Backend::Redis(_) | Backend::Sentinel(_))
    }

    /// Whether what `inspect` reads as a holder's lease left is only a
    /// bound (ZooKeeper: the session timeout), not a count-down.
    pub(crate) fn lease_left_is_bound(&self) -> bool {
        match self {
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(_) => true,
            _ => false,
        }
    }

    /// Whether locks exclude only tasks of this process.
    pub(crate) fn is_embedded(&self) -> bool {
        matches!(self, Backend::Memory(_))
    }

    /// Whether fair mode changes anything: the backend keeps a queue across
    /// processes. (The embedded store has one process, whose local waiters
    /// are always served in order; Redlock has no shared queue and refuses
    /// fair mode, see [`Backend::fair_unsupported`].)
    pub(crate) fn queues_across_processes(&self) -> bool {
        matches!(self, Backend::Redis(_) | Backend::Sentinel(_)) || self.always_fair()
    }

    /// Whether a process's fair place in a key's queue has a mode (read or
    /// write): the mode of the waiter that queued it, kept for the place's
    /// life. A head waiter of the other mode gives the place back and
    /// queues a new one (a new holder id). So a holder id serves one mode:
    /// on Redis a release hands a read hold to a reader's place and a write
    /// hold to a writer's; on etcd a key, on ZooKeeper a node, is never
    /// used by an attempt of the other mode (an etcd handoff computed from
    /// a writer's key could otherwise be entered by a writer after a
    /// reader's attempt made that key a reader: a reader of another process
    /// then entered beside it). Every backend that queues has places.
    pub(crate) fn places_have_modes(&self) -> bool {
        self.queues_across_processes()
    }

    /// Why a lock that asks for fair mode must be refused on this backend,
    /// if it must (rather than quietly served in plain mode).
    pub(crate) fn fair_unsupported(&self) -> Option<&'static str> {
        matches!(self, Backend::Redlock(_)).then_some(redlock::FAIR_UNSUPPORTED)
    }

    /// One acquire attempt for `ask.holder`. `ask.queue` asks for the fair
    /// mode: when the lock is busy the holder id joins (or stays in) the
    /// key's queue. The embedded backend, where this process is the only
    /// contender and the local waiter queue is already first come first
    /// served, ignores it.
    ///
    /// `ask.renewed`: whether the watchdog will renew the lease (a fixed
    /// lease must end on the server by itself: on etcd it gets an etcd
    /// lease of its own that nobody keeps alive).
    ///
    /// `ask.mode`: read holds share the key; a write is the exclusive lock
    /// (every backend serves both).
    /// ZooKeeper also names its node by it (Curator's mutex node for
    /// exclusive, its read-write lock's for read and write).
    pub(crate) async fn acquire(&self, ask: Ask<'_>) -> Result<Acquire, BackendError> {
        match self {
            Backend::Redis(r) => r.acquire(ask).await,
            Backend::Memory(m) => Ok(m.acquire(ask.lock_key, ask.holder, ask.lease, ask.mode)),
            Backend::Redlock(r) => r.acquire(ask).await,
            Backend::Sentinel(s) => s.acquire(ask).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.acquire(ask).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.acquire(ask).await,
        }
    }

    /// Tells the backend that `holder`'s write hold (`held`) is a read hold
    /// now (its last write frame went while read frames remain): other
    /// readers may join it, writers still wait. `Ok(false)`: the backend no
    /// longer records the hold (it is lost). Until the backend answers it
    /// still records a write hold: more exclusive, never less. Redlock's
    /// is done on a majority of masters.
    pub(crate) async fn downgrade(&self, held: &HeldLock) -> Result<bool, BackendError> {
        let (lock_key, holder) = (&held.lock_key, &held.holder);
        match self {
            Backend::Memory(m) => Ok(m.downgrade(lock_key, holder)),
            Backend::Redis(r) => r.downgrade(held.into()).await,
            Backend::Sentinel(s) => s.downgrade(held.into()).await,
            Backend::Redlock(r) => r.downgrade(lock_key, holder).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.downgrade(lock_key, holder).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.downgrade(held).await,
        }
    }

    /// [`downgrade`](Self::downgrade) for a guard dropped (or a locked
    /// call's release behind it) with nobody to await it. Only the embedded
    /// store, where it is immediate, ZooKeeper, which registers it until
    /// answered and makes every release of the holder wait for it, and
    /// etcd, which queues it with its background releases ahead of any
    /// later release of the holder (a release that overtakes it, an awaited
    /// one, makes it change nothing: see etcd's `releaser`), downgrade then;
    /// on the others the hold stays a write hold until its read frames are
    /// released (more exclusive, never less), so that no background
    /// downgrade can be overtaken by the release behind it.
    pub(crate) fn downgrade_in_background(&self, held: &Arc<HeldLock>) {
        match self {
            Backend::Memory(m) => {
                let downgraded = m.downgrade(&held.lock_key, &held.holder);
                if !downgraded {
                    held.mark_lost();
                }
            }
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.downgrade_in_background(held),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.downgrade_in_background(held),
            _ => {}
        }
    }

    /// Gives back one hold of `hold.holder` (fair: hand the lock to the
    /// first in the key's queue; for a queued holder id, leave the queue).
    pub(crate) async fn release(&self, hold: Holding<'_>) -> Result<Release, BackendError> {
        match self {
            Backend::Redis(r) => r.release(hold).await,
            Backend::Memory(m) => Ok(m.release(hold.lock_key, hold.holder)),
            Backend::Redlock(r) => r.release(hold).await,
            Backend::Sentinel(s) => s.release(hold).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.release(hold).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.release(hold).await,
        }
    }

    /// One round trip (Redis `PING`; nothing for the embedded store).
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        match self {
            Backend::Redis(r) => r.ping().await,
            Backend::Memory(_) => Ok(()),
            Backend::Redlock(r) => r.ping().await,
            Backend::Sentinel(s) => s.ping().await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.ping().await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.ping().await,
        }
    }

    /// What the backend records of the lock now: `None` when it is free.
    pub(crate) async fn inspect(&self, lock_key: &str) -> Result<Option<Recorded>, BackendError> {
        match self {
            Backend::Redis(r) => r.inspect(lock_key).await,
            Backend::Memory(m) => Ok(m.inspect(lock_key)),
            Backend::Redlock(r) => r.inspect(lock_key).await,
            Backend::Sentinel(s) => s.inspect(lock_key).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.inspect(lock_key).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.inspect(lock_key).await,
        }
    }

    /// Deletes the lock whoever holds it; `true` when there was one.
    pub(crate) async fn force_unlock(&self, lock_key: &str) -> Result<bool, BackendError> {
        match self {
            Backend::Redis(r) => r.force_unlock(lock_key).await,
            Backend::Memory(m) => Ok(m.delete(lock_key)),
            Backend::Redlock(r) => r.force_unlock(lock_key).await,
            Backend::Sentinel(s) => s.force_unlock(lock_key).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.force_unlock(lock_key).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.force_unlock(lock_key).await,
        }
    }

    /// Publishes this runtime's identity (`who.rs`): `value` under `key`,
    /// for `ttl`. Nothing on the embedded backend (no operator can look
    /// into it).
    pub(crate) async fn publish_identity(&self, it: Published<'_>) -> Result<(), BackendError> {
        match self {
            Backend::Redis(r) => r.publish_identity(it).await,
            Backend::Memory(_) => Ok(()),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.publish_identity(it).await,
            // (Its node lives with the session, not for `ttl`.)
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.publish_identity(it.key, it.value).await,
            Backend::Redlock(r) => r.publish_identity(it).await,
            Backend::Sentinel(s) => s.publish_identity(it).await,
        }
    }

    /// The identity a runtime published under `key` (`None`: none, or gone).
    pub(crate) async fn read_identity(&self, key: &str) -> Result<Option<String>, BackendError> {
        match self {
            Backend::Redis(r) => r.read_identity(key).await,
            Backend::Memory(_) => Ok(None),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.read_identity(key).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.read_identity(key).await,
            Backend::Redlock(r) => r.read_identity(key).await,
            Backend::Sentinel(s) => s.read_identity(key).await,
        }
    }

    /// Splits the locks due for renewal into batches of at most `most` that
    /// are renewed (and time out) independently. On a Redis Cluster a batch
    /// never spans two slots, so a frozen master delays only its own locks'
    /// renewals, not those of the healthy masters
    /// (`tests/tests/cluster.rs`).
    pub(crate) fn renewal_batches(
        &self,
        due: &[Arc<HeldLock>],
        most: usize,
    ) -> Vec<Vec<Arc<HeldLock>>> {
        let most = most.max(1);
        match self {
            Backend::Redis(r) => r.renewal_batches(due, most),
            _ => due.chunks(most).map(<[_]>::to_vec).collect(),
        }
    }

    /// Refreshes every fair place of `batch` in one round trip (one script
    /// per slot): see [`Heartbeats`]. Backends without fair queues have
    /// nothing to refresh.
    pub(crate) async fn refresh_places(
        &self,
        batch: &[PlaceRefresh],
    ) -> Result<Vec<Option<Refreshed>>, BackendError> {
        match self {
            Backend::Redis(r) => r.refresh_places(batch).await,
            Backend::Sentinel(s) => s.refresh_places(batch).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.refresh_places(batch).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.refresh_places(batch).await,
            Backend::Memory(_) | Backend::Redlock(_) => Ok(vec![None; batch.len()]),
        }
    }

    /// Renews every lock of `batch` in one round trip: `Some(true)` renewed,
    /// `Some(false)` not ours any more, `None` unknown (that command failed).
    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        match self {
            Backend::Redis(r) => r.renew_many(batch).await,
            Backend::Memory(m) => Ok(batch
                .iter()
                .map(|l| Some(m.renew(&l.lock_key, &l.holder, l.lease)))
                .collect()),
            Backend::Redlock(r) => r.renew_many(batch).await,
            Backend::Sentinel(s) => s.renew_many(batch).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.renew_many(batch).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.renew_many(batch).await,
        }
    }
}
