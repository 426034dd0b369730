//! Who is waiting for which lock, in what order, and how they are woken.
//!
//! A contended acquire registers here before it retries, and then sleeps on
//! its own slot. The waiters of one key form a FIFO queue in this process: a
//! release wakes only the *head*, so one release sends one local contender to
//! the backend instead of all of them. The head keeps its place until it takes
//! the lock or gives up, also when another process wins the race for a release
//! (then it simply waits for the next one); newcomers queue behind it. A head
//! that gives up without taking the lock hands the wake-up on to the next.
//!
//! Wake-ups come from one place per backend: the Redis push handler when a
//! release message arrives on the key's channel, or the embedded backend when
//! it frees a lock. With Redis, the first local waiter of a key subscribes to
//! the key's release channel and the last one to leave unsubscribes; both go
//! through one ordered queue (the subscription task in `backend/redis.rs`), so
//! a subscribe and an unsubscribe of one channel never overtake each other.
//!
//! In fair mode (Redis only) the process also keeps one *place* per key in the
//! key's Redis queue: a holder id that the local head uses for its attempts,
//! and that outlives any one waiter, so a head that gives up leaves the place
//! to the next local waiter. A release hands the lock straight to the first
//! place in the Redis queue and names it in its message; the push handler
//! records the handoff here and wakes the head, which then holds the lock
//! without another round trip. When the last local waiter of a key leaves, an
//! unused place is given back (a fair release of its id: it leaves the queue,
//! or frees the lock if it was handed over meanwhile).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Wakeups, Watched, Watches};
use crate::cohort::Terms;
use crate::meter;

mod fair;

use crate::owner::Node;
pub(crate) use fair::Attempt as PlaceAttempt;
use fair::FairPlace;

/// A hold passed to a waiter by another task of this process (lock
/// cohorting): a `LockGuard`, opaque here. Dropping it gives the hold on.
pub(crate) type Passed = Box<dyn std::any::Any + Send>;

/// One waiter's place in its key's queue.
#[derive(Debug)]
pub(crate) struct LocalWaiter {
    /// Notified when it is this waiter's turn to try (a permit is kept if it
    /// is not listening at that moment, so no wake-up is lost).
    pub(crate) wake: Notify,
    scope: Arc<Node>,
    /// What a hold must be like for this waiter to take it over from
    /// another task of the process (`None`: it does not).
    terms: Option<Terms>,
    /// It asks for a read hold: a waiting writer ahead of it keeps it from
    /// the key (writers are not starved by a stream of readers).
    read: bool,
    /// A hold passed to it, not taken yet.
    passed: Mutex<Option<Passed>>,
}

impl LocalWaiter {
    fn passed(&self) -> std::sync::MutexGuard<'_, Option<Passed>> {
        self.passed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The waiters of one key.
#[derive(Debug, Default)]
pub(crate) struct KeyWaiters {
    queue: Mutex<VecDeque<Arc<LocalWaiter>>>,
    ready: AtomicBool,
    ready_changed: Notify,
    /// Set when the last waiter left (a subscribe still being retried for
    /// it is dropped).
    closed: AtomicBool,
    /// When the holder's lease ends, by the latest busy reply or local
    /// acquisition (None: not known, or no expiry).
    busy_until: Mutex<Option<Instant>>,
    /// Notified when `busy_until` moves earlier (sleepers wake sooner).
    busy_changed: Notify,
    place: Mutex<FairPlace>,
    /// A fair handoff to another process was seen on this key (0: no; 1:
    /// yes; 2: yes, and a plain waiter said so in the log).
    fair_seen: std::sync::atomic::AtomicU8,
}

impl Watched for KeyWaiters {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
        self.ready_changed.notify_waiters();
    }

    fn wake_first(&self) {
        self.wake_head();
    }
}

impl KeyWaiters {
    async fn ready(&self) {
        loop {
            let changed = self.ready_changed.notified();
            if self.ready.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<LocalWaiter>>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn place(&self) -> std::sync::MutexGuard<'_, FairPlace> {
        self.place.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn note_busy(&self, until: Option<Instant>) {
        let mut busy = self
            .busy_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let earlier = match (*busy, until) {
            (Some(old), Some(new)) => new < old,
            (None, Some(_)) => true,
            _ => false,
        };
        *busy = until;
        drop(busy);
        if earlier {
            self.busy_changed.notify_waiters();
        }
    }

    pub(crate) fn wake_head(&self) {
        if let Some(head) = self.queue().front() {
            head.wake.notify_one();
        }
    }
}

/// Registry of waiting keys for one runtime, by backend lock key.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    keys: Mutex<HashMap<String, Arc<KeyWaiters>>>,
    /// The backend's watches (`None` for the embedded store, which wakes
    /// waiters directly).
    watches: OnceLock<Arc<dyn Watches>>,
    /// Counts the backend's lost connections (see
    /// [`Heartbeats::connection_epoch`](crate::backend::Heartbeats::connection_epoch)).
    epoch: std::sync::atomic::AtomicU32,
    /// Notified when `epoch` moves.
    epoch_moved: Notify,
}

impl Wakeups for Waiters {
    fn released(&self, lock: &str) {
        self.wake_one(lock);
    }

    fn handed_over(&self, lock: &str, holder: &str, fence: u64, upto: u64) {
        self.hand_over(lock, holder, fence, upto);
    }

    fn connection_lost(&self) {
        // (Wraps after 4 billion losses: epochs are only compared for
        // equality, with the one a hold was last confirmed in.)
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.epoch_moved.notify_waiters();
        self.wake_all();
    }
}

impl Waiters {
    /// How many times the backend reported a lost connection so far.
    pub(crate) fn connection_epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// An empty registry.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Waiters::default())
    }

    /// Connects the registry to the backend's watches, once, right after
    /// the backend started.
    pub(crate) fn attach(&self, watches: Option<Arc<dyn Watches>>) {
        if let Some(watches) = watches {
            let _ = self.watches.set(watches);
        }
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<KeyWaiters>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues one waiter of owner scope `owner` on `channel`, which takes a
    /// hold passed on these `terms` (if any); the first one subscribes.
    pub(crate) fn register(
        self: &Arc<Self>,
        channel: String,
        scope: Arc<Node>,
        terms: Option<Terms>,
        read: bool,
    ) -> WaitTicket {
        let slot = Arc::new(LocalWaiter {
            wake: Notify::new(),
            scope,
            terms,
            read,
            passed: Mutex::new(None),
        });
        let mut keys = self.keys();
        let entry = match keys.get(&channel) {
            Some(entry) => entry.clone(),
            None => {
                let entry = Arc::new(KeyWaiters::default());
                keys.insert(channel.clone(), entry.clone());
                match self.watches.get() {
                    Some(watches) => watches.watch(&channel, entry.clone()),
                    None => entry.set_ready(),
                }
                entry
            }
        };
        entry.queue().push_back(slot.clone());
        drop(keys);
        meter::waiter_joined();
        WaitTicket {
            waiters: self.clone(),
            channel,
            entry,
            slot,
            took_lock: false,
            wake_head_on_leave: false,
        }
    }

    /// A release: wakes the head waiter of `channel`, if any.
    pub(crate) fn wake_one(&self, channel: &str) {
        let entry = self.keys().get(channel).cloned();
        if let Some(entry) = entry {
            entry.wake_head();
        }
    }

    /// A fair release handed the lock of `channel` to `holder`: if that is
    /// this process's place, records the handoff and wakes the head.
    pub(crate) fn hand_over(&self, channel: &str, holder: &str, fence: u64, upto: u64) {
        let entry = self.keys().get(channel).cloned();
        if let Some(entry) = entry {
            let mut place = entry.place();
            if place.id.as_deref() == Some(holder) {
                place.handed = Some(fair::Handed {
                    fence,
                    upto,
                    at: Instant::now(),
                    epoch: self.connection_epoch(),
                });
                drop(place);
                entry.wake_head();
                return;
            }
            drop(place);
            // A place this process gave up after a failed attempt, whose
            // give-back may have been lost: given back now, so the lock goes
            // on at once instead of after the place's claim.
            self.give_back_if_retired(channel, &entry, holder);
            if entry
                .fair_seen
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // Other processes hand this key on in fair mode: a plain
                // waiter of ours would never see it free. The head tries
                // again now, and queues (see `WaitTicket::fair_in_use`).
                entry.wake_head();
            }
        }
    }

    /// Lock cohorting: offers a hold of `channel` on `terms` to the head
    /// waiter, if it takes such holds and has none yet. `pass` makes the
    /// hold for the head's scope (or declines); it runs with the key's queue
    /// locked, so the head cannot leave meanwhile. `true`: passed, and the
    /// head woken.
    pub(crate) fn pass_to_head(
        &self,
        channel: &str,
        terms: Terms,
        pass: impl FnOnce(&Arc<Node>) -> Option<Passed>,
    ) -> bool {
        let Some(entry) = self.keys().get(channel).cloned() else {
            return false;
        };
        // A waiter still waiting for the key's watch to be set up (a stalled
        // subscription) would sit on the lock without running: release it.
        if !entry.ready.load(Ordering::Acquire) {
            return false;
        }
        let queue = entry.queue();
        let Some(head) = queue.front() else {
            return false;
        };
        if head.terms != Some(terms) {
            return false;
        }
        let mut slot = head.passed();
        if slot.is_some() {
            return false;
        }
        let Some(passed) = pass(&head.scope) else {
            return false;
        };
        *slot = Some(passed);
        drop(slot);
        head.wake.notify_one();
        true
    }

    /// This process took the lock of `channel`, with a lease ending at
    /// `until`: waiters of the key sleep no longer than that.
    pub(crate) fn note_held(&self, channel: &str, until: Instant) {
        let entry = self.keys().get(channel).cloned();
        if let Some(entry) = entry {
            entry.note_busy(Some(until));
        }
    }

    /// Wakes the waiters of `channel` in the scope `owner` or below it, which
    /// has just taken the key: they can re-enter now instead of waiting for a
    /// release their own scope would have to make.
    pub(crate) fn wake_owner(&self, channel: &str, owner: u64) {
        let entry = self.keys().get(channel).cloned();
        if let Some(entry) = entry {
            for slot in entry
                .queue()
                .iter()
                .filter(|s| s.scope.descends_from(owner))
            {
                slot.wake.notify_one();
            }
        }
    }

    /// Wakes every waiter of every key: messages may have been missed (the
    /// connection dropped), so everybody retries once.
    pub(crate) fn wake_all(&self) {
        let entries: Vec<Arc<KeyWaiters>> = self.keys().values().cloned().collect();
        for entry in entries {
            for slot in entry.queue().iter() {
                slot.wake.notify_one();
            }
        }
    }

    /// Whether anybody waits on `channel` now.
    pub(crate) fn is_waiting(&self, channel: &str) -> bool {
        self.keys().contains_key(channel)
    }

    /// Whether a writer (or exclusive) acquire of this process waits for
    /// `channel`: a new reader of the key then waits behind it.
    pub(crate) fn writer_waiting(&self, channel: &str) -> bool {
        let entry = self.keys().get(channel).cloned();
        entry.is_some_and(|entry| entry.queue().iter().any(|w| !w.read))
    }

    /// Number of keys with at least one local waiter.
    pub(crate) fn waiting_keys(&self) -> usize {
        self.keys().len()
    }

    /// Keys with local waiters whose watch the backend has confirmed (on
    /// Redis: the release channel's subscription): only these waiters can
    /// be passed a hold or woken by a release message.
    pub(crate) fn watched_keys(&self) -> usize {
        let entries: Vec<Arc<KeyWaiters>> = self.keys().values().cloned().collect();
        entries
            .iter()
            .filter(|entry| entry.ready.load(Ordering::Acquire))
            .count()
    }

    /// Waiters queued now, over every key.
    pub(crate) fn waiting_tasks(&self) -> usize {
        let entries: Vec<Arc<KeyWaiters>> = self.keys().values().cloned().collect();
        entries.iter().map(|entry| entry.queue().len()).sum()
    }

    fn unregister(&self, ticket: &WaitTicket) {
        let mut keys = self.keys();
        let (was_head, now_empty) = {
            let mut queue = ticket.entry.queue();
            let at = queue.iter().position(|s| Arc::ptr_eq(s, &ticket.slot));
            if let Some(at) = at {
                queue.remove(at);
            }
            (at == Some(0), queue.is_empty())
        };
        if now_empty {
            if let Some((channel, entry)) = keys.remove_entry(&ticket.channel) {
                entry.closed.store(true, Ordering::Release);
                // Give back an unused fair place: it leaves the Redis queue,
                // or, if the lock was handed to it meanwhile, frees the lock.
                if let Some(watches) = self.watches.get() {
                    let mut place = ticket.entry.place();
                    // Retired places too, once more: no handoff to one will
                    // be heard here any more (see `fair::Retired`).
                    let mut give_back = place.take_retired(Instant::now());
                    if let Some(id) = place.id.take() {
                        if place.attempting {
                            // An attempt with it is still out: its script
                            // must reach the server first (or it would queue
                            // the place again after the give-back). Given
                            // back when that attempt is answered.
                            place.give_back_after = Some((watches.clone(), channel.clone(), id));
                        } else {
                            give_back.push(id);
                        }
                    }
                    drop(place);
                    for id in give_back {
                        watches.give_back_place(channel.clone(), id);
                    }
                    watches.unwatch(&channel);
                }
            }
        } else if ticket.wake_head_on_leave || (was_head && !ticket.took_lock) {
            // The head leaves without the lock (deadline, cancellation,
            // error): a release it was woken for must not be lost, so the
            // next waiter tries instead. At worst one needless attempt.
            ticket.entry.wake_head();
        }
    }
}

/// One waiter's registration; leaves the queue on drop (also when the waiting
/// future is cancelled).
#[derive(Debug)]
pub(crate) struct WaitTicket {
    waiters: Arc<Waiters>,
    channel: String,
    entry: Arc<KeyWaiters>,
    slot: Arc<LocalWaiter>,
    took_lock: bool,
    /// Wake the (new) head on leaving even when this waiter was not the head.
    wake_head_on_leave: bool,
}

impl WaitTicket {
    /// Whether a writer (or exclusive) waiter of the key queued ahead of
    /// this one.
    pub(crate) fn writer_ahead(&self) -> bool {
        self.entry
            .queue()
            .iter()
            .take_while(|w| !Arc::ptr_eq(w, &self.slot))
            .any(|w| !w.read)
    }

    /// This waiter's slot.
    pub(crate) fn slot(&self) -> &Arc<LocalWaiter> {
        &self.slot
    }

    /// Resolves once the key's release channel is subscribed.
    pub(crate) async fn ready(&self) {
        self.entry.ready().await;
    }

    /// Records a busy reply for the key: the holder's lease ends at `until`.
    pub(crate) fn note_busy(&self, until: Option<Instant>) {
        self.entry.note_busy(until);
    }

    /// When the key's holder's lease ends, by the latest news.
    pub(crate) fn busy_until(&self) -> Option<Instant> {
        *self
            .entry
            .busy_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Resolves when the key's holder's lease end moves earlier.
    pub(crate) fn busy_changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.entry.busy_changed.notified()
    }

    /// Leaves the queue after taking the lock. There is no wake-up to hand
    /// on, except in fair mode (`wake_next`): the next head must queue the
    /// process in Redis again, since the place was used up.
    pub(crate) fn leave_with_lock(mut self, wake_next: bool) {
        self.took_lock = true;
        self.wake_head_on_leave = wake_next;
    }

    /// A hold another task of this process passed to this waiter, if any.
    pub(crate) fn take_passed(&self) -> Option<Passed> {
        self.slot.passed().take()
    }

    /// Whether other processes hand this key on in fair mode (a handoff
    /// message to a place not ours was seen). A plain waiter then queues in
    /// the key's fair queue too, instead of waiting for a free moment that
    /// direct handoffs never leave. `true` also says whether this is the
    /// first waiter to ask since (`first`), for a one-time log line.
    pub(crate) fn fair_in_use(&self) -> Option<bool> {
        match self.entry.fair_seen.load(Ordering::Acquire) {
            0 => None,
            _ => Some(
                self.entry
                    .fair_seen
                    .compare_exchange(1, 2, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok(),
            ),
        }
    }

    /// Whether this waiter is first in its key's local queue.
    pub(crate) fn is_head(&self) -> bool {
        self.entry
            .queue()
            .front()
            .is_some_and(|head| Arc::ptr_eq(head, &self.slot))
    }
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        meter::waiter_left();
        self.waiters.unregister(self);
        // A hold passed to this waiter that it did not take (it gave up, or
        // was cancelled) goes on: to the next waiter, or back to the
        // backend. Out of the queue and with no lock of the registry held.
        let passed = self.slot.passed().take();
        drop(passed);
    }
}

#[cfg(test)]
mod tests;
