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
    /// Queued for a read hold (on a backend whose places have a mode: see
    /// [`WaitTicket::begin_attempt`]).
    read: bool,
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
    /// The waiter of the attempt out handled its reply (see
    /// [`Attempt`]'s drop).
    answered: bool,
    /// Places given up after a failed attempt, while they may still hold a
    /// queue entry or the lock in the backend (kept across `reset`).
    retired: Vec<Retired>,
}

/// A place given up after its attempt failed ([`WaitTicket::abandon_place`]).
///
/// Its give-back goes out at once, but through the same connection that
/// just failed: in an outage the releaser gives it up after a few tries,
/// and the place stays queued in the backend until its entry runs out. A
/// release that reaches it meanwhile hands it the lock, which then sits
/// unused for the whole claim (up to 3 s, for every process), since no
/// waiter knows the id any more. So the id is kept here, and given back
/// again once the backend is reachable: when a handoff names it (its
/// message came through), and when the backend answers an attempt or a
/// refresh of the key. A second give-back of a unique holder id is
/// harmless (it finds nothing, or frees what the place was handed).
#[derive(Debug)]
pub(super) struct Retired {
    id: String,
    /// After this the place can hold nothing any more: its entry lives a
    /// queue entry's life after the failed attempt (which may still have
    /// refreshed it), and a claim handed to it as long again.
    until: Instant,
    /// When its give-back was last sent.
    sent: Instant,
}

/// How long a retired place is kept (see [`Retired::until`]).
const RETIRED_FOR: Duration = QUEUE_ENTRY_LIFE.saturating_mul(2);

/// Retired places kept per key at most: one is added per failed attempt
/// and each lasts [`RETIRED_FOR`], so with the error backoff (20-500 ms)
/// an outage retires a few dozen at most; the oldest ones, kept, are the
/// ones that were queued before it.
const RETIRED_MAX: usize = 64;

/// A retired place is given back again at most this often when the
/// backend answers (its earlier give-back may still be in the releaser's
/// retries: each answered attempt sending another would only add load).
const RETIRED_RESEND: Duration = Duration::from_millis(500);

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
            retired: std::mem::take(&mut self.retired),
            ..FairPlace::default()
        };
        id
    }

    /// Keeps `id`, given up just now and its give-back sent, as retired.
    fn retire(&mut self, id: String, now: Instant) {
        self.retired.retain(|r| r.until > now);
        if self.retired.len() < RETIRED_MAX {
            self.retired.push(Retired {
                id,
                until: now + RETIRED_FOR,
                sent: now,
            });
        }
    }

    /// The backend answered for this key at `now`: the retired places whose
    /// give-back was last sent long enough ago, to be given back again.
    fn retired_due(&mut self, now: Instant) -> Vec<String> {
        self.retired.retain(|r| r.until > now);
        self.retired
            .iter_mut()
            .filter(|r| now >= r.sent + RETIRED_RESEND)
            .map(|r| {
                r.sent = now;
                r.id.clone()
            })
            .collect()
    }

    /// A handoff named `holder`: whether it is a retired place (then given
    /// back again now, whenever it was last).
    fn retired_handed(&mut self, holder: &str, now: Instant) -> bool {
        match self.retired.iter_mut().find(|r| r.id == holder) {
            Some(retired) => {
                retired.sent = now;
                true
            }
            None => false,
        }
    }

    /// Every retired place that may still hold something (the key's last
    /// waiter left: nobody will hear a handoff to them any more).
    pub(super) fn take_retired(&mut self, now: Instant) -> Vec<String> {
        std::mem::take(&mut self.retired)
            .into_iter()
            .filter(|r| r.until > now)
            .map(|r| r.id)
            .collect()
    }
}

/// An attempt with a key's fair place; ends it when dropped (reply handled,
/// or the attempt cancelled), and then hands a handoff that arrived
/// meanwhile to the head. An attempt whose waiter went away before handling
/// its reply (cancelled, or its wait ran out with the script in flight)
/// wakes the head too: the script may have taken the lock for the place
/// (a free lock takes no handoff message) or queued it, and only an attempt
/// with the place finds out which; otherwise the lock would sit unused
/// until the head's next refresh or alarm (up to a second).
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
        let wake = place.handed.is_some() || !place.answered;
        let give_back = place.give_back_after.take();
        drop(place);
        if let Some((watches, channel, id)) = give_back {
            watches.give_back_place(channel, id);
        }
        if wake {
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
    ///
    /// `read`: on a backend whose places have a mode (Redis: a release hands
    /// a reader's place a read hold), whether this attempt is a read. A
    /// place queued in the other mode (its waiter left before using it) is
    /// given back, and a new one made: a hold handed to it could not serve
    /// this waiter. `None`: the place has no mode.
    pub(crate) fn begin_attempt(
        &self,
        lease: Duration,
        read: Option<bool>,
    ) -> Option<(String, Attempt)> {
        let mut place = self.entry.place();
        if place.attempting {
            return None;
        }
        let mut other_mode = None;
        if let Some(read) = read {
            if place.id.is_some() && place.read != read {
                other_mode = place.reset();
                if let Some(id) = &other_mode {
                    place.retire(id.clone(), Instant::now());
                }
            }
        }
        if place.id.is_none() {
            place.reset();
            place.id = Some(crate::owner::new_holder_id());
            place.confirmed = Some(Instant::now());
            place.read = read.unwrap_or(false);
        }
        place.lease = Some(place.lease.map_or(lease, |l| l.min(lease)));
        let id = place.id.clone()?;
        place.attempting = true;
        place.answered = false;
        let attempt = Attempt {
            entry: self.entry.clone(),
            generation: place.generation,
        };
        drop(place);
        if let Some(old) = other_mode {
            self.waiters.give_back(&self.channel, vec![old]);
        }
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
    /// a new place. The id is kept as [`Retired`] meanwhile, in case that
    /// release is lost too.
    pub(crate) fn abandon_place(&self, holder: &str) -> Option<String> {
        let mut place = self.entry.place();
        if place.id.as_deref() != Some(holder) {
            return None;
        }
        let id = place.reset()?;
        place.retire(id.clone(), Instant::now());
        Some(id)
    }

    /// The backend answered an attempt for this key: retired places are
    /// given back again (see [`Retired`]), with the place no longer locked.
    fn backend_answered(&self, mut place: std::sync::MutexGuard<'_, FairPlace>) {
        let due = place.retired_due(Instant::now());
        drop(place);
        self.waiters.give_back(&self.channel, due);
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
        read: bool,
    ) -> Option<String> {
        let mut place = self.entry.place();
        if place.id.is_some() {
            return Some(holder);
        }
        place.reset();
        place.id = Some(holder);
        place.confirmed = Some(sent_at);
        place.lease = Some(lease);
        place.read = read;
        None
    }

    /// Fair mode: an attempt with `holder` sent at `sent_at` found the lock
    /// busy and not handed to `holder`.
    pub(crate) fn confirm_place(&self, holder: &str, sent_at: Instant) {
        let mut place = self.entry.place();
        if place.id.as_deref() == Some(holder) {
            place.confirm(sent_at);
            place.answered = true;
        }
        self.backend_answered(place);
    }

    /// Fair mode: an attempt with the place id `holder` says the lock is held
    /// under it. Only the first local waiter to say so takes it (`true`; the
    /// next one gets a new place); `false` when another local waiter already
    /// took it, by this call or by [`take_handoff`](Self::take_handoff).
    pub(crate) fn claim_place(&self, holder: &str) -> bool {
        let mut place = self.entry.place();
        let claimed = place.id.as_deref() == Some(holder);
        if claimed {
            place.reset();
        }
        self.backend_answered(place);
        claimed
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
    ///
    /// `read` (see [`begin_attempt`](Self::begin_attempt)): a place of the
    /// other mode is not taken; this waiter's attempt gives it back.
    pub(crate) fn take_handoff(
        &self,
        minimum: Duration,
        epoch: u32,
        read: Option<bool>,
    ) -> Option<Handoff> {
        let mut place = self.entry.place();
        let (Some(handed), Some(_), Some(since), Some(lease)) =
            (place.handed, &place.id, place.confirmed, place.lease)
        else {
            return None;
        };
        if lease < minimum || place.attempting || read.is_some_and(|read| read != place.read) {
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
                    read: place.read,
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
            let retired = place.retired_due(Instant::now());
            drop(place);
            self.give_back(&refreshed.lock_key, retired);
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
    /// Gives back the places `ids` of the lock `lock` (fair releases of
    /// their ids, in the background).
    pub(super) fn give_back(&self, lock: &str, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        if let Some(watches) = self.watches.get() {
            for id in ids {
                watches.give_back_place(lock.to_owned(), id);
            }
        }
    }

    /// A handoff named `holder`, not this process's place: if it is one of
    /// its retired places, that place is given back now (the message came
    /// through, so the connection works again), and the lock goes on to
    /// the next in line instead of waiting out the claim.
    pub(super) fn give_back_if_retired(&self, lock: &str, entry: &KeyWaiters, holder: &str) {
        let retired = entry.place().retired_handed(holder, Instant::now());
        if retired {
            self.give_back(lock, vec![holder.to_owned()]);
        }
    }

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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_retired_place_is_given_back_again_at_most_every_half_second_while_it_may_hold_something() {
        let mut place = FairPlace::default();
        let t0 = Instant::now();
        place.retire("r".to_owned(), t0);
        // Its first give-back went out just now (it may still be in the
        // releaser's retries).
        assert!(place.retired_due(t0).is_empty());
        let later = t0 + RETIRED_RESEND;
        assert_eq!(place.retired_due(later), ["r"]);
        assert!(place.retired_due(later + RETIRED_RESEND / 2).is_empty());
        // A handoff names it: again at once.
        assert!(place.retired_handed("r", later + RETIRED_RESEND / 2));
        assert!(!place.retired_handed("other", later));
        // Kept across a reset of the place.
        place.reset();
        assert_eq!(place.retired_due(later + RETIRED_RESEND * 2), ["r"]);
        // Once its entry and any claim handed to it have run out: dropped.
        assert!(place.retired_due(t0 + RETIRED_FOR).is_empty());
        assert!(place.take_retired(t0 + RETIRED_FOR).is_empty());
    }
}
