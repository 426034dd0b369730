//! The etcd leases a runtime's keys are attached to: one per lease length
//! (in whole seconds), kept alive by one keep-alive per tick for all the
//! keys on it, never a stream per lock.
//!
//! A hold's client-side validity is counted from when its acquire or
//! renewal was sent, plus the lock's lease; the key itself lives until its
//! etcd lease runs out: the send time of the last answered keep-alive plus
//! the TTL. So an etcd lease is granted with a TTL of one and a half lock
//! leases (rounded up to whole seconds, at least the server's minimum), and
//! kept alive every quarter TTL: a full lock lease is then always ahead of
//! every key, and a key is never counted valid past its etcd lease. Every
//! step that counts a lease from now (an acquire, a renewal, a handoff)
//! checks that first ([`Leases::ahead`]), and sends a keep-alive itself
//! when the keeper's have not kept up.
//!
//! The price: a holder that dies frees its locks when the etcd lease runs
//! out, up to 1.5 leases after its last keep-alive (Redis: one lease).
//!
//! Owns the etcd leases and their keep-alives; writes no key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use etcd_client::{LeaseClient, LeaseKeepAliveStream, LeaseKeeper};
use tokio::time::Instant;

use super::super::Wakeups;
use crate::error::BackendError;

/// One etcd lease of this runtime.
#[derive(Debug)]
pub(super) struct Lease {
    /// The lease id in etcd.
    pub(super) id: i64,
    /// TTL the server granted.
    ttl: Duration,
    /// The TTL asked for, in seconds: its place in [`Leases`].
    asked: u64,
    /// Until when the server surely keeps it: the send time of the last
    /// answered keep-alive (or the grant) plus the TTL.
    until: Mutex<Instant>,
    /// The keep-alive stream (one request and one answer at a time).
    stream: tokio::sync::Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
    /// When the last keep-alive was sent.
    last_sent: Mutex<Instant>,
}

impl Lease {
    /// The TTL it was asked with, in seconds (see [`ttl_secs`]).
    pub(super) fn ttl_secs(&self) -> u64 {
        self.asked
    }

    fn until(&self) -> Instant {
        *self.until.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn confirmed(&self, sent: Instant) {
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        *until = (*until).max(sent + self.ttl);
    }
}

/// Why a keep-alive did not confirm a lease.
#[derive(Debug)]
pub(super) enum Kept {
    /// The server does not know the lease any more: every key on it is gone.
    Gone,
    /// No answer (or an error): unknown.
    Failed(BackendError),
}

/// The runtime's leases, by TTL in seconds.
pub(super) struct Leases {
    client: LeaseClient,
    by_ttl: Mutex<HashMap<u64, Arc<Lease>>>,
    /// Serialises grants, so that two first acquires with one TTL make one
    /// lease.
    granting: tokio::sync::Mutex<()>,
    timeout: Duration,
    /// Told when a lease is lost (as a lost connection: the watchdog then
    /// renews every hold at once, and finds those on it lost).
    wakeups: Weak<dyn Wakeups>,
    /// Where the keepers run.
    handle: tokio::runtime::Handle,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("by_ttl", &self.by_ttl)
            .finish_non_exhaustive()
    }
}

/// The etcd lease TTL for a lock lease: 1.5 x, whole seconds, at least 1.
pub(super) fn ttl_secs(lease: Duration) -> u64 {
    let wanted = lease.saturating_add(lease / 2);
    let secs = wanted
        .as_secs()
        .saturating_add(u64::from(wanted.subsec_nanos() > 0));
    secs.max(1)
}

impl Leases {
    pub(super) fn new(
        client: LeaseClient,
        timeout: Duration,
        wakeups: Weak<dyn Wakeups>,
        handle: tokio::runtime::Handle,
    ) -> Self {
        Leases {
            client,
            wakeups,
            handle,
            by_ttl: Mutex::new(HashMap::new()),
            granting: tokio::sync::Mutex::new(()),
            timeout,
        }
    }

    fn by_ttl(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Lease>>> {
        self.by_ttl.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every lease in use.
    pub(super) fn all(&self) -> Vec<Arc<Lease>> {
        self.by_ttl().values().cloned().collect()
    }

    /// The lease for locks of `lease`, granted now if there is none, and
    /// confirmed to last at least `lease` past now (a keep-alive is sent
    /// first if the keeper's have not kept it so).
    pub(super) async fn ahead(
        self: &Arc<Self>,
        lease: Duration,
    ) -> Result<Arc<Lease>, BackendError> {
        let ttl = ttl_secs(lease);
        let current = self.by_ttl().get(&ttl).cloned();
        let current = match current {
            Some(current) => current,
            None => self.grant(ttl).await?,
        };
        if current.until() > Instant::now() + lease {
            return Ok(current);
        }
        match self.keep_alive(&current).await {
            Ok(()) if current.until() > Instant::now() + lease => Ok(current),
            Ok(()) => Err(BackendError::msg(
                "etcd keep-alive answered too late for a full lease",
            )),
            Err(Kept::Gone) => {
                self.forget(&current);
                self.grant(ttl).await
            }
            Err(Kept::Failed(error)) => Err(error),
        }
    }

    /// A lease of its own for a fixed-lease hold (`watchdog(false)`): its
    /// TTL is the lock's lease rounded up to whole seconds (at least the
    /// server's minimum), and nobody keeps it alive, so the key ends with
    /// it. Returns its id.
    pub(super) async fn fixed(&self, lease: Duration) -> Result<i64, BackendError> {
        let secs = lease
            .as_secs()
            .saturating_add(u64::from(lease.subsec_nanos() > 0));
        let ttl = i64::try_from(secs.max(1)).unwrap_or(i64::MAX);
        let mut client = self.client.clone();
        let granted = tokio::time::timeout(self.timeout, client.grant(ttl, None))
            .await
            .map_err(|_| BackendError::msg("etcd lease grant: no answer in time"))?
            .map_err(|e| BackendError::new("etcd lease grant", e))?;
        Ok(granted.id())
    }

    /// Whether `lease` (by id) is confirmed until at least `at`.
    pub(super) fn confirmed_until(&self, id: i64, at: Instant) -> bool {
        self.by_ttl()
            .values()
            .any(|l| l.id == id && l.until() >= at)
    }

    /// Drops `lease` (the server lost it): the next acquire grants another.
    pub(super) fn forget(&self, lease: &Lease) {
        let mut by_ttl = self.by_ttl();
        let before = by_ttl.len();
        by_ttl.retain(|_, l| l.id != lease.id);
        let dropped = by_ttl.len() < before;
        drop(by_ttl);
        if dropped {
            if let Some(wakeups) = self.wakeups.upgrade() {
                wakeups.connection_lost();
            }
        }
    }

    async fn grant(self: &Arc<Self>, ttl: u64) -> Result<Arc<Lease>, BackendError> {
        let _one = self.granting.lock().await;
        if let Some(current) = self.by_ttl().get(&ttl).cloned() {
            return Ok(current);
        }
        let sent = Instant::now();
        let mut client = self.client.clone();
        let ttl_i = i64::try_from(ttl).unwrap_or(i64::MAX);
        let granted = tokio::time::timeout(self.timeout, client.grant(ttl_i, None))
            .await
            .map_err(|_| BackendError::msg("etcd lease grant: no answer in time"))?
            .map_err(|e| BackendError::new("etcd lease grant", e))?;
        let granted_ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
        let lease = Arc::new(Lease {
            id: granted.id(),
            ttl: granted_ttl,
            asked: ttl,
            until: Mutex::new(sent + granted_ttl),
            stream: tokio::sync::Mutex::new(None),
            last_sent: Mutex::new(sent),
        });
        self.by_ttl().insert(ttl, lease.clone());
        self.handle
            .spawn(keeper(Arc::downgrade(self), Arc::downgrade(&lease)));
        Ok(lease)
    }

    /// One keep-alive of `lease`; a lease the server lost is forgotten.
    pub(super) async fn keep_alive_or_forget(&self, lease: &Lease) {
        if let Err(Kept::Gone) = self.keep_alive(lease).await {
            self.forget(lease);
        }
    }

    /// One keep-alive of `lease`, answered: its confirmation moves on.
    pub(super) async fn keep_alive(&self, lease: &Lease) -> Result<(), Kept> {
        let mut held = lease.stream.lock().await;
        // Taken out while a request is out, and put back only after its
        // answer was read: a caller cancelled between the two drops the
        // stream, so no later keep-alive reads this one's answer as its own.
        let mut stream = held.take();
        let sent = Instant::now();
        *lease
            .last_sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = sent;
        let answered = tokio::time::timeout(self.timeout, async {
            match stream.as_mut() {
                // The stream's first request is a keep-alive, answered here.
                None => {
                    let mut client = self.client.clone();
                    let (keeper, messages) = client.keep_alive(lease.id).await.map_err(|e| {
                        if e.to_string().contains("lease not found") {
                            Kept::Gone
                        } else {
                            Kept::Failed(BackendError::new("etcd lease keep-alive", e))
                        }
                    })?;
                    stream = Some((keeper, messages));
                    Ok(())
                }
                Some((keeper, messages)) => {
                    keeper
                        .keep_alive()
                        .await
                        .map_err(|e| Kept::Failed(BackendError::new("etcd lease keep-alive", e)))?;
                    match messages.message().await {
                        Ok(Some(answer)) if answer.ttl() > 0 => Ok(()),
                        Ok(Some(_)) => Err(Kept::Gone),
                        Ok(None) => Err(Kept::Failed(BackendError::msg(
                            "etcd lease keep-alive: the stream ended",
                        ))),
                        Err(e) => Err(Kept::Failed(BackendError::new("etcd lease keep-alive", e))),
                    }
                }
            }
        })
        .await;
        match answered {
            Ok(Ok(())) => {
                lease.confirmed(sent);
                *held = stream;
                Ok(())
            }
            // A stream that failed is not read again (dropped here): its
            // next answer could be an old one.
            Ok(Err(kept)) => Err(kept),
            Err(_) => Err(Kept::Failed(BackendError::msg(
                "etcd lease keep-alive: no answer in time",
            ))),
        }
    }
}

/// Keeps one lease alive while the runtime lives: a keep-alive whenever a
/// quarter TTL passed since the last one sent (renewals send theirs too).
async fn keeper(leases: Weak<Leases>, lease: Weak<Lease>) {
    loop {
        let next = {
            let Some(lease) = lease.upgrade() else { return };
            let last = *lease
                .last_sent
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            last + (lease.ttl / 4).max(Duration::from_millis(100))
        };
        tokio::time::sleep_until(next).await;
        let (Some(leases), Some(lease)) = (leases.upgrade(), lease.upgrade()) else {
            return;
        };
        let due = *lease
            .last_sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            + (lease.ttl / 4).max(Duration::from_millis(100));
        if Instant::now() < due {
            continue;
        }
        match leases.keep_alive(&lease).await {
            Ok(()) => {}
            Err(Kept::Gone) => {
                tracing::warn!(
                    lease = lease.id,
                    "etcd lost this runtime's lease: the locks and queue places on it are gone"
                );
                leases.forget(&lease);
                return;
            }
            Err(Kept::Failed(error)) => {
                tracing::debug!(%error, "etcd keep-alive failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ttl_secs;
    use std::time::Duration;

    #[test]
    fn the_etcd_ttl_is_one_and_a_half_leases_in_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(100)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(500)), 1);
        assert_eq!(ttl_secs(Duration::from_secs(2)), 3);
        assert_eq!(ttl_secs(Duration::from_secs(30)), 45);
        assert_eq!(ttl_secs(Duration::from_millis(1_001)), 2);
        assert!(ttl_secs(Duration::MAX) > 0);
    }
}
