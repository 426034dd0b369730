//! Redis Sentinel: the single-server backend, pointed at whichever node the
//! sentinels say is the primary, and moved when that changes.
//!
//! redis-rs's sentinel client resolves the primary once and does not follow
//! a failover, so this module does it: [`resolve`] asks the sentinels in
//! turn and confirms the answer with `ROLE`; the primary found is reached
//! through an ordinary [`RedisBackend`] (`redis::connect`, so scripts,
//! pushes, subscriptions and the releaser are the single server's).
//!
//! **Following a failover** is `follow.rs`'s: the monitor task, the search
//! for the primary and the move to a new one.
//!
//! **`sync_replicas(n, timeout)`.** Asynchronous replication may lose a lock
//! acquired just before a failover: the promoted replica never saw it, and
//! a second holder gets in. With sync, each acquire is followed by `WAIT n
//! timeout`, as Redisson's replication-safe mode does; fewer than `n`
//! acknowledgements release the lock and fail the acquire with a message
//! that says so. `WAIT` counts only the writes of the connection it is sent
//! on, and it blocks that connection: on the runtime's one multiplexed
//! connection it would stall every renewal and release behind it (for the
//! whole timeout, when a replica is down). So sync acquires, and their
//! `WAIT`, go over a second connection of their own to the primary (a
//! second `RedisBackend`, its response timeout lengthened by the `WAIT`
//! timeout); renewals and releases stay on the first. Sync acquires of one
//! process queue behind each other's `WAIT` there, which costs one
//! replication round trip each while the replicas are healthy. A lock a
//! fair-mode release hands over by message was written by the releasing
//! process, and is not waited for again.

mod events;
mod follow;
mod resolve;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub(crate) use resolve::NodeAuth;
use resolve::Sentinel;

use super::redis::RedisBackend;
use super::{
    Acquire, ConnectSettings, PlaceRefresh, Queue, Recorded, Refreshed, Release, Wakeups, Watched,
    Watches,
};
use crate::backend::{Ask, Holding, Published};
use crate::error::{BackendError, LockError};
use crate::held::HeldLock;

/// How far back a switch of primary sends the old primary's background
/// releases again (Sentinel's default `down-after-milliseconds` is 30 s),
/// and how many at most.
const RESEND_WINDOW: Duration = Duration::from_secs(60);
const RESEND_MAX: usize = 10_000;

/// How long a failed call waits for a switch of primary under way before
/// it reports the failure.
const SWITCH_GRACE: Duration = Duration::from_millis(500);

/// What the builder configured for Sentinel.
#[derive(Clone)]
pub(crate) struct SentinelConfig {
    /// Sentinel addresses (`redis://[user:password@]host:port` or `host:port`).
    pub(crate) sentinels: Vec<String>,
    /// The monitored service (`sentinel monitor <service> ...`).
    pub(crate) service: String,
    /// How the data nodes are reached.
    pub(crate) auth: NodeAuth,
    /// `WAIT` for this many replicas, this long, after each acquire.
    pub(crate) sync: Option<(u32, Duration)>,
}

/// The node the backend talks to now.
struct Primary {
    /// `host:port`.
    address: String,
    backend: RedisBackend,
    watches: Arc<dyn Watches>,
    /// Sync mode: the connection for acquires and their `WAIT`.
    sync: Option<RedisBackend>,
    /// Kept alive while this primary is current (the backend holds it weakly).
    _relay: Arc<follow::Relay>,
    /// The background releases handed to this primary's releaser in the
    /// last [`RESEND_WINDOW`]: sent again to the next primary if this one is
    /// replaced (its releaser may have given up on them, or they may not
    /// have reached a replica).
    recent: Mutex<VecDeque<Recent>>,
}

/// A background release: when it was queued, lock key, holder id, fair.
type Recent = (Instant, String, String, bool);

impl Primary {
    /// Queues a background release here, and remembers it.
    fn release_in_background(&self, lock_key: String, holder: String, fair: bool) {
        {
            let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            while recent.front().is_some_and(|(at, ..)| {
                recent.len() >= RESEND_MAX || now.saturating_duration_since(*at) > RESEND_WINDOW
            }) {
                recent.pop_front();
            }
            recent.push_back((now, lock_key.clone(), holder.clone(), fair));
        }
        self.backend.release_in_background(lock_key, holder, fair);
    }

    /// The background releases of the last [`RESEND_WINDOW`].
    fn take_recent(&self) -> VecDeque<Recent> {
        std::mem::take(&mut *self.recent.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Handle to the Sentinel backend of one runtime (cheap to clone).
#[derive(Clone)]
pub(crate) struct SentinelBackend {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SentinelBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelBackend")
            .field("service", &self.shared.service)
            .field("primary", &self.shared.current().address)
            .finish_non_exhaustive()
    }
}

/// What the backend handles, the waiters' watches and the monitor share.
struct Shared {
    sentinels: Vec<Sentinel>,
    service: String,
    auth: NodeAuth,
    sync: Option<(u32, Duration)>,
    settings: ConnectSettings,
    wakeups: Weak<dyn Wakeups>,
    primary: RwLock<Arc<Primary>>,
    /// The locks the waiters watch, to watch again on a new primary. Also
    /// held while the primary is replaced, so a watch is never sent to a
    /// primary that is on its way out.
    watched: Mutex<HashMap<String, Arc<dyn Watched>>>,
    /// Something failed: the monitor should look for the primary.
    suspect: Arc<Notify>,
    /// The primary a sentinel announced (`+switch-master`), for the monitor.
    announced: Mutex<Option<String>>,
    /// Told when a primary is announced.
    news: Notify,
    /// Told when the primary was replaced: calls still waiting for the old
    /// one run again on the new one, and waits for its releases end.
    switched: Notify,
    /// Shutdown began: every new primary records the releases it gives up
    /// (see `Backend::record_given_up_releases`).
    recording: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelShared")
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// Finds the primary, connects to it and starts the monitor. Must run on
/// the runtime's worker thread (tasks are spawned there).
pub(crate) async fn connect(
    config: SentinelConfig,
    settings: &ConnectSettings,
    wakeups: Weak<dyn Wakeups>,
) -> Result<(SentinelBackend, Arc<dyn Watches>), LockError> {
    if config.service.trim().is_empty() {
        return Err(LockError::InvalidConfig(
            "redis_sentinel needs the name of the service the sentinels monitor".to_owned(),
        ));
    }
    let sentinels = resolve::parse_sentinels(&config.sentinels)?;
    let address = resolve::primary(&sentinels, &config.service, &config.auth, settings).await?;
    let suspect = Arc::new(Notify::new());
    let primary = follow::open_primary(
        address,
        &config.auth,
        config.sync,
        settings,
        &wakeups,
        &suspect,
    )
    .await?;
    let shared = Arc::new(Shared {
        sentinels,
        service: config.service,
        auth: config.auth,
        sync: config.sync,
        settings: settings.clone(),
        wakeups,
        primary: RwLock::new(Arc::new(primary)),
        watched: Mutex::new(HashMap::new()),
        suspect: suspect.clone(),
        announced: Mutex::new(None),
        news: Notify::new(),
        switched: Notify::new(),
        recording: AtomicBool::new(false),
    });
    tokio::spawn(follow::monitor(Arc::downgrade(&shared), suspect));
    tokio::spawn(events::listen(Arc::downgrade(&shared)));
    let watches: Arc<dyn Watches> = shared.clone();
    Ok((SentinelBackend { shared }, watches))
}

impl Shared {
    fn current(&self) -> Arc<Primary> {
        self.primary
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Watches for Shared {
    fn watch(&self, lock: &str, watched: Arc<dyn Watched>) {
        let mut set = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        set.insert(lock.to_owned(), watched.clone());
        self.current().watches.watch(lock, watched);
    }

    fn unwatch(&self, lock: &str) {
        let mut set = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        set.remove(lock);
        self.current().watches.unwatch(lock);
    }

    fn give_back_place(&self, lock: String, holder: String) {
        self.current().release_in_background(lock, holder, true);
    }
}

impl SentinelBackend {
    /// `redis sentinel service <name>, primary at host:port`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "redis sentinel service {}, primary at {}",
            self.shared.service,
            self.shared.current().address
        )
    }

    /// Runs `call` on the current primary. When the primary is replaced
    /// during the call (a call to a dead node can take seconds to fail while
    /// its connection manager retries), or within [`SWITCH_GRACE`] after it
    /// failed (a failure is often the first sign of a switch, or comes just
    /// before one), it runs once more on the new primary; a call that did
    /// reach a demoted node left nothing that counts. A failure makes the
    /// monitor look for the primary.
    async fn on_primary<T, F>(&self, call: impl Fn(Arc<Primary>) -> F) -> Result<T, BackendError>
    where
        F: Future<Output = Result<T, BackendError>>,
    {
        for last in [false, true] {
            let switched = self.shared.switched.notified();
            let mut switched = std::pin::pin!(switched);
            switched.as_mut().enable();
            let primary = self.shared.current();
            let outcome = tokio::select! {
                outcome = call(primary.clone()) => outcome,
                () = switched.as_mut() => continue,
            };
            let error = match outcome {
                Ok(value) => return Ok(value),
                // (Neither is the sign of a switch.)
                Err(error) if error.is_replica_sync_failure() || error.is_permission_denied() => {
                    return Err(error)
                }
                Err(error) => error,
            };
            self.shared.suspect.notify_one();
            let replaced = !Arc::ptr_eq(&primary, &self.shared.current())
                || tokio::time::timeout(SWITCH_GRACE, switched).await.is_ok();
            if last || !replaced {
                return Err(error);
            }
        }
        Err(BackendError::msg(format!(
            "the primary of Redis Sentinel service `{}` was replaced twice during one call",
            self.shared.service
        )))
    }

    /// An acquire on the primary; with `sync_replicas`, a hold taken (read
    /// or write) is `WAIT`ed for before it counts.
    pub(crate) async fn acquire(&self, ask: Ask<'_>) -> Result<Acquire, BackendError> {
        let (lock_key, holder, queue) = (ask.lock_key, ask.holder, ask.queue);
        self.on_primary(|p| async move {
            match (&p.sync, self.shared.sync) {
                (Some(sync), Some(want)) => {
                    let fair = queue != Queue::No;
                    let taken = sync.acquire(ask).await?;
                    if let Acquire::Held { .. } = taken {
                        replicated(&p, sync, want, lock_key, holder, fair).await?;
                    }
                    Ok(taken)
                }
                _ => p.backend.acquire(ask).await,
            }
        })
        .await
    }

    pub(crate) async fn release(&self, hold: Holding<'_>) -> Result<Release, BackendError> {
        self.on_primary(|p| async move { p.backend.release(hold).await })
            .await
    }

    /// A downgrade on the current primary. (No `WAIT`: a replica that
    /// missed it still records the write hold, more exclusive, never less.)
    pub(crate) async fn downgrade(&self, hold: Holding<'_>) -> Result<bool, BackendError> {
        self.on_primary(|p| async move { p.backend.downgrade(hold).await })
            .await
    }

    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        self.on_primary(|p| async move { p.backend.ping().await })
            .await
    }

    pub(crate) async fn inspect(&self, lock_key: &str) -> Result<Option<Recorded>, BackendError> {
        self.on_primary(|p| async move { p.backend.inspect(lock_key).await })
            .await
    }

    pub(crate) async fn publish_identity(&self, it: Published<'_>) -> Result<(), BackendError> {
        self.on_primary(|p| async move { p.backend.publish_identity(it).await })
            .await
    }

    pub(crate) async fn read_identity(&self, key: &str) -> Result<Option<String>, BackendError> {
        self.on_primary(|p| async move { p.backend.read_identity(key).await })
            .await
    }

    pub(crate) async fn force_unlock(&self, lock_key: &str) -> Result<bool, BackendError> {
        self.on_primary(|p| async move { p.backend.force_unlock(lock_key).await })
            .await
    }

    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        self.on_primary(|p| async move { p.backend.renew_many(batch).await })
            .await
    }

    pub(crate) async fn refresh_places(
        &self,
        batch: &[PlaceRefresh],
    ) -> Result<Vec<Option<Refreshed>>, BackendError> {
        self.on_primary(|p| async move { p.backend.refresh_places(batch).await })
            .await
    }

    pub(crate) fn release_in_background(&self, lock_key: String, holder: String, fair: bool) {
        self.shared
            .current()
            .release_in_background(lock_key, holder, fair);
    }

    /// Whether a background release of `lock_key` is queued on the current
    /// primary and not answered yet.
    pub(crate) fn release_pending(&self, lock_key: &str) -> bool {
        self.shared.current().backend.pending().is_pending(lock_key)
    }

    /// Resolves once the background releases of `lock_key` queued so far on
    /// the current primary have been answered, or that primary was replaced
    /// (its releaser goes with it: what it had not sent is left to leases).
    pub(crate) async fn releases_settled(&self, lock_key: &str) {
        self.until_switched(|p| async move { p.backend.pending().settled(lock_key).await })
            .await;
    }

    /// Resolves once every background release queued so far has been
    /// answered (or given up) by the primary current then. A switch of
    /// primary queues the old one's recent releases on the new one: those
    /// are waited for there.
    pub(crate) async fn all_releases_settled(&self) {
        loop {
            let switched = self.shared.switched.notified();
            let mut switched = std::pin::pin!(switched);
            switched.as_mut().enable();
            let primary = self.shared.current();
            tokio::select! {
                () = primary.backend.pending().all_settled() => return,
                () = switched => {}
            }
        }
    }

    /// See `Backend::record_given_up_releases`: on this primary and every
    /// later one.
    pub(crate) fn record_given_up_releases(&self) {
        self.shared.recording.store(true, Ordering::SeqCst);
        self.shared.current().backend.pending().record_given_up();
    }

    /// The locks of which a background release is unconfirmed on the
    /// current primary.
    pub(crate) fn unconfirmed_releases(&self) -> std::collections::BTreeSet<String> {
        self.shared.current().backend.pending().unconfirmed()
    }

    /// Runs `wait` on the current primary until it ends or that primary is
    /// replaced.
    async fn until_switched<F: Future<Output = ()>>(&self, wait: impl FnOnce(Arc<Primary>) -> F) {
        let switched = self.shared.switched.notified();
        let mut switched = std::pin::pin!(switched);
        switched.as_mut().enable();
        tokio::select! {
            () = wait(self.shared.current()) => {}
            () = switched => {}
        }
    }
}

/// Sync mode, after `sync` took the lock: `WAIT` for the replicas; when
/// fewer than asked acknowledge it, release it and say so.
async fn replicated(
    primary: &Primary,
    sync: &RedisBackend,
    (replicas, timeout): (u32, Duration),
    lock_key: &str,
    holder: &str,
    fair: bool,
) -> Result<(), BackendError> {
    let acked = sync.wait_for_replicas(replicas, timeout).await;
    if matches!(acked, Ok(n) if n >= replicas) {
        return Ok(());
    }
    let hold = Holding {
        lock_key,
        holder,
        fair,
    };
    let released = primary.backend.release(hold).await;
    let acked = match acked {
        Ok(n) => format!("only {n} of {replicas} replicas acknowledged it within {timeout:?}"),
        Err(e) => format!("waiting for {replicas} replicas failed ({e})"),
    };
    let outcome = if released.is_ok() {
        "it was released again"
    } else {
        "releasing it failed too: its lease frees it"
    };
    Err(BackendError::replica_sync(format!(
        "replication sync failed for lock `{lock_key}` on Redis at {}: {acked}, so a \
         failover could lose it; {outcome}. Check the replicas (INFO replication), or \
         lower or drop sync_replicas",
        primary.address
    )))
}
