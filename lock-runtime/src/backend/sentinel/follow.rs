//! Following the primary of a Sentinel service across failovers.
//!
//! Any failed call, and any disconnection the connection manager reports,
//! makes the *monitor* task (one per runtime,
//! on the runtime's thread) ask the sentinels again: a bounded series of
//! attempts, backing off from 50 ms to 250 ms, until a node answers `ROLE`
//! master. That covers a primary that died (its old address refuses, the
//! sentinels promote a replica) and one that came back as a replica (its
//! writes answer `READONLY`, the sentinels name another node). A primary
//! replaced while it still answers (a forced failover, a partition between
//! it and the sentinels) fails nothing until a sentinel demotes it, up to
//! ten seconds later: `events.rs` listens to the sentinels' `+switch-master`
//! so that the move starts when they announce it (an announcement also cuts
//! short a round stuck on a frozen node's timeouts).
//!
//! When the primary moved, a new backend is connected, every lock the
//! waiters watch is watched again on it, it replaces the old one, and every
//! waiter is woken ([`Wakeups::connection_lost`]): a release may have gone
//! unheard. Calls still in flight to the old node are sent again to the
//! new one at once (a dead node can take seconds to refuse, while its
//! connection manager retries), waits for its background releases to
//! settle end, and the background releases sent to it in the last minute
//! are queued again on the new primary (dropped guards, fair places given
//! back: the old node may not have applied or replicated them, and a
//! release id is unique, so one that did arrive does no harm). The old
//! backend is dropped, which ends its subscription task and its releaser
//! and closes its connections. Meanwhile calls fail with
//! backend errors, which waiters and the watchdog already ride out (backoff
//! until their deadline; a held lock is lost only at its client-side lease
//! end).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::{resolve, NodeAuth, Primary, Shared, RESEND_WINDOW};
use crate::backend::redis as single;
use crate::backend::{ConnectSettings, Wakeups};
use crate::error::LockError;

/// Attempts of one round of finding the primary after a failure; a later
/// failure starts another round.
const FOLLOW_ATTEMPTS: u32 = 80;
/// Pause between those attempts: doubling from the first to the second.
const FOLLOW_PAUSE: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(250));

/// Passes the single-server backend's news on to the waiters, and makes a
/// lost connection a reason to look for the primary.
pub(super) struct Relay {
    waiters: Weak<dyn Wakeups>,
    suspect: Arc<Notify>,
}

impl Wakeups for Relay {
    fn released(&self, lock: &str) {
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.released(lock);
        }
    }

    fn handed_over(&self, lock: &str, holder: &str, fence: u64, upto: u64) {
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.handed_over(lock, holder, fence, upto);
        }
    }

    fn connection_lost(&self) {
        self.suspect.notify_one();
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.connection_lost();
        }
    }
}

/// Connects the single-server backend (and the sync connection) to the
/// primary at `address`.
pub(super) async fn open_primary(
    address: String,
    auth: &NodeAuth,
    sync: Option<(u32, Duration)>,
    settings: &ConnectSettings,
    wakeups: &Weak<dyn Wakeups>,
    suspect: &Arc<Notify>,
) -> Result<Primary, LockError> {
    let url = auth.url(&address);
    let relay = Arc::new(Relay {
        waiters: wakeups.clone(),
        suspect: suspect.clone(),
    });
    let to_relay = Arc::downgrade(&relay) as Weak<dyn Wakeups>;
    let (backend, watches) = single::connect(&url, settings, to_relay).await?;
    let sync = match sync {
        Some((_, timeout)) => {
            let mut settings = settings.clone();
            settings.response_timeout = settings.response_timeout.saturating_add(timeout);
            // Nothing is subscribed on it, so it has no news to pass on.
            let silent = Weak::<Relay>::new() as Weak<dyn Wakeups>;
            Some(single::connect(&url, &settings, silent).await?.0)
        }
        None => None,
    };
    Ok(Primary {
        address,
        backend,
        watches,
        sync,
        _relay: relay,
        recent: Mutex::new(VecDeque::new()),
    })
}

/// The monitor: one round of [`Shared::follow`] per burst of failures or
/// announcement, until the backend is gone.
pub(super) async fn monitor(shared: Weak<Shared>, suspect: Arc<Notify>) {
    loop {
        suspect.notified().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.follow().await;
    }
}

impl Shared {
    /// A sentinel announced a new primary: the monitor moves there.
    pub(super) fn moved(&self, address: String) {
        *self
            .announced
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(address);
        self.news.notify_waiters();
        self.suspect.notify_one();
    }

    /// Looks for the primary until a node answers `ROLE` master (first the
    /// one a sentinel announced, if any: the old primary may still answer
    /// as one); moves to it when it is not the current one. Bounded:
    /// [`FOLLOW_ATTEMPTS`].
    async fn follow(&self) {
        let mut pause = FOLLOW_PAUSE.0;
        let mut last = None;
        let mut announced = None;
        for _ in 0..FOLLOW_ATTEMPTS {
            // An announcement during a slow attempt (a frozen node answers
            // nothing until the timeouts) cuts it short.
            let news = self.news.notified();
            let mut news = std::pin::pin!(news);
            news.as_mut().enable();
            let latest = self
                .announced
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            announced = latest.or(announced);
            let found = match &announced {
                Some(address)
                    if resolve::is_master(address, &self.auth, &self.settings).await
                        == Ok(true) =>
                {
                    Ok(address.clone())
                }
                _ => tokio::select! {
                    found = resolve::primary(
                        &self.sentinels, &self.service, &self.auth, &self.settings
                    ) => found,
                    () = news => continue,
                },
            };
            match found {
                // The same node is still the primary: its connection manager
                // reconnects by itself.
                Ok(address) if address == self.current().address => return,
                Ok(address) => match self.move_to(address).await {
                    Ok(()) => return,
                    Err(e) => last = Some(e.to_string()),
                },
                Err(e) => last = Some(e.to_string()),
            }
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2).min(FOLLOW_PAUSE.1);
        }
        tracing::warn!(
            service = %self.service,
            error = last.as_deref().unwrap_or(""),
            "Redis Sentinel: no primary found yet; looking again at the next failure"
        );
    }

    /// Connects to the new primary, moves every watch there, makes it
    /// current, and wakes every waiter.
    async fn move_to(&self, address: String) -> Result<(), LockError> {
        let primary = open_primary(
            address,
            &self.auth,
            self.sync,
            &self.settings,
            &self.wakeups,
            &self.suspect,
        )
        .await?;
        let primary = Arc::new(primary);
        let old = {
            let mut watched = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
            watched.retain(|_, w| !w.is_closed());
            for (lock, w) in watched.iter() {
                primary.watches.watch(lock, w.clone());
            }
            let mut current = self.primary.write().unwrap_or_else(PoisonError::into_inner);
            std::mem::replace(&mut *current, primary.clone())
        };
        // (After the switch: a shutdown that began meanwhile records on the
        // new primary itself, or is seen here.)
        if self.recording.load(Ordering::SeqCst) {
            primary.backend.pending().record_given_up();
        }
        tracing::warn!(
            service = %self.service,
            from = %old.address,
            to = %primary.address,
            "Redis Sentinel: the primary moved; following it"
        );
        // The old primary's recent background releases, again: it may not
        // have applied or replicated them. (Holder ids are unique: a release
        // that did reach the new primary finds nothing, and one that did not
        // frees what its holder gave up.)
        let window = Instant::now().checked_sub(RESEND_WINDOW);
        for (at, lock_key, holder, fair) in old.take_recent() {
            if window.is_none_or(|w| at >= w) {
                primary.release_in_background(lock_key, holder, fair);
            }
        }
        drop(old);
        self.switched.notify_waiters();
        if let Some(waiters) = self.wakeups.upgrade() {
            waiters.connection_lost();
        }
        Ok(())
    }
}
