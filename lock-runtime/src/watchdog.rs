//! The watchdog: one task per runtime that keeps held leases alive.
//!
//! Every held lock is registered here. A renewable lock is renewed every
//! `lease / 3`; locks that fall due close together (within `lease / 6`) are
//! renewed together, in pipelined batches of up to [`BATCH`] (one round trip
//! per batch), so ten thousand held locks cost a handful of round trips per
//! tick. A lock whose renewal finds it gone, or that could not be renewed
//! before its lease ran out (Redis unreachable), is marked lost, which wakes
//! its holder. A fixed-lease lock (`watchdog(false)`) is never renewed and is
//! marked lost when its lease runs out.
//!
//! A lock leaves the watchdog before its release is sent. A renewal already in
//! flight cannot resurrect it either: the renew script only touches a lock
//! whose hash still records our holder id.
//!
//! Renewal batches run as tasks of their own, so a batch stuck on a stalled
//! connection never delays the lost check: every hold is declared lost at its
//! own client-side lease end (`valid_until`), whatever request is in flight,
//! for locks in that batch and in any other.
//!
//! The client-side lease end is the send time of the hold's last
//! confirmation plus its lease, less a margin ([`lease_end`]): the server
//! counts the same lease from when it received that request, no earlier,
//! but the timer that tells the holder fires late on a busy machine (the
//! nemesis saw a holder told 9 ms after a fixed 800 ms lease ran out on
//! Redis, and another process entered in between). The margin keeps the
//! tell ahead of the server by that much.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::backend::{Backend, Heartbeats, PlaceRefresh, Published, QUEUE_ENTRY_LIFE};
use crate::held::HeldLock;
use crate::meter;
use crate::who::{self, Identity};

/// Most renewals sent in one pipelined round trip.
pub(crate) const BATCH: usize = 1000;

/// The client-side lease end of a hold whose lease `lease` a request sent
/// at `sent_at` confirmed: a margin ahead of the server's own end at the
/// earliest, `lease / 50 + 10 ms` (18 ms of an 800 ms lease, 610 ms of
/// 30 s), at most a quarter of the lease.
pub(crate) fn lease_end(sent_at: Instant, lease: Duration) -> Instant {
    let margin = (lease / 50 + Duration::from_millis(10)).min(lease / 4);
    sent_at + (lease - margin)
}

/// Longest sleep of the watchdog task, busy or idle.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Pause between renewal attempts while the backend fails.
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Entry {
    lock: Arc<HeldLock>,
    /// When to renew (or, fixed lease: when to declare it lost).
    due: Instant,
    /// Until when the backend surely still has it: the send time of the last
    /// successful renewal (or the acquire) plus the lease.
    valid_until: Instant,
    in_flight: bool,
}

/// The watched locks, and when the task plans to wake next (`None`: not
/// planned). Under one mutex, so a lock added while the task plans its sleep
/// is either seen by the plan or sees the plan and wakes the task.
#[derive(Debug, Default)]
struct Entries {
    map: HashMap<u64, Entry>,
    planned: Option<Instant>,
}

/// The shared state between lock holders and the watchdog task.
#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    entries: Mutex<Entries>,
    changed: Notify,
    ticks: std::sync::atomic::AtomicU64,
    round_trips: std::sync::atomic::AtomicU64,
    lost: std::sync::atomic::AtomicU64,
}

/// Renewal counters, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchdogStats {
    /// Locks the watchdog watches now.
    pub tracked: usize,
    /// Ticks that renewed at least one lock.
    pub ticks: u64,
    /// Renewal round trips (pipelined batches) sent so far.
    pub round_trips: u64,
    /// Locks found lost so far.
    pub lost: u64,
}

impl Watchdog {
    /// Starts watching `lock`, whose backend lease is at least `in_force`
    /// from `sent_at` (its own lease, or a handoff's shorter claim: the first
    /// renewal then sets the full lease).
    pub(crate) fn add(&self, lock: Arc<HeldLock>, sent_at: Instant, in_force: Duration) {
        let valid_until = lease_end(sent_at, in_force);
        // A handoff's claim may be longer than this holder's own lease (a
        // sibling asked for it): renew early enough for either.
        let due = if lock.renew {
            sent_at + in_force.min(lock.lease) / 3
        } else {
            valid_until
        };
        lock.set_valid_until(valid_until);
        tracing::debug!(
            key = %lock.key, fence = lock.fence(),
            valid_ms = valid_until.saturating_duration_since(Instant::now()).as_millis(),
            "lock watched"
        );
        let entry = Entry {
            lock,
            due,
            valid_until,
            in_flight: false,
        };
        let wake = entry.due.min(entry.valid_until);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.map.insert(entry.lock.id, entry);
        let planned = entries.planned;
        drop(entries);
        if planned.is_none_or(|p| wake < p) {
            self.changed.notify_one();
        }
    }

    /// Renews the lock `id` at the next tick: a hold the backend confirmed
    /// only before a lost connection, about to be entered (`gate.rs`).
    pub(crate) fn renew_now(&self, id: u64) {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = entries.map.get_mut(&id) {
            entry.due = entry.due.min(now);
        }
        drop(entries);
        self.changed.notify_one();
    }

    /// Stops watching the lock `id` (it is about to be released).
    pub(crate) fn remove(&self, id: u64) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let removed = entries.map.remove(&id);
        drop(entries);
        // Released past its lease end (its holder saw `is_lost` first): it
        // was lost all the same, and counts so.
        if let Some(entry) = removed {
            if Instant::now() >= entry.valid_until {
                self.declare_lost(&entry.lock);
            }
        }
    }

    /// A connection was lost: every hold is renewed at the next tick, so
    /// that it is confirmed in the new connection epoch (and may be entered
    /// and passed again without a round trip), or found lost, as soon as the
    /// backend answers, rather than at its usual renewal time.
    fn renew_all_now(&self, now: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        for entry in entries.map.values_mut() {
            if entry.lock.renew {
                entry.due = entry.due.min(now);
            }
        }
    }

    /// Current counters.
    pub(crate) fn stats(&self) -> WatchdogStats {
        use std::sync::atomic::Ordering::Relaxed;
        WatchdogStats {
            tracked: self
                .entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .map
                .len(),
            ticks: self.ticks.load(Relaxed),
            round_trips: self.round_trips.load(Relaxed),
            lost: self.lost.load(Relaxed),
        }
    }

    /// Marks lost what can no longer be valid, and takes out what to renew now.
    fn collect_due(&self, now: Instant) -> (Vec<Arc<HeldLock>>, Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut due = Vec::new();
        let mut lost = Vec::new();
        for (id, entry) in entries.map.iter_mut() {
            // Also while a renewal is in flight: its answer may never come
            // in time, and the lease does not wait for it.
            if now >= entry.valid_until {
                lost.push(*id);
            } else if entry.in_flight {
                continue;
            } else if entry.lock.renew && entry.due <= now + entry.lock.lease / 6 {
                entry.in_flight = true;
                due.push(entry.lock.clone());
            }
        }
        for id in lost {
            if let Some(entry) = entries.map.remove(&id) {
                self.declare_lost(&entry.lock);
            }
        }
        let next = entries
            .map
            .values()
            .map(|e| {
                if e.in_flight {
                    e.valid_until
                } else {
                    e.due.min(e.valid_until)
                }
            })
            .min();
        // The task never sleeps longer than IDLE_TICK, so a lock falling due
        // later than that needs no wake-up (no extra work per acquire); a
        // batch that settles wakes the task itself.
        let next = next.map_or(now + IDLE_TICK, |n| n.min(now + IDLE_TICK));
        entries.planned = Some(next);
        (due, next)
    }

    /// Applies the outcome of one batch sent at `sent_at`, in the backend's
    /// connection epoch `epoch`; `now_epoch` is the epoch now (a connection
    /// lost while the batch was out: its holds are renewed again at once,
    /// to be confirmed in the new epoch).
    fn settle(
        &self,
        batch: &[Arc<HeldLock>],
        outcome: &[Option<bool>],
        sent_at: Instant,
        (epoch, now_epoch): (u32, u32),
    ) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        for (lock, result) in batch.iter().zip(outcome) {
            let Some(entry) = entries.map.get_mut(&lock.id) else {
                continue; // released, or declared lost, meanwhile
            };
            entry.in_flight = false;
            tracing::debug!(
                key = %lock.key, fence = lock.fence(), ?result,
                sent_ms_ago = now.saturating_duration_since(sent_at).as_millis(),
                "lock renewal answered"
            );
            match result {
                // Renewed, but its lease end passed before the answer came:
                // the holder may have acted on that already; lost stays lost.
                Some(true) if now >= entry.valid_until => {
                    entries.map.remove(&lock.id);
                    self.declare_lost(lock);
                }
                Some(true) => {
                    entry.valid_until = lease_end(sent_at, lock.lease);
                    entry.due = if epoch == now_epoch {
                        sent_at + lock.lease / 3
                    } else {
                        now
                    };
                    lock.set_valid_until(entry.valid_until);
                    lock.confirm(epoch);
                }
                Some(false) => {
                    entries.map.remove(&lock.id);
                    self.declare_lost(lock);
                }
                None => {
                    // Unknown: retry soon, and give up at valid_until.
                    let retry = (lock.lease / 10).clamp(RETRY_MIN, RETRY_MAX);
                    entry.due = (now + retry).min(entry.valid_until);
                    if now >= entry.valid_until {
                        entries.map.remove(&lock.id);
                        self.declare_lost(lock);
                    }
                }
            }
        }
        drop(entries);
        // The task plans its sleeps from the entries: a retry may now be due
        // sooner than planned.
        self.changed.notify_one();
    }

    fn declare_lost(&self, lock: &HeldLock) {
        self.lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock.mark_lost();
    }

    /// Earliest `valid_until` among `batch`: a renewal must answer by then.
    fn deadline_of(&self, batch: &[Arc<HeldLock>]) -> Option<Instant> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        batch
            .iter()
            .filter_map(|l| entries.map.get(&l.id).map(|e| e.valid_until))
            .min()
    }
}

/// The watchdog task; ends when `stop` fires. Renewal batches run as tasks
/// of their own on the same thread (they end with the runtime's thread).
///
/// The same tick refreshes the fair-queue places of this process's waiters
/// (`heartbeats`), in batches like the renewals, and publishes the runtime's
/// `identity` (at once, then every `who::REFRESH`; `None` on the embedded
/// backend).
pub(crate) async fn run(
    watchdog: Arc<Watchdog>,
    backend: Backend,
    heartbeats: Weak<dyn Heartbeats>,
    identity: Option<Identity>,
    mut stop: oneshot::Receiver<()>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut last_epoch = heartbeats.upgrade().map_or(0, |h| h.connection_epoch());
    let mut identity_due = Instant::now();
    loop {
        let changed = watchdog.changed.notified();
        let watched = heartbeats.upgrade();
        let mut connection_lost =
            std::pin::pin!(watched.as_ref().map(|h| h.connection_lost_notified()));
        if let Some(lost) = connection_lost.as_mut().as_pin_mut() {
            lost.enable();
        }
        let now = Instant::now();
        // Renewals that find their holds confirm them in this epoch.
        let epoch = watched.as_ref().map_or(0, |h| h.connection_epoch());
        if epoch != last_epoch {
            last_epoch = epoch;
            watchdog.renew_all_now(now);
        }
        let (due, mut next) = watchdog.collect_due(now);
        if let Some(heartbeats) = heartbeats.upgrade() {
            let (places, places_next) = heartbeats.due_places(now);
            if let Some(at) = places_next {
                next = next.min(at);
            }
            for batch in places.chunks(BATCH) {
                let (backend, batch) = (backend.clone(), batch.to_vec());
                tokio::spawn(refresh_batch(heartbeats.clone(), backend, batch));
            }
        }
        if let Some(identity) = &identity {
            if now >= identity_due {
                identity_due = now + who::REFRESH;
                tokio::spawn(publish(backend.clone(), identity.clone()));
            }
            next = next.min(identity_due);
        }
        if !due.is_empty() {
            watchdog.ticks.fetch_add(1, Relaxed);
        }
        for batch in backend.renewal_batches(&due, BATCH) {
            watchdog.round_trips.fetch_add(1, Relaxed);
            meter::renewal_sent();
            let heartbeats = heartbeats.clone();
            tokio::spawn(renew_batch(
                watchdog.clone(),
                backend.clone(),
                batch,
                epoch,
                heartbeats,
            ));
        }
        let lost = async {
            match connection_lost.as_mut().as_pin_mut() {
                Some(lost) => lost.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop => return,
            () = changed => {}
            () = lost => {}
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

/// Publishes the runtime's identity once. A failure only costs an operator
/// the name next to a holder id until the next refresh: logged, not fatal.
async fn publish(backend: Backend, identity: Identity) {
    let it = Published {
        key: &identity.key,
        value: &identity.value,
        ttl: who::TTL,
    };
    let published = backend.publish_identity(it).await;
    if let Err(error) = published {
        tracing::debug!(%error, "could not publish this runtime's identity");
    }
}

/// Sends one pipelined batch of renewals and settles its outcome. A batch
/// that gets no answer before the earliest lease in it runs out counts as
/// failed; the main loop declares the locks lost at their lease end anyway.
async fn renew_batch(
    watchdog: Arc<Watchdog>,
    backend: Backend,
    batch: Vec<Arc<HeldLock>>,
    epoch: u32,
    heartbeats: Weak<dyn Heartbeats>,
) {
    let sent_at = Instant::now();
    let deadline = watchdog
        .deadline_of(&batch)
        .unwrap_or(sent_at + Duration::from_secs(1));
    let outcome = match tokio::time::timeout_at(deadline, backend.renew_many(&batch)).await {
        Ok(Ok(results)) => results,
        Ok(Err(error)) => {
            meter::renewal_failed();
            tracing::debug!(
                %error,
                locks = batch.len(),
                keys = ?Keys(&batch),
                "lock renewal failed; retrying until the lease ends"
            );
            vec![None; batch.len()]
        }
        Err(_) => {
            meter::renewal_failed();
            tracing::debug!(
                locks = batch.len(),
                keys = ?Keys(&batch),
                "lock renewal got no answer before the earliest lease end in its batch"
            );
            vec![None; batch.len()]
        }
    };
    let now_epoch = heartbeats.upgrade().map_or(epoch, |h| h.connection_epoch());
    watchdog.settle(&batch, &outcome, sent_at, (epoch, now_epoch));
}

/// Sends one batch of fair-place refreshes and reports the outcome. Bounded
/// by a third of the queue entries' life: later, they may have run out.
async fn refresh_batch(
    heartbeats: Arc<dyn Heartbeats>,
    backend: Backend,
    batch: Vec<PlaceRefresh>,
) {
    let sent_at = Instant::now();
    let bound = sent_at + QUEUE_ENTRY_LIFE / 3;
    let outcome = match tokio::time::timeout_at(bound, backend.refresh_places(&batch)).await {
        Ok(Ok(results)) => results,
        Ok(Err(error)) => {
            tracing::debug!(%error, places = batch.len(), "fair place refresh failed");
            vec![None; batch.len()]
        }
        Err(_) => vec![None; batch.len()],
    };
    heartbeats.places_refreshed(&batch, &outcome, sent_at);
}

/// The keys of a batch, for a log line: the first few, and how many more.
struct Keys<'a>(&'a [Arc<HeldLock>]);

impl std::fmt::Debug for Keys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 5;
        let mut list = f.debug_list();
        list.entries(self.0.iter().take(SHOWN).map(|l| &l.key));
        if self.0.len() > SHOWN {
            list.entry(&format_args!("… {} more", self.0.len() - SHOWN));
        }
        list.finish()
    }
}
