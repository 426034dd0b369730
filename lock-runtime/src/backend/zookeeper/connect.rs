//! Connecting: the key prefix checked, the sessions started (learning the
//! longest session timeout the servers grant), the default lease's
//! session opened, one answer, and the background releaser started; and
//! the refusal of a lease longer than any session.
//!
//! Owns the building of `Inner`; sends no lock's nodes.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::lock_path;
use super::releaser::spawn_releaser;
use super::sessions::Sessions;
use super::{path, wait, Inner, ZookeeperBackend, ZookeeperConfig};
use crate::backend::place_tasks::PlaceWatches;
use crate::backend::releases::{ReleaseQueue, RetriedOutage};
use crate::backend::{ConnectSettings, Wakeups, Watches};
use crate::error::LockError;

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
    // Known only now that the servers said their limit: the default lease
    // is refused at start, naming where it was set, not at the first call.
    if let Some(refused) = refuse_lease(&sessions, config.default_lease, Lease::Default) {
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
        fixed_ends: Mutex::default(),
        release_outage: RetriedOutage::default(),
        releases,
        wakeups,
        timeout: settings.response_timeout,
        handle: tokio::runtime::Handle::current(),
    });
    let backend = ZookeeperBackend { inner };
    backend.ping().await?;
    spawn_releaser(&backend.inner, jobs);
    let watches = PlaceWatches::of(&backend.inner);
    Ok((backend, watches))
}

/// Which lease a refusal is about: the words for it, and where it is set.
#[derive(Clone, Copy)]
enum Lease<'a> {
    /// The runtime's default, for every lock that sets none.
    Default,
    /// The lease of a lock of this key (`lease = "…"`, `LockRequest::lease`),
    /// refused at its first acquire: only then is it known.
    OfLock(&'a str),
}

/// The refusal of a lease longer than any session the servers grant.
fn refuse_lease(sessions: &Sessions, lease: Duration, which: Lease) -> Option<LockError> {
    let (what, fix) = match which {
        Lease::Default => (
            "the default lease".to_owned(),
            "set LOCK_LEASE (init_from_env) or the builder's default_lease to",
        ),
        Lease::OfLock(key) => (format!("the lease of key {key:?}"), "use a lease of"),
    };
    (lease > sessions.longest).then(|| {
        LockError::InvalidConfig(format!(
            "{what} of {lease:?} is longer than the longest ZooKeeper session timeout the \
             servers at {} grant ({:?}, their maxSessionTimeout): a holder's node could \
             vanish while it still counts on its lease; {fix} at most {:?}, or raise \
             maxSessionTimeout",
            sessions.shown(),
            sessions.longest,
            sessions.longest
        ))
    })
}

impl ZookeeperBackend {
    /// Why a lock of `key` (at `lock`) with `lease` cannot be taken here:
    /// a key that makes no ZooKeeper path, or a lease longer than any
    /// session the servers grant.
    pub(crate) fn refuses(&self, key: &str, lock: &str, lease: Duration) -> Option<LockError> {
        if let Err(refused) = path::check_key(key, lock) {
            return Some(refused);
        }
        refuse_lease(&self.inner.sessions, lease, Lease::OfLock(key))
    }
}
