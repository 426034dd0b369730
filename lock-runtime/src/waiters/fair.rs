//! Fair mode, this process's side: its one *place* per key in the key's
//! queue in the backend, which the local head waiter uses for its attempts
//! and which outlives any one waiter; and the handoffs a release makes to
//! it. See the module above for how a release reaches the place.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{KeyWaiters, WaitTicket, Waiters};
use crate::backend::{Heartbeats, PlaceRefresh, Refreshed, Watches, QUEUE_ENTRY_LIFE};

/// This process's place in a key's fair queue in Redis.
#[derive(Debug, Default)]
pub(super) struct FairPlace {
    /// Holder id queued in Redis (None: not queued).
    pub(super) id: Option<String>,
    /// A moment before the id was last seen queued and not yet handed the
    /// lock: a handoff happened later, so its lease ends after this + lease.
    confirmed: Option<Instant>,
    /// Shortest lease asked with this id (the one a handoff may have used).
    lease: Option<Duration>,
    /// A handoff to `id` not yet taken by a local waiter.
    pub(super) handed: Option<Handed>,
    /// An attempt with `id` is out (see [`WaitTicket::begin_attempt`]).
    pub(super) attempting: bool,
    /// A refresh of `id` by the watchdog's tick is out.
    refreshing: bool,
    /// When the next refresh is due (`None`: a refresh interval after
    /// `confirmed`).
    next_refresh: Option<Instant>,
    /// Counts the places this one has been (an [`Attempt`] of an earlier
    /// place must not end an attempt of the current one).
    generation: u64,
    /// The give-back of a place whose last waiter left while an attempt
    /// with it was out: sent when that attempt ends (its watches, channel
    /// and holder id).
    pub(super) give_back_after: Option<(Arc<dyn Watches>, String, String)>,
}

/// A handoff message to this process's place, as it arrived.
#[derive(Clone, Copy, Debug)]
pub(super) struct Handed {
    /// Its fencing token.
    pub(super) fence: u64,
    /// The last token reserved with it for local holders.
    pub(super) upto: u64,
    /// When its message arrived.
    pub(super) at: Instant,
    /// The backend's connection epoch it arrived in: after a lost
    /// connection the server may have restarted without the handoff, so it
    /// is only good in this epoch.
    pub(super) epoch: u32,
}

impl FairPlace {
    /// An attempt or refresh sent at `sent_at` found the place still queued
    /// (and, for an attempt, the lock busy).
    fn confirm(&mut self, sent_at: Instant) {
        match self.handed {
            // Sent before the handoff's message came: older news (the claim
            // is counted from the last such moment before the handoff).
            Some(Handed { at, .. }) if sent_at < at => return,
            // Sent after it and still queued: the claim ran out and the lock
            // went on; the place is queued again.
            Some(_) => self.handed = None,
            None => {}
        }
        self.confirmed = self.confirmed.max(Some(sent_at));
        self.next_refresh = None;
    }

    /// Forgets the place (the next attempt makes a new one); returns its id.
    pub(super) fn reset(&mut self) -> Option<String> {
        let id = self.id.take();
        *self = FairPlace {
            generation: self.generation.wrapping_add(1),
            ..FairPlace::default()
        };
        id
    }
}

/// An attempt with a key's fair place; ends it when dropped (reply handled,
/// or the attempt cancelled), and then hands a handoff that arrived
/// meanwhile to the head.
#[derive(Debug)]
pub(crate) struct Attempt {
    entry: Arc<KeyWaiters>,
    generation: u64,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let mut place = self.entry.place();
        if place.generation != self.generation {
            return; // that place is gone; its attempt ended with it
        }
        place.attempting = false;
        let handed = place.handed.is_some();
        let give_back = place.give_back_after.take();
        drop(place);
        if let Some((watches, channel, id)) = give_back {
            watches.give_back_place(channel, id);
        }
        if handed {
            self.entry.wake_head();
        }
    }
}

/// The least claim a handoff must have left to be taken from its message
/// (besides a third of the claim).
const HANDOFF_MARGIN_MIN: Duration = Duration::from_millis(20);

/// A lock handed to this process's place, ready to be taken.
#[derive(Debug)]
pub(crate) struct Handoff {
    /// Holder id the lock is held under.
    pub(crate) holder: String,
    /// Its fencing token.
    pub(crate) fence: u64,
    /// The last token reserved with it for local holders.
    pub(crate) upto: u64,
    /// Its lease in the backend ends after `since` + `lease`.
    pub(crate) since: Instant,
    /// The lease it was handed over with (at least this long).
    pub(crate) lease: Duration,
    /// The backend's connection epoch its message arrived in.
    pub(crate) epoch: u32,
}

impl WaitTicket {
    /// Fair mode: starts an attempt with this process's place in the key's
    /// Redis queue (made now if there is none), asking a handoff `lease`:
    /// its holder id, and a guard that ends the attempt when dropped. `None`
    /// while another local waiter's attempt with the place is out.
    ///
    /// One attempt at a time per place, and no handoff taken while one is
    /// out: so the place is used up exactly once, by the reply of the one
    /// attempt or by [`take_handoff`](Self::take_handoff), and no attempt is
    /// ever still on its way with a place that was used up.
    pub(crate) fn begin_attempt(&self, lease: Duration) -> Option<(String, Attempt)> {
        let mut place = self.entry.place();
        if place.attempting {
            return None;
        }
        if place.id.is_none() {
            place.reset();
            place.id = Some(crate::owner::new_holder_id());
            place.confirmed = Some(Instant::now());
        }
        place.lease = Some(place.lease.map_or(lease, |l| l.min(lease)));
        let id = place.id.clone()?;
        place.attempting = true;
        let attempt = Attempt {
            entry: self.entry.clone(),
            generation: place.generation,
        };
        Some((id, attempt))
    }

    /// Fair mode: whether the process has a place in the key's queue (made,
    /// and not used up by a handoff).
    pub(crate) fn has_place(&self) -> bool {
        self.entry.place().id.is_some()
    }

    /// Fair mode: gives up the place `holder` after its attempt failed (the
    /// connection may have dropped, and the attempt may yet have reached
    /// Redis): returns its id for a background release, which takes it out
    /// of the queue or frees what was handed to it; the next attempt makes
    /// a new place.
    pub(crate) fn abandon_place(&self, holder: &str) -> Option<String> {
        let mut place = self.entry.place();
        if place.id.as_deref() != Some(holder) {
            return None;
        }
        place.reset()
    }

    /// Fair mode: a first attempt, made before this waiter registered, queued
    /// `holder` in Redis (sent at `sent_at`, asking `lease`). It becomes the
    /// place if the process has none; otherwise it is `Some(holder)`, a
    /// second place that the caller must give back.
    pub(crate) fn adopt_place(
        &self,
        holder: String,
        sent_at: Instant,
        lease: Duration,
    ) -> Option<String> {
        let mut place = self.entry.place();
        if place.id.is_some() {
            return Some(holder);
        }
        place.reset();
        place.id = Some(holder);
        place.confirmed = Some(sent_at);
        place.lease = Some(lease);
        None
    }

    /// Fair mode: an attempt with `holder` sent at `sent_at` found the lock
    /// busy and not handed to `holder`.
    pub(crate) fn confirm_place(&self, holder: &str, sent_at: Instant) {
        let mut place = self.entry.place();
        if place.id.as_deref() == Some(holder) {
            place.confirm(sent_at);
        }
    }

    /// Fair mode: an attempt with the place id `holder` says the lock is held
    /// under it. Only the first local waiter to say so takes it (`true`; the
    /// next one gets a new place); `false` when another local waiter already
    /// took it, by this call or by [`take_handoff`](Self::take_handoff).
    pub(crate) fn claim_place(&self, holder: &str) -> bool {
        let mut place = self.entry.place();
        if place.id.as_deref() != Some(holder) {
            return false;
        }
        place.reset();
        true
    }

    /// Fair mode: takes a lock handed to this process's place, if there is
    /// one, no attempt with the place is out, its claim is at least
    /// `minimum` long and has not run out by this process's count, and no
    /// connection was lost since its message came (`epoch` is the current
    /// connection epoch). Checked now, at entry, not when the message came:
    /// between the two the process may have been stopped, its executor may
    /// have stalled, the server may have restarted empty. A handoff that
    /// fails a check is dropped, and an attempt with the place finds out
    /// where the lock is (it confirms a handoff that is still good: the
    /// script answers "handed to you").
    pub(crate) fn take_handoff(&self, minimum: Duration, epoch: u32) -> Option<Handoff> {
        let mut place = self.entry.place();
        let (Some(handed), Some(_), Some(since), Some(lease)) =
            (place.handed, &place.id, place.confirmed, place.lease)
        else {
            return None;
        };
        if lease < minimum || place.attempting {
            return None;
        }
        // Too little of the claim left by this process's count (it counts
        // from before the handoff), or news from before a lost connection:
        // drop it, and let an attempt with the place claim the lock with a
        // full lease instead.
        let margin = (lease / 3).max(HANDOFF_MARGIN_MIN);
        if since + lease <= Instant::now() + margin || handed.epoch != epoch {
            place.handed = None;
            return None;
        }
        let holder = place.reset()?;
        Some(Handoff {
            holder,
            fence: handed.fence,
            upto: handed.upto,
            since,
            lease,
            epoch: handed.epoch,
        })
    }
}

/// The shortest refresh interval of a place (for very short leases, whose
/// handoff claim may then run out before it is taken from the message; the
/// waiter's next attempt claims it instead).
const REFRESH_MIN: Duration = Duration::from_millis(50);

/// How often a place is refreshed: a third of its queue entry's life, or of
/// a shorter handoff claim (most of a claim is then still ahead when it is
/// taken: it counts from the last refresh before the handoff).
fn refresh_interval(lease: Duration) -> Duration {
    (QUEUE_ENTRY_LIFE / 3).min(lease / 3).max(REFRESH_MIN)
}

/// The watchdog's tick refreshes the places of waiting processes in
/// batches, instead of one script per waiting key and second from its head.
impl Heartbeats for Waiters {
    fn connection_epoch(&self) -> u32 {
        Waiters::connection_epoch(self)
    }

    fn connection_lost_notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.epoch_moved.notified()
    }

    fn due_places(&self, now: Instant) -> (Vec<PlaceRefresh>, Option<Instant>) {
        let entries: Vec<(String, Arc<KeyWaiters>)> = self
            .keys()
            .iter()
            .map(|(lock, entry)| (lock.clone(), entry.clone()))
            .collect();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (lock, entry) in entries {
            let mut place = entry.place();
            let (Some(id), Some(lease), Some(confirmed)) =
                (place.id.clone(), place.lease, place.confirmed)
            else {
                continue;
            };
            if place.attempting || place.refreshing || place.handed.is_some() {
                continue;
            }
            let every = refresh_interval(lease);
            let at = place.next_refresh.unwrap_or(confirmed + every);
            // A quarter of an interval early is fine: places falling due
            // close together go in one batch, and stay together after.
            if at <= now + every / 4 {
                place.refreshing = true;
                place.next_refresh = Some(now + every);
                due.push(PlaceRefresh {
                    lock_key: lock,
                    holder: id,
                    lease,
                });
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        (due, next)
    }

    fn places_refreshed(
        &self,
        places: &[PlaceRefresh],
        outcome: &[Option<Refreshed>],
        sent_at: Instant,
    ) {
        for (refreshed, result) in places.iter().zip(outcome) {
            let Some(entry) = self.keys().get(&refreshed.lock_key).cloned() else {
                continue;
            };
            let mut place = entry.place();
            if place.id.as_deref() != Some(refreshed.holder.as_str()) {
                continue; // that place is gone; a new one has its own schedule
            }
            place.refreshing = false;
            // Unknown: again at the next refresh (already planned).
            let Some(found) = result else {
                continue;
            };
            if found.queued {
                place.confirm(sent_at);
            }
            drop(place);
            match u64::try_from(found.lock_ttl) {
                // Not queued (handed the lock, whose message may be late, or
                // dropped), or the lock is free with nobody to tell (its
                // holder's claim ran out): the head tries with the place,
                // and claims the lock or queues the place again.
                _ if !found.queued || found.lock_ttl == -2 => entry.wake_head(),
                // Held: the waiters sleep no longer than its lease (a claim
                // that runs out sends no release message).
                Ok(ms) => entry.note_busy(sent_at.checked_add(Duration::from_millis(ms))),
                Err(_) => {}
            }
        }
    }
}

impl Waiters {
    /// Gives back every fair place of this process (shutdown): each leaves
    /// its key's queue in the backend, or frees what was handed to it.
    pub(crate) fn give_back_places(&self) {
        let Some(watches) = self.watches.get() else {
            return;
        };
        let entries: Vec<(String, std::sync::Arc<KeyWaiters>)> = self
            .keys()
            .iter()
            .map(|(lock, entry)| (lock.clone(), entry.clone()))
            .collect();
        for (lock, entry) in entries {
            if let Some(id) = entry.place().reset() {
                watches.give_back_place(lock, id);
            }
        }
    }
}
