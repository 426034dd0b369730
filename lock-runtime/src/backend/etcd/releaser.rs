//! The background releaser: the deletes nobody awaits (dropped guards,
//! cancelled acquires, failed releases, unused places) and background
//! downgrades, in batches, each tried until etcd answers or refuses it.
//!
//! Owns the retries and the pending count of background releases; builds
//! no transaction of its own (`release.rs`, `downgrade.rs` do).

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use super::downgrade::downgrade_txn;
use super::{Inner, TXN_OPS};
use crate::backend::releases::{Job, Op, PendingReleases};
use crate::held::HeldLock;

/// After how many failed tries a background release is logged as a
/// warning (it goes on trying).
const RELEASE_ATTEMPTS: u32 = 5;

/// Deletes the keys of dropped guards, cancelled acquires, failed releases
/// and unused places, in transactions of many. Unlike on Redis, a key whose
/// delete fails does not end by itself (the runtime's lease is kept alive
/// for its other keys), so a batch is tried until etcd answers, backing
/// off, for as long as the runtime lives; an outage is logged once per
/// batch, not per try. (A delete refused for lack of a permission is given
/// up: see [`release_batch`].)
///
/// Downgrades of dropped guards come through here too, so that each is
/// sent before any release of its holder queued after it: a batch's
/// downgrades are answered (or time out, once: the hold then stays a
/// write hold, more exclusive) before its releases go out and before the
/// next batch is taken. A downgrade whose holder is released in the same
/// batch is not sent. (A release awaited by its caller does not queue: it
/// may overtake a queued downgrade, which then finds no key and changes
/// nothing, and its answer is ignored, see `Inner::superseded`.)
pub(super) async fn releaser(
    inner: Weak<Inner>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    pending: Arc<PendingReleases>,
) {
    // (A third of a transaction of holders: each has two keys, and may
    // bring its tombstone.)
    const BATCH: usize = TXN_OPS / 3;
    let mut batch = Vec::with_capacity(BATCH);
    while jobs.recv_many(&mut batch, BATCH).await > 0 {
        let batch = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
        let mut keys: Vec<(String, String)> = batch
            .iter()
            .filter(|job| matches!(job.op, Op::Release { .. }))
            .map(|job| (job.lock_key.clone(), job.holder.clone()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let downgrades: Vec<(&Job, &Weak<HeldLock>)> = batch
            .iter()
            .filter_map(|job| match &job.op {
                Op::Downgrade(held) => Some((job, held)),
                Op::Release { .. } => None,
            })
            .collect();
        if !downgrades.is_empty() {
            if let Some(backend) = inner.upgrade() {
                let sent = downgrades.iter().filter(|(job, _)| {
                    let id = (job.lock_key.clone(), job.holder.clone());
                    keys.binary_search(&id).is_err()
                });
                // (A hold gone here was released: nothing to downgrade.)
                let answered = sent
                    .filter_map(|(job, held)| Some((job, held, held.upgrade()?.fence())))
                    .map(|(job, held, token)| {
                        let backend = &backend;
                        async move {
                            let txn = downgrade_txn(&job.lock_key, &job.holder, token);
                            let answer = backend.txn(txn).await;
                            backend.downgrade_answered(job, held, answer.map(|a| a.succeeded()));
                        }
                    });
                futures_util::future::join_all(answered).await;
            }
            pending.done(downgrades.iter().map(|(job, _)| job.lock_key.as_str()));
        }
        if keys.is_empty() {
            continue;
        }
        // Each holder's keys with the lock names of its jobs (each counted
        // as pending).
        let jobs: Vec<((String, String), Vec<String>)> = keys
            .into_iter()
            .map(|key| {
                let of_key = batch.iter().filter(|job| {
                    matches!(job.op, Op::Release { .. })
                        && job.lock_key == key.0
                        && job.holder == key.1
                });
                let names = of_key.map(|job| job.lock_key.clone()).collect();
                (key, names)
            })
            .collect();
        tokio::spawn(release_batch(inner.clone(), jobs, pending.clone()));
    }
}

/// Starts [`releaser`] on the runtime for `inner`'s background releases
/// (`jobs`), counted where `inner` counts its pending releases; it holds
/// the backend weakly, so it ends with it.
pub(super) fn spawn_releaser(inner: &Arc<Inner>, jobs: mpsc::UnboundedReceiver<Job>) {
    let pending = inner.releases.pending().clone();
    tokio::spawn(releaser(Arc::downgrade(inner), jobs, pending));
}

/// How a background delete ended.
#[derive(Clone, Copy)]
enum Deleted {
    /// etcd answered (or the runtime is gone, and its lease with it).
    Answered,
    /// Refused for lack of a permission: it would be refused again.
    Refused,
}

/// Deletes the holders of `jobs` in one transaction, then marks their jobs
/// answered. A transaction refused for lack of a permission is tried again
/// holder by holder, so that one refused key does not keep the others: a
/// holder refused alone is given up (its put was most likely refused
/// too; a key it did put stays until this runtime's etcd lease ends).
async fn release_batch(
    inner: Weak<Inner>,
    jobs: Vec<((String, String), Vec<String>)>,
    pending: Arc<PendingReleases>,
) {
    let keys: Vec<(String, String)> = jobs.iter().map(|(key, _)| key.clone()).collect();
    let outcomes = match delete_until_answered(&inner, &keys).await {
        Deleted::Refused if keys.len() > 1 => {
            let alone = keys.chunks(1).map(|key| delete_until_answered(&inner, key));
            futures_util::future::join_all(alone).await
        }
        outcome => vec![outcome; keys.len()],
    };
    for ((_, names), outcome) in jobs.iter().zip(outcomes) {
        let names = names.iter().map(String::as_str);
        match outcome {
            Deleted::Answered => pending.done(names),
            Deleted::Refused => pending.given_up(names),
        }
    }
}

/// Deletes `keys` in one transaction, tried until etcd answers, backing
/// off, for as long as the runtime lives; an outage is logged once, not
/// per try.
async fn delete_until_answered(inner: &Weak<Inner>, keys: &[(String, String)]) -> Deleted {
    let mut backoff = Duration::from_millis(50);
    let mut tries = 0u32;
    loop {
        let Some(backend) = inner.upgrade() else {
            return Deleted::Answered; // the runtime is gone: so is its lease, soon
        };
        match backend.delete_keys(keys).await {
            Ok(_) => {
                backend
                    .release_outage
                    .answered(&format!("etcd at {}", backend.endpoints));
                return Deleted::Answered;
            }
            Err(error) if error.is_permission_denied() => {
                if let [(lock, _)] = keys {
                    tracing::warn!(
                        %error,
                        lock,
                        "background release refused for lack of a permission: given up"
                    );
                }
                return Deleted::Refused;
            }
            Err(error) => {
                tries += 1;
                if tries == RELEASE_ATTEMPTS {
                    let lock = keys.first().map_or("", |(lock, _)| lock.as_str());
                    let etcd = format!("etcd at {}", backend.endpoints);
                    backend.release_outage.failing(&etcd, &error, lock);
                } else {
                    tracing::debug!(%error, "background release failed; retrying");
                }
            }
        }
        drop(backend);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
