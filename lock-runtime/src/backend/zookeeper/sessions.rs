//! The ZooKeeper sessions of a runtime: one per session timeout, which
//! follows the lease of the locks on it.
//!
//! A contender's node is ephemeral: it lives as long as the session that
//! made it. The server expires a session once it has heard nothing from
//! its client for the session timeout, so a hold confirmed by a request
//! sent at `t` (an acquire, a renewal) keeps its node at least until
//! `t + session timeout`. The runtime counts a hold valid until `t +
//! lease`; that is safe only while the lease is at most the session
//! timeout, so a lease longer than the longest timeout the servers grant
//! (`maxSessionTimeout`, 20 ticks by default; probed once at start) is
//! refused. A lease below the shortest (`minSessionTimeout`, 2 ticks)
//! still excludes, but a holder that dies frees its locks only when its
//! session expires, after that minimum. Hence one session per timeout: a
//! runtime's locks of 1 s and of 30 s leases free about 1 s and 30 s after
//! their holder died, as on Redis, not both after 30 s.
//!
//! The timeout asked for is the lease and a quarter more ([`MARGIN`]): at
//! exactly the lease, the server could delete a cut-off holder's node (and
//! let the next one in) the moment the holder's own count ends, before its
//! timer has fired and its task has heard, which on a busy machine takes
//! tens of milliseconds and more (the nemesis saw a holder told 57 ms after
//! the next one entered).
//!
//! Disconnected means a watch event may be late: the waiters are told
//! (`connection_lost`), and retry. Expired is terminal for a client: every
//! node of the session is gone (the next renewal of its holds finds it and
//! marks them lost), the waiters are told, and a new session with the same
//! timeout replaces it.
//!
//! Owns the sessions and their clients; creates and deletes no lock node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::OnceCell;
use zookeeper_client::{Client, SessionState, StateWatcher};

use super::super::Wakeups;
use crate::error::BackendError;

/// The shortest session timeout asked for: the client's first connect
/// must fit in it (ZooKeeper's own minimum is 2 ticks, 4 s by default).
const FLOOR: Duration = Duration::from_millis(500);

/// What is asked to learn the servers' longest session timeout.
const PROBE: Duration = Duration::from_secs(24 * 3600);

/// The session outlives the client-side count of a hold by this part of
/// its lease (see the module docs).
const MARGIN: u32 = 4;

/// The session timeout asked for locks of `lease`: the lease and a
/// quarter more (the server may grant less, down to the lease itself,
/// when `maxSessionTimeout` is that close).
pub(super) fn asked(lease: Duration) -> Duration {
    (lease + lease / MARGIN).max(FLOOR)
}

/// One session and its current client (replaced after an expiry).
pub(super) struct Session {
    /// The timeout the server granted.
    pub(super) timeout: Duration,
    client: Mutex<Client>,
}

impl Session {
    /// The session's client now (cheap: a handle).
    pub(super) fn client(&self) -> Client {
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The id of the session now (a new one after an expiry).
    pub(super) fn id(&self) -> i64 {
        self.client().session_id().0
    }
}

/// How to reach the servers, and the sessions opened so far.
pub(super) struct Sessions {
    connect: String,
    auth: Option<Vec<u8>>,
    connect_timeout: Duration,
    /// The longest session timeout the servers grant.
    pub(super) longest: Duration,
    by_timeout: Mutex<HashMap<u128, Arc<OnceCell<Arc<Session>>>>>,
    wakeups: Weak<dyn Wakeups>,
    handle: tokio::runtime::Handle,
}

impl Sessions {
    /// Reaches the servers once (a session asking for a day, which learns
    /// the longest timeout they grant, and is closed again).
    pub(super) async fn start(
        connect: String,
        auth: Option<Vec<u8>>,
        connect_timeout: Duration,
        wakeups: Weak<dyn Wakeups>,
    ) -> Result<Arc<Sessions>, BackendError> {
        let mut sessions = Sessions {
            connect,
            auth,
            connect_timeout,
            longest: PROBE,
            by_timeout: Mutex::default(),
            wakeups,
            handle: tokio::runtime::Handle::current(),
        };
        let probe = sessions.open_client(PROBE).await?;
        sessions.longest = probe.session_timeout();
        drop(probe);
        Ok(Arc::new(sessions))
    }

    /// `host:port,...` (no credentials), for messages.
    pub(super) fn shown(&self) -> &str {
        &self.connect
    }

    /// A new client (and session) asking for `timeout`, within the connect
    /// timeout.
    async fn open_client(&self, timeout: Duration) -> Result<Client, BackendError> {
        let mut connector = Client::connector().with_session_timeout(timeout);
        if let Some(auth) = &self.auth {
            connector = connector.with_auth("digest", auth);
        }
        let connect = self.connect.clone();
        // Spawned: the client spawns its session task on the current
        // runtime, which must be the runtime's own, whoever polls us.
        let opening = self
            .handle
            .spawn(async move { connector.connect(&connect).await });
        let unreachable = |why: String| {
            BackendError::msg(format!(
                "cannot open a ZooKeeper session at {} within the connect timeout ({:?}): {why}",
                self.connect, self.connect_timeout
            ))
        };
        match tokio::time::timeout(self.connect_timeout, opening).await {
            Ok(Ok(Ok(client))) => Ok(client),
            Ok(Ok(Err(error))) => Err(unreachable(error.to_string())),
            Ok(Err(_)) => Err(unreachable("the connecting task stopped".to_owned())),
            Err(_) => Err(unreachable("no answer".to_owned())),
        }
    }

    /// The session for locks of `lease`, opened on first use.
    pub(super) async fn for_lease(
        self: &Arc<Self>,
        lease: Duration,
    ) -> Result<Arc<Session>, BackendError> {
        let asked = asked(lease);
        let cell = self
            .by_timeout
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(asked.as_millis())
            .or_default()
            .clone();
        cell.get_or_try_init(|| self.open(asked)).await.cloned()
    }

    async fn open(self: &Arc<Self>, asked: Duration) -> Result<Arc<Session>, BackendError> {
        let client = self.open_client(asked).await?;
        let states = client.state_watcher();
        let session = Arc::new(Session {
            timeout: client.session_timeout(),
            client: Mutex::new(client),
        });
        self.handle.spawn(follow(
            Arc::downgrade(self),
            Arc::downgrade(&session),
            states,
            asked,
        ));
        Ok(session)
    }

    fn connection_lost(&self) {
        if let Some(wakeups) = self.wakeups.upgrade() {
            wakeups.connection_lost();
        }
    }
}

/// Follows one session's state: tells the waiters of a lost connection,
/// and replaces an expired session's client with a new session.
async fn follow(
    sessions: Weak<Sessions>,
    session: Weak<Session>,
    mut states: StateWatcher,
    asked: Duration,
) {
    loop {
        let state = states.changed().await;
        let Some(all) = sessions.upgrade() else {
            return;
        };
        tracing::debug!(?state, timeout = ?asked, "ZooKeeper session state");
        match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => continue,
            SessionState::Disconnected => {
                all.connection_lost();
                continue;
            }
            SessionState::Expired | SessionState::AuthFailed | SessionState::Closed => {}
        }
        tracing::warn!(
            servers = %all.shown(),
            ?state,
            "ZooKeeper session ended: its locks are lost; opening a new session"
        );
        all.connection_lost();
        drop(all);
        let mut backoff = Duration::from_millis(50);
        loop {
            let Some(all) = sessions.upgrade() else {
                return;
            };
            let Some(current) = session.upgrade() else {
                return;
            };
            match all.open_client(asked).await {
                Ok(client) => {
                    states = client.state_watcher();
                    *current
                        .client
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = client;
                    // News sent to the old session is gone with it.
                    all.connection_lost();
                    break;
                }
                Err(error) => {
                    tracing::debug!(%error, "a new ZooKeeper session failed; retrying");
                    drop((all, current));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}
