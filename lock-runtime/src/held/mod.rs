//! Locks this runtime holds, and in-process reentrancy.
//!
//! Every lock held through this runtime has one [`HeldLock`] (this file),
//! shared by the guard(s) holding it and by the watchdog: its owner scope,
//! its token run, its mode, its client-side validity, whether it is lost,
//! and the connection epoch the backend last confirmed it in. The table
//! (`table.rs`) keeps, per lock, a stack of *frames*: one per hold, naming
//! the owner scope it belongs to, innermost last. A request re-enters (a
//! local count, no round trip) when the innermost frame belongs to its
//! scope or an ancestor of it (strict nesting, see `owner.rs`); when only an
//! outer frame does, a sibling is inside, and the request waits there for
//! the frames to change. The outer hold's lease is renewed by the watchdog
//! for as long as any frame is alive, and the backend sees one hold. A lost
//! lock is never re-entered: the next acquire goes to the backend again.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::cohort::{Cohort, Run, Terms};
use crate::meter;
use crate::mode::LockMode;

/// One lock held by one owner scope of this process.
#[derive(Debug)]
pub(crate) struct HeldLock {
    /// Process-unique id (watchdog bookkeeping).
    pub(crate) id: u64,
    /// The key as the caller wrote it.
    pub(crate) key: String,
    /// Backend name of the lock (prefix and hash tag applied).
    pub(crate) lock_key: String,
    /// Holder id recorded in the backend.
    pub(crate) holder: String,
    /// Owner scope that holds it (changes when the hold is passed to
    /// another task of this process, see `cohort.rs`).
    owner: AtomicU64,
    /// The token of the current holder, and the run of local handoffs.
    run: Run,
    /// Lease (the backend TTL) in force.
    pub(crate) lease: Duration,
    /// Whether the watchdog renews it.
    pub(crate) renew: bool,
    /// Whether it was taken in fair mode (its release hands it on).
    pub(crate) fair: bool,
    /// The backend hold's mode (a [`LockMode`] as `u8`): read (shared), or
    /// write / exclusive; write turns read when it is downgraded.
    mode: AtomicU8,
    holds: AtomicUsize,
    lost: AtomicBool,
    /// Given back by [`HeldTable::close_all`] (the runtime shut down): no
    /// guard releases it again.
    closed: AtomicBool,
    /// The backend's connection epoch in which the hold was last confirmed
    /// (acquired or renewed; see `Heartbeats::connection_epoch`).
    confirmed_in: std::sync::atomic::AtomicU32,
    /// Renewals that found the hold in place (the entry gate waits for one).
    renewals: AtomicU64,
    /// Client-side lease end (see [`clock`]): past it the hold counts as lost
    /// even before the watchdog gets to mark it.
    valid_until: AtomicU64,
    lost_changed: Notify,
    /// When the current holder's hold began (for the hold-time histogram),
    /// as [`clock`] nanoseconds.
    #[cfg(feature = "metrics")]
    taken_at: AtomicU64,
}

/// A hold ends when the last guard, table entry and renewal holding it let
/// go of it: the one place every hold passes on its way out (release, drop,
/// shutdown, loss).
impl Drop for HeldLock {
    fn drop(&mut self) {
        self.hold_ended();
    }
}

/// Instants as nanoseconds since a process-wide origin, for atomics.
pub(crate) mod clock {
    use std::sync::OnceLock;

    use tokio::time::Instant;

    fn origin() -> Instant {
        static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
        Instant::from_std(*ORIGIN.get_or_init(std::time::Instant::now))
    }

    /// `at` as nanoseconds since the origin (0 before it; saturating).
    pub(crate) fn to_nanos(at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(origin()).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Now, as nanoseconds since the origin.
    pub(crate) fn now_nanos() -> u64 {
        to_nanos(Instant::now())
    }
}

/// What a new [`HeldLock`] is made of (the fields of the same names).
pub(crate) struct Hold {
    pub(crate) key: String,
    pub(crate) lock_key: String,
    pub(crate) holder: String,
    pub(crate) owner: u64,
    pub(crate) fence: u64,
    /// The last token reserved with the acquisition for local holders
    /// (`fence` itself when none is).
    pub(crate) upto: u64,
    /// When the backend acquisition was sent.
    pub(crate) since: tokio::time::Instant,
    /// The backend's connection epoch when it was sent.
    pub(crate) epoch: u32,
    pub(crate) lease: Duration,
    pub(crate) renew: bool,
    pub(crate) fair: bool,
    pub(crate) mode: LockMode,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn mode_byte(mode: LockMode) -> u8 {
    match mode {
        LockMode::Read => 1,
        LockMode::Write => 2,
        _ => 0,
    }
}

impl HeldLock {
    pub(crate) fn new(hold: Hold) -> Arc<Self> {
        meter::hold_started();
        Arc::new(HeldLock {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            key: hold.key,
            lock_key: hold.lock_key,
            holder: hold.holder,
            owner: AtomicU64::new(hold.owner),
            run: Run::new(hold.fence, hold.upto, hold.since),
            confirmed_in: std::sync::atomic::AtomicU32::new(hold.epoch),
            renewals: AtomicU64::new(0),
            lease: hold.lease,
            renew: hold.renew,
            fair: hold.fair,
            mode: AtomicU8::new(mode_byte(hold.mode)),
            holds: AtomicUsize::new(1),
            lost: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            valid_until: AtomicU64::new(u64::MAX),
            lost_changed: Notify::new(),
            #[cfg(feature = "metrics")]
            taken_at: AtomicU64::new(clock::now_nanos()),
        })
    }

    /// The backend hold's mode now.
    pub(crate) fn mode(&self) -> LockMode {
        match self.mode.load(Ordering::Acquire) {
            1 => LockMode::Read,
            2 => LockMode::Write,
            _ => LockMode::Exclusive,
        }
    }

    /// The fencing token of the current holder.
    pub(crate) fn fence(&self) -> u64 {
        self.run.fence()
    }

    /// The owner scope of the current holder.
    pub(crate) fn owner(&self) -> u64 {
        self.owner.load(Ordering::Acquire)
    }

    /// Passes the hold to owner scope `owner` with the next token of its
    /// reserved block, if `limits` allow one more local handoff now and the
    /// hold has half its lease left, or [`LEFT_TO_PASS`](crate::cohort::LEFT_TO_PASS)
    /// (a fair handoff's claim is short until the first renewal); returns
    /// the new token.
    /// (Called with no frame left, so no guard reads the old token again.)
    pub(crate) fn pass_to(&self, owner: u64, limits: Cohort, epoch: u32) -> Option<u64> {
        if !self.fit_to_enter(epoch) {
            // Not passed until a renewal confirms it again (its holder keeps
            // it meanwhile).
            return None;
        }
        let now = tokio::time::Instant::now();
        if self.is_lost() || !self.renew || !self.worth_sharing(now) {
            return None;
        }
        let fence = self.run.next(limits, now)?;
        self.owner.store(owner, Ordering::Release);
        self.hold_ended();
        meter::hold_started();
        #[cfg(feature = "metrics")]
        self.taken_at.store(clock::now_nanos(), Ordering::Relaxed);
        Some(fence)
    }

    /// Whether a read on `terms` may join this read hold now (a task of the
    /// process that is not in the holder's call chain: no round trip, the
    /// hold's token): it is a renewed read hold on the same lease and mode,
    /// fit to enter in connection epoch `epoch`, with enough of its
    /// validity left to be worth sharing (as for a local handoff), and
    /// within the cohort `limits`. Counts the join.
    fn may_join(&self, terms: Terms, limits: Cohort, epoch: u32) -> bool {
        let now = tokio::time::Instant::now();
        terms.read
            && self.mode().is_read()
            && self.renew
            && self.lease == terms.lease
            && self.fair == terms.fair
            && self.fit_to_enter(epoch)
            && self.worth_sharing(now)
            && self.run.join(limits, now)
    }

    /// Whether enough of the hold's client-side validity is left at `now`
    /// for another task to enter it (passed or joined): half its lease, or
    /// [`LEFT_TO_PASS`](crate::cohort::LEFT_TO_PASS) (a fair handoff's
    /// claim is short until the first renewal).
    fn worth_sharing(&self, now: tokio::time::Instant) -> bool {
        self.validity_left(now) >= (self.lease / 2).min(crate::cohort::LEFT_TO_PASS)
    }

    /// How much of the hold's client-side validity is left at `now`.
    pub(crate) fn validity_left(&self, now: tokio::time::Instant) -> Duration {
        let until = self.valid_until.load(Ordering::Acquire);
        Duration::from_nanos(until.saturating_sub(clock::to_nanos(now)))
    }

    /// How many renewals found the hold in place so far.
    pub(crate) fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Acquire)
    }

    /// Resolves once a renewal after the `seen`-th found the hold in place
    /// (see [`renewals`](Self::renewals)), or the hold is lost.
    pub(crate) async fn renewed_after(&self, seen: u64) {
        loop {
            let changed = self.lost_changed.notified();
            if self.renewals() > seen {
                return;
            }
            tokio::select! {
                () = changed => {}
                () = self.lost() => return,
            }
        }
    }

    /// Whether a task may enter this hold without a round trip now, the
    /// backend's connection epoch being `epoch`: it is not lost, its
    /// client-side validity is still ahead, and no connection was lost
    /// since the backend last confirmed it (the server may have restarted
    /// without it). Asked at the moment of entry: a hold that was fine when
    /// it was passed may not be by the time its new holder runs.
    pub(crate) fn fit_to_enter(&self, epoch: u32) -> bool {
        self.confirmed_in.load(Ordering::Acquire) == epoch && !self.is_lost()
    }

    /// Whether the backend confirmed this hold (acquired or renewed it)
    /// since the last lost connection, the connection epoch being `epoch`.
    pub(crate) fn confirmed_in(&self, epoch: u32) -> bool {
        self.confirmed_in.load(Ordering::Acquire) == epoch
    }

    /// The connection epoch of the backend's last word on this hold (see
    /// `gate.rs`).
    pub(crate) fn confirmed_epoch(&self) -> u32 {
        self.confirmed_in.load(Ordering::Acquire)
    }

    /// Counts the end of the current holder's hold.
    fn hold_ended(&self) {
        #[cfg(feature = "metrics")]
        let held_for = Duration::from_nanos(
            clock::now_nanos().saturating_sub(self.taken_at.load(Ordering::Relaxed)),
        );
        #[cfg(not(feature = "metrics"))]
        let held_for = Duration::ZERO;
        meter::hold_ended(&self.key, held_for);
    }

    /// Whether the lock is lost: found gone, or its client-side lease end
    /// has passed (also a moment before the watchdog marks it).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
            || clock::now_nanos() >= self.valid_until.load(Ordering::Acquire)
    }

    /// Sets the client-side lease end (the watchdog, on adding and on each
    /// successful renewal; never moved back past a lease end that passed).
    pub(crate) fn set_valid_until(&self, until: tokio::time::Instant) {
        self.valid_until
            .store(clock::to_nanos(until), Ordering::Release);
    }

    /// A renewal sent in connection epoch `epoch` found the hold in place.
    pub(crate) fn confirm(&self, epoch: u32) {
        self.confirmed_in.swap(epoch, Ordering::AcqRel);
        self.renewals.fetch_add(1, Ordering::AcqRel);
        // The entry gate may wait for this (`renewed_after`).
        self.lost_changed.notify_waiters();
    }

    /// Marks the lock lost and wakes everyone watching for that: counted
    /// and warned about first, so that a watcher woken by it already sees
    /// the loss in `lock_lost_total`.
    pub(crate) fn mark_lost(&self) {
        if self.set_lost() && !self.closed.load(Ordering::Acquire) {
            meter::lost(&self.key);
            tracing::warn!(key = %self.key, fence = self.fence(), "lock lost while held");
        }
        self.lost_changed.notify_waiters();
    }

    /// Marks the hold lost without telling anyone (what [`mark_lost`](Self::mark_lost)
    /// does first; alone, for a release that found the hold gone after its
    /// last frame went): `true` if nothing had marked it lost before (a
    /// renewal answered in the same moment may have), so that one loss is
    /// told once.
    pub(crate) fn lost_at_release(&self) -> bool {
        let first = self.set_lost();
        self.lost_changed.notify_waiters();
        first
    }

    /// Sets the lost flag and ends the client-side lease, waking nobody:
    /// `true` if it was not set before.
    fn set_lost(&self) -> bool {
        let first = !self.lost.swap(true, Ordering::AcqRel);
        if first {
            self.valid_until.store(0, Ordering::Release);
        }
        first
    }

    /// Resolves when the lock is lost (never, if it stays held): when it is
    /// marked lost, or at its client-side lease end, whichever is first.
    pub(crate) async fn lost(&self) {
        loop {
            let changed = self.lost_changed.notified();
            if self.is_lost() {
                tracing::debug!(
                    key = %self.key, fence = self.fence(), marked = self.lost.load(Ordering::Acquire),
                    "lock lost (marked, or its client-side lease ended)"
                );
                return;
            }
            let until = self.valid_until.load(Ordering::Acquire);
            let left = until.saturating_sub(clock::now_nanos());
            match tokio::time::Instant::now().checked_add(std::time::Duration::from_nanos(left)) {
                Some(end) if until != u64::MAX => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(end) => {}
                    }
                }
                _ => changed.await,
            }
        }
    }
}

mod table;
#[cfg(test)]
mod tests;

pub(crate) use table::{HeldTable, Reentry, Released};
