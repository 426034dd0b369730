//! Where locks live: Redis (one server, or the primary of a Sentinel
//! service), or the embedded in-process store.
//!
//! Both backends offer the same four operations with the same meaning (the
//! Lua scripts in `scripts/` define it; `memory.rs` mirrors them line by
//! line). Everything Redis-specific — connections, scripts, pub/sub,
//! reconnects, a single server or a cluster — stays inside `redis/` (and
//! `sentinel/`, which points it at the current primary); the rest of the
//! crate only sees [`Backend`].

/// What [`Backend::describe`] says of the embedded backend.
pub(crate) const EMBEDDED_DESCRIPTION: &str =
    "embedded (in-process) backend: locks exclude only tasks of this process";

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) mod place_tasks;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod releases;
pub(crate) mod sentinel;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::error::{BackendError, LockError};
use crate::held::HeldLock;
use crate::mode::LockMode;

/// Reply of an acquire attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// The lock is ours; `fence` is the fencing token of this hold.
    Held {
        /// Fencing token.
        fence: u64,
        /// The last token reserved for holders this process passes the
        /// lock to (`fence` when none is; see `cohort.rs`).
        upto: u64,
        /// Fair mode: it was already held under this holder id (handed over
        /// by a release), rather than taken just now.
        handed: bool,
    },
    /// Someone else holds it for about `ttl` more (None: no expiry known).
    Busy {
        /// Holder's remaining lease.
        ttl: Option<Duration>,
    },
}

/// How long a fair-mode queue entry stays valid without a refresh. A waiting
/// process refreshes its entries three times as often; an entry of a waiter
/// that died is skipped once it has run out.
pub(crate) const QUEUE_ENTRY_LIFE: Duration = Duration::from_secs(3);

/// How an acquire attempt treats the key's fair queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queue {
    /// Plain mode: no queue.
    No,
    /// Fair mode, trying once: take the lock if free and nobody is queued.
    Peek,
    /// Fair mode, waiting: join the queue (or refresh the entry) when busy;
    /// a release hands the lock over with this lease.
    Join(Duration),
}

/// Reply of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// The lock is free now, and waiters were told.
    Freed,
    /// We still hold it (more holds recorded in the backend).
    StillHeld,
    /// It was not ours: expired, deleted, or taken over.
    NotHeld,
}

/// Which backend to start, and how (what the builder decided).
#[derive(Clone)]
pub(crate) enum BackendConfig {
    /// The embedded store; tokens' counters expire `fence_window` after use.
    Memory {
        /// See [`ConnectSettings::fence_window`].
        fence_window: Duration,
    },
    /// A Redis server at a URL (which may hold a password: never shown).
    Redis(String, ConnectSettings),
    /// A Redis Cluster, given URLs of some of its nodes.
    RedisCluster(Vec<String>, ConnectSettings),
    /// Redlock over these independent Redis masters (at least three), with
    /// the name of their boot marker (`<prefix>redlock:boot`).
    Redlock(Vec<String>, String, ConnectSettings),
    /// A primary found through Redis Sentinel, followed across failovers.
    Sentinel(sentinel::SentinelConfig, ConnectSettings),
    /// An etcd cluster.
    #[cfg(feature = "etcd")]
    Etcd(etcd::EtcdConfig, ConnectSettings),
    /// A ZooKeeper ensemble (or standalone server).
    #[cfg(feature = "zookeeper")]
    Zookeeper(zookeeper::ZookeeperConfig, ConnectSettings),
}

/// How to reach a server backend, as the builder configured it (the same
/// for every networked backend: timeouts, TLS, the fence window).
#[derive(Clone, Default)]
pub(crate) struct ConnectSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    /// PEM of a private CA to trust instead of the system roots (TLS URLs).
    pub(crate) tls_root_ca: Option<Vec<u8>>,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    /// PEM certificate chain and key for mutual TLS.
    pub(crate) tls_client: Option<(Vec<u8>, Vec<u8>)>,
    /// How long a key's last token is kept after it was issued.
    pub(crate) fence_window: Duration,
    /// Tokens reserved with each acquisition for local holders (lock
    /// cohorting; 0: none).
    pub(crate) fence_reserve: u32,
}

/// What a backend tells this process's waiters. The waiter registry
/// (`waiters.rs`) implements it; a backend holds it weakly and knows nothing
/// else of the waiters. How the news arrives is the backend's business (a
/// Redis release channel; a watch on the predecessor for etcd or ZooKeeper).
pub(crate) trait Wakeups: Send + Sync {
    /// The lock `lock` was released: its first local waiter should try.
    fn released(&self, lock: &str);
    /// A fair release handed `lock` to `holder`, with token `fence` (and
    /// the tokens up to `upto` reserved for local holders).
    fn handed_over(&self, lock: &str, holder: &str, fence: u64, upto: u64);
    /// News may have been lost (a dropped connection): every waiter tries.
    fn connection_lost(&self);
}

/// The waiters of one lock, as the backend's watch on its releases sees
/// them.
pub(crate) trait Watched: Send + Sync + std::fmt::Debug {
    /// Every waiter has left: a watch still being set up is not wanted.
    fn is_closed(&self) -> bool;
    /// The watch is in place, or could not be set up (waiters then rely on
    /// the holder's lease, which is slower but still correct).
    fn set_ready(&self);
    /// A watch that had failed went through: a release may have been
    /// missed, so the first waiter tries.
    fn wake_first(&self);
}

/// How the waiters reach the backend: watching a lock's releases while it
/// has local waiters, and giving back fair-queue places nobody uses. `None`
/// from [`Backend::start`] when the backend needs neither (the embedded
/// store wakes waiters directly).
pub(crate) trait Watches: Send + Sync + std::fmt::Debug {
    /// Start watching `lock`'s releases for `watched` (ready when set up).
    fn watch(&self, lock: &str, watched: Arc<dyn Watched>);
    /// Stop watching `lock`: nobody waits for it any more.
    fn unwatch(&self, lock: &str);
    /// Give back a fair-queue place (`holder`) of `lock` nobody uses: it
    /// leaves the queue, or frees the lock if it was handed over meanwhile.
    fn give_back_place(&self, lock: String, holder: String);
}

/// A waiting process's place in a key's fair queue, due for a refresh (see
/// [`Heartbeats`]).
#[derive(Clone, Debug)]
pub(crate) struct PlaceRefresh {
    /// The lock's backend name.
    pub(crate) lock_key: String,
    /// The place's holder id.
    pub(crate) holder: String,
    /// The lease a release hands the lock to it with.
    pub(crate) lease: Duration,
    /// A reader's place (Redis: a reader is told to try when it may come
    /// in beside other readers).
    pub(crate) read: bool,
}

/// What a refresh found of one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refreshed {
    /// Still queued (refreshed); `false`: dequeued (handed the lock, or its
    /// entry dropped).
    pub(crate) queued: bool,
    /// The lock's remaining lease in ms as Redis `PTTL` gives it (-2: free,
    /// -1: no expiry).
    pub(crate) lock_ttl: i64,
}

/// Fair-queue places that must be refreshed while their process waits: the
/// waiter registry says which are due, the watchdog sends them in its tick
/// (pipelined batches, like renewals) and reports back.
pub(crate) trait Heartbeats: Send + Sync {
    /// How many times the backend reported a lost connection so far: a
    /// server restarted empty, or a failover, shows as one. A hold confirmed
    /// (acquired or renewed) in an older epoch may be gone without this
    /// process knowing yet, so it is not passed between tasks (lock
    /// cohorting) until a renewal confirms it again.
    fn connection_epoch(&self) -> u32;
    /// Resolves at the next lost connection (the watchdog then renews
    /// every hold at once, so that each is confirmed again, or found lost,
    /// as soon as the backend answers).
    fn connection_lost_notified(&self) -> tokio::sync::futures::Notified<'_>;
    /// The places due at `now` (now marked in flight), and when the next
    /// one falls due.
    fn due_places(
        &self,
        now: tokio::time::Instant,
    ) -> (Vec<PlaceRefresh>, Option<tokio::time::Instant>);
    /// The outcome of refreshing `places`, sent at `sent_at` (`None`:
    /// unknown).
    fn places_refreshed(
        &self,
        places: &[PlaceRefresh],
        outcome: &[Option<Refreshed>],
        sent_at: tokio::time::Instant,
    );
}

/// What the backend records of a held lock (see [`Backend::inspect`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// Holder id: `<process-uuid>:<n>`.
    pub(crate) holder: String,
    /// Holds recorded under it (nested holds of one process count once).
    pub(crate) holds: u64,
    /// Remaining lease; `None` when it has no expiry.
    pub(crate) remaining: Option<Duration>,
    /// The hold's fencing token, when recorded.
    pub(crate) fence: Option<u64>,
    /// Fair mode: holder ids queued for the lock, oldest first.
    pub(crate) queue: Vec<String>,
    /// Read (shared by `readers`) or write.
    pub(crate) mode: LockMode,
    /// The holders of a read hold, `holder` among them (empty for a write
    /// hold).
    pub(crate) readers: Vec<RecordedReader>,
}

/// One holder of a read hold, as the backend records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecordedReader {
    pub(crate) holder: String,
    pub(crate) remaining: Option<Duration>,
    pub(crate) fence: Option<u64>,
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

    /// One acquire attempt for `holder`. `queue` asks for the fair mode: when
    /// the lock is busy the holder id joins (or stays in) the key's queue.
    /// The embedded backend, where this process is the only contender and the
    /// local waiter queue is already first come first served, ignores it.
    ///
    /// `(lease, renewed)`: the lease, and whether the watchdog will renew it
    /// (a fixed lease must end on the server by itself: on etcd it gets an
    /// etcd lease of its own that nobody keeps alive).
    ///
    /// `mode`: read holds share the key; a write is the exclusive lock
    /// (every backend serves both).
    /// ZooKeeper also names its node by it (Curator's mutex node for
    /// exclusive, its read-write lock's for read and write).
    pub(crate) async fn acquire(
        &self,
        lock_key: &str,
        holder: &str,
        (lease, renewed): (Duration, bool),
        queue: Queue,
        mode: LockMode,
    ) -> Result<Acquire, BackendError> {
        #[cfg(not(any(feature = "etcd", feature = "zookeeper")))]
        let _ = renewed;
        match self {
            Backend::Redis(r) => r.acquire(lock_key, holder, lease, queue, mode).await,
            Backend::Memory(m) => Ok(m.acquire(lock_key, holder, lease, mode)),
            Backend::Redlock(r) => r.acquire(lock_key, holder, lease, queue, mode).await,
            Backend::Sentinel(s) => s.acquire(lock_key, holder, lease, queue, mode).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => {
                e.acquire(lock_key, holder, (lease, renewed), queue, mode)
                    .await
            }
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => {
                z.acquire(lock_key, holder, (lease, renewed), queue, mode)
                    .await
            }
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
            Backend::Redis(r) => r.downgrade(lock_key, holder, held.fair).await,
            Backend::Sentinel(s) => s.downgrade(lock_key, holder, held.fair).await,
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

    /// Gives back one hold of `holder` (`fair`: hand the lock to the first in
    /// the key's queue; for a queued holder id, leave the queue).
    pub(crate) async fn release(
        &self,
        lock_key: &str,
        holder: &str,
        fair: bool,
    ) -> Result<Release, BackendError> {
        match self {
            Backend::Redis(r) => r.release(lock_key, holder, fair).await,
            Backend::Memory(m) => Ok(m.release(lock_key, holder)),
            Backend::Redlock(r) => r.release(lock_key, holder, fair).await,
            Backend::Sentinel(s) => s.release(lock_key, holder, fair).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.release(lock_key, holder, fair).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.release(lock_key, holder, fair).await,
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
    pub(crate) async fn publish_identity(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<(), BackendError> {
        match self {
            Backend::Redis(r) => r.publish_identity(key, value, ttl).await,
            Backend::Memory(_) => Ok(()),
            // Not on etcd or ZooKeeper yet (the Redis family only, for now).
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Ok(()),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(_) => Ok(()),
            Backend::Redlock(r) => r.publish_identity(key, value, ttl).await,
            Backend::Sentinel(s) => s.publish_identity(key, value, ttl).await,
        }
    }

    /// The identity a runtime published under `key` (`None`: none, or gone).
    pub(crate) async fn read_identity(&self, key: &str) -> Result<Option<String>, BackendError> {
        match self {
            Backend::Redis(r) => r.read_identity(key).await,
            Backend::Memory(_) => Ok(None),
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Ok(None),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(_) => Ok(None),
            Backend::Redlock(r) => r.read_identity(key).await,
            Backend::Sentinel(s) => s.read_identity(key).await,
        }
    }

    /// Releases without waiting for the outcome; callable from `Drop`, with
    /// or without a tokio context.
    pub(crate) fn release_in_background(&self, lock_key: String, holder: String, fair: bool) {
        match self {
            Backend::Redis(r) => r.release_in_background(lock_key, holder, fair),
            Backend::Memory(m) => {
                m.release(&lock_key, &holder);
            }
            Backend::Redlock(r) => r.release_in_background(lock_key, holder, fair),
            Backend::Sentinel(s) => s.release_in_background(lock_key, holder, fair),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.release_in_background(lock_key, holder, fair),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.release_in_background(lock_key, holder, fair),
        }
    }

    /// Whether a locked call may return before its release is answered
    /// (`LockRuntime::release_behind`): the Redis family and the embedded
    /// store. Not etcd or ZooKeeper: there this process's next acquire of
    /// the key waits for the answer anyway, and it did not measure faster.
    /// (The whole-wait stall once blamed on it was the bench's workers
    /// exiting without `shutdown`, their last release still behind them;
    /// they call it now. With it on, two interleaved `lock-bench s12` pairs
    /// on a loaded machine, off / on: S3 424 / 393 and 446 / 601
    /// acquisitions/s, wait max 115 / 268 and 115 / 114 ms: no clear gain.)
    pub(crate) fn releases_behind(&self) -> bool {
        match self {
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => false,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(_) => false,
            _ => true,
        }
    }

    /// Whether commands written one after another on this backend's
    /// connection are applied in that order, so that a release written
    /// before an acquire of the same key is applied first: one Redis
    /// server's connection. Not a Cluster (a redirected command is sent
    /// again later), Sentinel (the primary may change between the two),
    /// Redlock (a majority of several), etcd (one gRPC call may overtake
    /// another, see `etcd/tomb.rs`) or ZooKeeper (a release and an acquire
    /// may use different sessions); the embedded store frees at once.
    pub(crate) fn applies_in_order(&self) -> bool {
        match self {
            Backend::Redis(r) => !r.is_cluster(),
            _ => false,
        }
    }

    /// Whether a background release of `lock_key` is queued and not yet
    /// answered (never on the embedded backend, which frees at once).
    pub(crate) fn release_pending(&self, lock_key: &str) -> bool {
        match self {
            Backend::Redis(r) => r.pending().is_pending(lock_key),
            Backend::Memory(_) => false,
            Backend::Redlock(r) => r.release_pending(lock_key),
            Backend::Sentinel(s) => s.release_pending(lock_key),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.pending().is_pending(lock_key),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.pending().is_pending(lock_key),
        }
    }

    /// Resolves once every background release of `lock_key` queued so far has
    /// been answered.
    pub(crate) async fn releases_settled(&self, lock_key: &str) {
        match self {
            Backend::Redis(r) => r.pending().settled(lock_key).await,
            Backend::Redlock(r) => r.releases_settled(lock_key).await,
            Backend::Sentinel(s) => s.releases_settled(lock_key).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.pending().settled(lock_key).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.pending().settled(lock_key).await,
            Backend::Memory(_) => {}
        }
    }

    /// Resolves once every background release queued so far has been
    /// answered.
    pub(crate) async fn all_releases_settled(&self) {
        match self {
            Backend::Redis(r) => r.pending().all_settled().await,
            Backend::Redlock(r) => r.all_releases_settled().await,
            Backend::Sentinel(s) => s.all_releases_settled().await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.pending().all_settled().await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.pending().all_settled().await,
            Backend::Memory(_) => {}
        }
    }

    /// From now on, background releases given up unanswered are named by
    /// [`unconfirmed_releases`](Self::unconfirmed_releases) (shutdown
    /// begins).
    pub(crate) fn record_given_up_releases(&self) {
        match self {
            Backend::Redis(r) => r.pending().record_given_up(),
            Backend::Redlock(r) => r.record_given_up_releases(),
            Backend::Sentinel(s) => s.record_given_up_releases(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.pending().record_given_up(),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.pending().record_given_up(),
            Backend::Memory(_) => {}
        }
    }

    /// The locks (backend names) of which a background release is not
    /// answered, or was given up unanswered since
    /// [`record_given_up_releases`](Self::record_given_up_releases).
    pub(crate) fn unconfirmed_releases(&self) -> std::collections::BTreeSet<String> {
        match self {
            Backend::Redis(r) => r.pending().unconfirmed(),
            Backend::Redlock(r) => r.unconfirmed_releases(),
            Backend::Sentinel(s) => s.unconfirmed_releases(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.pending().unconfirmed(),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.pending().unconfirmed(),
            Backend::Memory(_) => std::collections::BTreeSet::new(),
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
