//! The background releaser: the nodes of dropped guards, cancelled
//! acquires and unused places, one transaction per session, and any that
//! fails in it (or must go alone) one by one, retrying while the session
//! lives.
//!
//! Owns the retries and the pending count of background releases; a
//! node's delete itself is `release.rs`'s.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use super::sessions::Session;
use super::{path, Inner, MULTI_OPS, RELEASE_ATTEMPTS};
use crate::backend::releases::{PendingReleases, ReleaseJob};

/// How often a background release is tried in all.
const RELEASE_ATTEMPTS_MAX: u32 = 600;

/// Deletes the nodes of dropped guards, cancelled acquires and unused
/// places: those of a session in one transaction (one commit for many, as
/// a dropped batch of guards needs), and any that fails in it one by one,
/// retrying: a node left standing would block its lock for as long as our
/// session lives.
pub(super) async fn releaser(
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

/// Starts [`releaser`] on the runtime for `inner`'s background releases
/// (`jobs`), counted where `inner` counts its pending releases; it holds
/// the backend weakly, so it ends with it.
pub(super) fn spawn_releaser(inner: &Arc<Inner>, jobs: mpsc::UnboundedReceiver<ReleaseJob>) {
    let pending = inner.releases.pending().clone();
    tokio::spawn(releaser(Arc::downgrade(inner), jobs, pending));
}

impl Inner {
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
                let servers = format!("ZooKeeper at {}", backend.sessions.shown());
                backend.release_outage.answered(&servers);
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
                if attempt == RELEASE_ATTEMPTS {
                    let servers = format!("ZooKeeper at {}", backend.sessions.shown());
                    backend.release_outage.failing(&servers, &error, &lock);
                    pending.unblock(&lock);
                    blocking = false;
                }
                drop(backend);
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
