//! Fair mode, this process's side: its one *place* per key in the key's
//! queue in the backend, which the local head waiter uses for its attempts
//! and which outlives any one waiter; and the handoffs a release makes to
//! it. See the module above for how a release reaches the place.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{KeyWaiters, WaitTicket, Waiters};

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
    /// A handoff to `id` not yet taken by a local waiter: its fence, the
    /// last token reserved with it, and when its message arrived.
    pub(super) handed: Option<(u64, u64, Instant)>,
    /// An attempt with `id` is out (see [`WaitTicket::begin_attempt`]).
    attempting: bool,
    /// Counts the places this one has been (an [`Attempt`] of an earlier
    /// place must not end an attempt of the current one).
    generation: u64,
}

impl FairPlace {
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
        drop(place);
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
        if place.id.as_deref() != Some(holder) {
            return;
        }
        match place.handed {
            // Sent before the handoff's message came: older news (the claim
            // is counted from the last such moment before the handoff).
            Some((_, _, at)) if sent_at < at => {}
            // Sent after it and still busy: the claim ran out and the lock
            // went on; the attempt has queued the place again.
            Some(_) => {
                place.handed = None;
                place.confirmed = place.confirmed.max(Some(sent_at));
            }
            None => place.confirmed = place.confirmed.max(Some(sent_at)),
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
    /// one, no attempt with the place is out, and its claim is at least
    /// `minimum` long and has not run out by this process's count (then the
    /// handoff is dropped, and an attempt with the place finds out where the
    /// lock is).
    pub(crate) fn take_handoff(&self, minimum: Duration) -> Option<Handoff> {
        let mut place = self.entry.place();
        let (Some((fence, upto, _)), Some(_), Some(since), Some(lease)) =
            (place.handed, &place.id, place.confirmed, place.lease)
        else {
            return None;
        };
        if lease < minimum || place.attempting {
            return None;
        }
        // Too little of the claim left by this process's count (it counts
        // from before the handoff): drop it, and let an attempt with the
        // place claim the lock with a full lease instead.
        let margin = (lease / 3).max(HANDOFF_MARGIN_MIN);
        if since + lease <= Instant::now() + margin {
            place.handed = None;
            return None;
        }
        let holder = place.reset()?;
        Some(Handoff {
            holder,
            fence,
            upto,
            since,
            lease,
        })
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
