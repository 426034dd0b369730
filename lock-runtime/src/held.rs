//! Locks this runtime holds, and in-process reentrancy.
//!
//! Every lock held through this runtime has one [`HeldLock`], shared by the
//! guard(s) holding it and by the watchdog. The table keeps, per lock, a stack
//! of *frames*: one per hold, naming the owner scope it belongs to, innermost
//! last. A request re-enters (a local count, no round trip) when the innermost
//! frame belongs to its scope or an ancestor of it (strict nesting, see
//! `owner.rs`); when only an outer frame does, a sibling is inside, and the
//! request waits here for the frames to change. The outer hold's lease is
//! renewed by the watchdog for as long as any frame is alive, and the backend
//! sees one hold. A lost lock is never re-entered: the next acquire goes to
//! the backend again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::cohort::{Cohort, Run, Terms};
use crate::context::Runner;
use crate::meter;
use crate::mode::LockMode;
use crate::owner::Node;

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
        let left = self
            .valid_until
            .load(Ordering::Acquire)
            .saturating_sub(clock::to_nanos(now));
        Duration::from_nanos(left) >= (self.lease / 2).min(crate::cohort::LEFT_TO_PASS)
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
        if self.confirmed_in.swap(epoch, Ordering::AcqRel) != epoch {
            // Re-entries wait for this after a lost connection.
            self.lost_changed.notify_waiters();
        }
    }

    /// Resolves once the hold is confirmed in the connection epoch that
    /// `epoch` reads (the current one), is lost, or has no frame left
    /// (released meanwhile: the caller asks the table again).
    pub(crate) async fn confirmed_or_lost(&self, epoch: impl Fn() -> u32) {
        loop {
            let changed = self.lost_changed.notified();
            if self.confirmed_in(epoch()) || self.holds.load(Ordering::Acquire) == 0 {
                return;
            }
            tokio::select! {
                () = changed => {}
                () = self.lost() => return,
            }
        }
    }

    /// Marks the lock lost and wakes everyone watching for that.
    pub(crate) fn mark_lost(&self) {
        if self.lost_at_release() && !self.closed.load(Ordering::Acquire) {
            meter::lost(&self.key);
            tracing::warn!(key = %self.key, fence = self.fence(), "lock lost while held");
        }
    }

    /// Marks the hold lost without telling anyone (what [`mark_lost`](Self::mark_lost)
    /// does first; alone, for a release that found the hold gone after its
    /// last frame went): `true` if nothing had marked it lost before (a
    /// renewal answered in the same moment may have), so that one loss is
    /// told once.
    pub(crate) fn lost_at_release(&self) -> bool {
        let first = !self.lost.swap(true, Ordering::AcqRel);
        if first {
            self.valid_until.store(0, Ordering::Release);
        }
        self.lost_changed.notify_waiters();
        first
    }

    /// Resolves when the lock is lost (never, if it stays held): when it is
    /// marked lost, or at its client-side lease end, whichever is first.
    pub(crate) async fn lost(&self) {
        loop {
            let changed = self.lost_changed.notified();
            if self.is_lost() {
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

/// One hold of a lock by one owner scope.
#[derive(Debug)]
struct Frame {
    id: u64,
    owner: u64,
    /// What this frame asked for: a read frame may sit in a write hold (a
    /// writer reading what it writes).
    mode: LockMode,
    /// The task that took this hold, if it was taken for a guard outside
    /// any locked body (see `taken_by_this_task`): where the guard started,
    /// not where it is now.
    task: Option<Runner>,
    held: Arc<HeldLock>,
}

/// What [`HeldTable::reenter`] found.
#[derive(Debug)]
pub(crate) enum Reentry {
    /// Re-entered: the hold, and the id of the new frame (for the release).
    Held(Arc<HeldLock>, u64),
    /// A hold of an ancestor scope is there, but a sibling's frame is
    /// innermost: wait for the frames to change.
    Sibling,
    /// A write (or exclusive) hold was asked inside a read hold of this
    /// scope's ancestry: an upgrade, refused (two readers upgrading at once
    /// would wait for each other for ever).
    Refused,
    /// No live hold of this scope's ancestry: ask the backend.
    No,
}

/// What giving back one frame left of its hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// Other frames keep the hold as it was (or shutdown gave it back
    /// already).
    Kept,
    /// The hold's last write frame went while read frames of it remain: it
    /// is a read hold now, and the backend must be told (a downgrade).
    Downgraded,
    /// It was the hold's last frame: the backend hold must be released.
    Last,
}

/// The held locks of one runtime, by backend lock name.
#[derive(Debug, Default)]
pub(crate) struct HeldTable {
    locks: Mutex<HashMap<String, Vec<Frame>>>,
    /// Requests waiting for a sibling's frame to go.
    sibling_waiters: AtomicUsize,
    /// Notified when a frame goes while such requests wait.
    frames_changed: Notify,
}

static NEXT_FRAME: AtomicU64 = AtomicU64::new(1);

fn new_frame(owner: &Node, held: Arc<HeldLock>, mode: LockMode) -> Frame {
    Frame {
        id: NEXT_FRAME.fetch_add(1, Ordering::Relaxed),
        owner: owner.id,
        mode,
        task: guard_task(owner),
        held,
    }
}

/// The task that holds `owner`'s guards, if it is one (see `Frame::task`).
fn guard_task(owner: &Node) -> Option<Runner> {
    owner.for_guard.then(crate::context::runner).flatten()
}

impl HeldTable {
    fn locks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Frame>>> {
        self.locks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Re-enters `lock_key` for `scope`, asking for `mode`, when a live hold
    /// of the key belongs to `scope` or an ancestor of it (strict nesting),
    /// a new frame owned by `scope`, no round trip (not entered yet: the
    /// caller passes it through the entry gate, `gate.rs`).
    ///
    /// The hold is the one of the innermost frame of that ancestry. A write
    /// re-enters only a write hold (inside a read hold it is an upgrade:
    /// [`Reentry::Refused`]), and only while no frame of another branch
    /// (a scope not in this ancestry) is in the hold, before or after that
    /// ancestry's frames; when this ancestry's innermost frame is a read
    /// and another branch is inside, it is an upgrade too, refused. A read
    /// re-enters a read hold always (readers share), and a write hold unless
    /// a sibling writes inside it after that frame. Otherwise a sibling is
    /// inside: [`Reentry::Sibling`].
    pub(crate) fn reenter(&self, lock_key: &str, scope: &Node, mode: LockMode) -> Reentry {
        let mut locks = self.locks();
        let Some(frames) = locks.get_mut(lock_key) else {
            return Reentry::No;
        };
        let Some(at) = frames
            .iter()
            .rposition(|f| !f.held.is_lost() && scope.descends_from(f.owner))
        else {
            return Reentry::No;
        };
        let held = frames[at].held.clone();
        if !mode.is_read() && held.mode().is_read() {
            return Reentry::Refused;
        }
        let sibling = |f: &&Frame| Arc::ptr_eq(&f.held, &held) && !scope.descends_from(f.owner);
        let sibling_inside = if mode.is_read() {
            frames[at + 1..]
                .iter()
                .filter(sibling)
                .any(|f| !f.mode.is_read())
        } else {
            // A write enters only while no other branch is inside the hold,
            // wherever its frame is: a sibling's read taken before this
            // branch's own read frame is still inside. Asked inside a read
            // frame of its own (a read nested in a write hold) beside such
            // a sibling, it is an upgrade: two branches doing it at once
            // would wait for each other for ever, so it is refused.
            let any = frames.iter().any(|f| sibling(&f));
            if any && frames[at].mode.is_read() {
                return Reentry::Refused;
            }
            any
        };
        if sibling_inside {
            return Reentry::Sibling;
        }
        // (Whether the backend confirmed it since the last lost connection
        // is the entry gate's to ask, when the task enters: `gate.rs`.)
        held.holds.fetch_add(1, Ordering::Relaxed);
        let frame = new_frame(scope, held.clone(), mode);
        let id = frame.id;
        frames.push(frame);
        Reentry::Held(held, id)
    }

    /// Joins a read hold of `lock_key` that another task of this process
    /// has, for `scope` asking a read on `terms` (see
    /// [`HeldLock::may_join`]): the hold and the new frame's id, or `None`
    /// (ask the backend).
    pub(crate) fn join(
        &self,
        lock_key: &str,
        scope: &Node,
        (terms, limits): (Terms, Cohort),
        epoch: u32,
    ) -> Option<(Arc<HeldLock>, u64)> {
        let mut locks = self.locks();
        let frames = locks.get_mut(lock_key)?;
        // (The latest hold: the one with the most lease left.)
        let held = frames
            .iter()
            .rev()
            .map(|f| &f.held)
            .find(|held| {
                !held.closed.load(Ordering::Acquire) && held.may_join(terms, limits, epoch)
            })?
            .clone();
        held.holds.fetch_add(1, Ordering::Relaxed);
        let frame = new_frame(scope, held.clone(), LockMode::Read);
        let id = frame.id;
        frames.push(frame);
        Some((held, id))
    }

    /// Waits until a frame of any lock goes (or `deadline` passes), after a
    /// [`Reentry::Sibling`]. Spurious wake-ups are possible: ask again.
    pub(crate) async fn frames_changed(
        &self,
        lock_key: &str,
        scope: &Node,
        deadline: Option<tokio::time::Instant>,
        mode: LockMode,
    ) -> Reentry {
        self.sibling_waiters.fetch_add(1, Ordering::AcqRel);
        let _waiting = SiblingWait(self);
        loop {
            let changed = self.frames_changed.notified();
            match self.reenter(lock_key, scope, mode) {
                Reentry::Sibling => {}
                other => return other,
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d, changed).await.is_err() {
                        return Reentry::Sibling;
                    }
                }
                None => changed.await,
            }
        }
    }

    /// Records a fresh backend hold of `owner`; returns its frame id.
    ///
    /// The backend gave the key to a new holder id of ours: any other hold
    /// of the key this process still counts as live is gone on the server
    /// (freed by force, or lost without a renewal noticing yet, and taken
    /// again by this acquire), so it is marked lost here. Otherwise it
    /// could still be passed to a local waiter or re-entered, beside the
    /// new hold. Read holds are the exception: two of them share the key.
    /// (`current`: the backend's word on the new hold is of the current
    /// connection epoch. News from before a lost connection says nothing
    /// about the server of now: the hold must first be confirmed, see
    /// `gate.rs`, and no other hold is marked lost for it.)
    pub(crate) fn insert(&self, held: Arc<HeldLock>, owner: &Node, current: bool) -> u64 {
        let mode = held.mode();
        let frame = new_frame(owner, held, mode);
        let id = frame.id;
        let mut gone: Vec<Arc<HeldLock>> = Vec::new();
        {
            let mut locks = self.locks();
            let frames = locks.entry(frame.held.lock_key.clone()).or_default();
            for other in frames.iter() {
                let shared = mode.is_read() && other.held.mode().is_read();
                if current
                    && other.held.holder != frame.held.holder
                    && !shared
                    && !other.held.is_lost()
                    && !gone.iter().any(|g| Arc::ptr_eq(g, &other.held))
                {
                    gone.push(other.held.clone());
                }
            }
            frames.push(frame);
        }
        for held in gone {
            held.mark_lost();
        }
        id
    }

    /// Records a hold passed to `owner` by another task of this process (lock
    /// cohorting); returns its frame id. The frame names no task until the
    /// new holder takes it ([`HeldTable::taken`]).
    pub(crate) fn insert_passed(&self, held: Arc<HeldLock>, owner: &Node) -> u64 {
        // The previous holder's last frame took the count to zero.
        held.holds.store(1, Ordering::Relaxed);
        let mode = held.mode();
        let mut frame = new_frame(owner, held, mode);
        frame.task = None;
        let id = frame.id;
        self.locks()
            .entry(frame.held.lock_key.clone())
            .or_default()
            .push(frame);
        id
    }

    /// The task running now took the passed hold of frame `frame`.
    pub(crate) fn taken(&self, lock_key: &str, frame: u64, owner: &Node) {
        if let Some(f) = self
            .locks()
            .get_mut(lock_key)
            .and_then(|frames| frames.iter_mut().find(|f| f.id == frame))
        {
            f.task = guard_task(owner);
        }
    }

    /// Gives back the hold of frame `frame`: [`Released::Last`] when it was
    /// the last hold of `held` (the backend hold must now be released),
    /// [`Released::Downgraded`] when only read frames of a write hold are
    /// left (the hold turns read here, under the table's lock, so exactly one
    /// caller tells the backend).
    pub(crate) fn release(&self, held: &Arc<HeldLock>, frame: u64) -> Released {
        let mut locks = self.locks();
        if held.closed.load(Ordering::Acquire) {
            // `close_all` took every frame and gave the lock back.
            return Released::Kept;
        }
        let mut downgraded = false;
        if let Some(frames) = locks.get_mut(&held.lock_key) {
            frames.retain(|f| f.id != frame);
            let mine = || frames.iter().filter(|f| Arc::ptr_eq(&f.held, held));
            if !held.mode().is_read() && mine().next().is_some() && mine().all(|f| f.mode.is_read())
            {
                held.mode
                    .store(mode_byte(LockMode::Read), Ordering::Release);
                downgraded = true;
            }
            if frames.is_empty() {
                locks.remove(&held.lock_key);
            }
        }
        let last = held.holds.fetch_sub(1, Ordering::Relaxed) <= 1;
        drop(locks);
        if last {
            // A re-entry waiting for this hold's confirmation asks the table
            // again: the hold is gone, so it goes to the backend.
            held.lost_changed.notify_waiters();
        }
        if self.sibling_waiters.load(Ordering::Acquire) > 0 {
            self.frames_changed.notify_waiters();
        }
        match (last, downgraded) {
            (true, _) => Released::Last,
            (false, true) => Released::Downgraded,
            (false, false) => Released::Kept,
        }
    }

    /// How many live holds of `lock_key` belong to `scope` or the scopes it
    /// is nested in.
    pub(crate) fn holds_in(&self, lock_key: &str, scope: &Node) -> usize {
        self.locks().get(lock_key).map_or(0, |frames| {
            frames
                .iter()
                .filter(|f| !f.held.is_lost() && scope.descends_from(f.owner))
                .count()
        })
    }

    /// Whether this runtime holds `lock_key` (a live hold, in any scope).
    pub(crate) fn holds(&self, lock_key: &str) -> bool {
        self.locks()
            .get(lock_key)
            .is_some_and(|frames| frames.iter().any(|f| !f.held.is_lost()))
    }

    /// Whether a live hold of `lock_key` was taken for a guard, outside any
    /// locked body, by the task running now: if that task still has the
    /// guard, a wait for it ends only if the task's own code lets the guard
    /// go. (A locked call of this task that holds the key is not counted:
    /// the waiter then runs beside its body, a `join!` arm, and the body's
    /// end frees it.)
    ///
    /// A hint, never a verdict: a guard is `Send`, and nothing tells the
    /// runtime when one moves to another task (no code of ours runs on a
    /// move, and a guard is not polled), so a task that took a guard and
    /// handed it to a worker looks exactly like one that still holds it.
    /// The waiter gets a warning that says "if"; its wait ends with
    /// `Timeout`, never with `SelfDeadlock` (`acquire/mod.rs`, `gave_up`).
    pub(crate) fn taken_by_this_task(&self, lock_key: &str) -> bool {
        let Some(task) = crate::context::runner() else {
            return false;
        };
        self.locks().get(lock_key).is_some_and(|frames| {
            frames
                .iter()
                .any(|f| f.task == Some(task) && !f.held.is_lost())
        })
    }

    /// Whether any frame of `held` is left in the table. A downgrade that
    /// found nothing is a loss only while one is: once the last read frame
    /// went, its release may have reached the backend before the downgrade
    /// (both were decided here, under the table's lock, in that order), and
    /// the key was freed by its holder, not lost.
    pub(crate) fn has_frames(&self, held: &Arc<HeldLock>) -> bool {
        self.locks()
            .get(&held.lock_key)
            .is_some_and(|frames| frames.iter().any(|f| Arc::ptr_eq(&f.held, held)))
    }

    /// Takes every frame out of the table and returns each lock held (once),
    /// marked closed: its guards will not release it again. For shutdown.
    pub(crate) fn close_all(&self) -> Vec<Arc<HeldLock>> {
        let mut closed: Vec<Arc<HeldLock>> = Vec::new();
        {
            let mut locks = self.locks();
            for (_, frames) in locks.drain() {
                for frame in frames {
                    if !frame.held.closed.swap(true, Ordering::AcqRel) {
                        closed.push(frame.held);
                    }
                }
            }
        }
        self.frames_changed.notify_waiters();
        closed
    }

    /// Number of distinct backend holds.
    pub(crate) fn len(&self) -> usize {
        let locks = self.locks();
        let mut seen = 0;
        for frames in locks.values() {
            for (i, f) in frames.iter().enumerate() {
                if !frames[..i].iter().any(|g| Arc::ptr_eq(&g.held, &f.held)) {
                    seen += 1;
                }
            }
        }
        seen
    }
}

/// Counts a request among the sibling waiters while it waits.
struct SiblingWait<'a>(&'a HeldTable);

impl Drop for SiblingWait<'_> {
    fn drop(&mut self) {
        self.0.sibling_waiters.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    use crate::{LockError, LockRuntime};

    /// Every warning, as its fields written out.
    #[derive(Clone, Default)]
    struct Warnings(Arc<Mutex<Vec<String>>>);

    impl Warnings {
        fn all(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    struct Fields(String);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={value:?} ", field.name()));
        }
    }

    impl Subscriber for Warnings {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            if *event.metadata().level() == Level::WARN {
                let mut fields = Fields(String::new());
                event.record(&mut fields);
                self.0.lock().unwrap().push(fields.0);
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// One loss is told once (warning and `lock_lost_total`), whichever
    /// notices it first: a renewal's verdict or the release behind a
    /// locked call, which may be answered in the same moment.
    #[tokio::test(flavor = "current_thread")]
    async fn a_loss_found_by_renewal_and_release_at_once_is_told_once() {
        let warnings = Warnings::default();
        let _default = tracing::subscriber::set_default(warnings.clone());
        let runtime = LockRuntime::builder().memory().build().await.unwrap();
        let renewal_first = runtime.lock("a").acquire().await.unwrap();
        renewal_first.held().mark_lost();
        assert!(
            !renewal_first.held().lost_at_release(),
            "the release counted a loss the renewal had counted"
        );
        let release_first = runtime.lock("b").acquire().await.unwrap();
        assert!(release_first.held().lost_at_release());
        assert!(release_first.is_lost());
        release_first.held().mark_lost();
        let told: Vec<String> = warnings
            .all()
            .into_iter()
            .filter(|w| w.contains("lock lost while held"))
            .collect();
        assert_eq!(told.len(), 1, "{told:?}");
    }

    /// The likely mistake, a wait for a guard the same task took (here the
    /// future of a `block_on`, told by its waker), is named in a warning when
    /// the wait starts, with the way out; the wait itself ends in `Timeout`.
    #[tokio::test(flavor = "current_thread")]
    async fn a_wait_for_a_guard_this_task_took_is_warned_and_times_out() {
        let warnings = Warnings::default();
        let _default = tracing::subscriber::set_default(warnings.clone());
        let runtime = LockRuntime::builder().memory().build().await.unwrap();
        let _guard = runtime.lock("order:7").acquire().await.unwrap();
        let waited = runtime
            .lock("order:7")
            .wait(Duration::from_millis(50))
            .acquire()
            .await
            .map(drop);
        assert!(
            matches!(waited, Err(LockError::Timeout { .. })),
            "{waited:?}"
        );
        let warned = warnings.all();
        assert!(
            warned
                .iter()
                .any(|w| w.contains("key=order:7") && w.contains("guard.scope")),
            "{warned:?}"
        );
    }

    /// A task that did not take the guard (a spawned task, waiting for the
    /// guard of the `block_on` that spawned it) is not warned.
    #[tokio::test(flavor = "current_thread")]
    async fn a_wait_for_a_guard_another_task_took_is_not_warned() {
        let warnings = Warnings::default();
        let _default = tracing::subscriber::set_default(warnings.clone());
        let runtime = LockRuntime::builder().memory().build().await.unwrap();
        let _guard = runtime.lock("order:7").acquire().await.unwrap();
        let rt = runtime.clone();
        let waited = tokio::spawn(async move {
            rt.lock("order:7")
                .wait(Duration::from_millis(50))
                .acquire()
                .await
                .map(drop)
        })
        .await
        .unwrap();
        assert!(
            matches!(waited, Err(LockError::Timeout { .. })),
            "{waited:?}"
        );
        assert_eq!(warnings.all(), Vec::<String>::new());
    }

    /// A read joins another task's read hold only when that hold is a
    /// renewed read hold on the same terms, fit to enter now (confirmed in
    /// the current connection epoch, not lost), and within the cohort
    /// limits.
    #[test]
    fn a_read_joins_only_a_confirmed_live_read_hold_on_its_terms_within_the_limits() {
        use super::{HeldLock, HeldTable, Hold};
        use crate::cohort::{Cohort, Terms};
        use crate::mode::LockMode;
        use crate::owner::Node;

        let lease = Duration::from_secs(30);
        let hold = |mode| {
            HeldLock::new(Hold {
                key: "k".to_owned(),
                lock_key: "lock:{k}".to_owned(),
                holder: format!("p:{mode:?}"),
                owner: 1,
                fence: 7,
                upto: 7,
                since: tokio::time::Instant::now(),
                epoch: 3,
                lease,
                renew: true,
                fair: true,
                mode,
            })
        };
        let terms = Terms {
            lease,
            fair: true,
            read: true,
        };
        let limits = Cohort {
            handoffs: 2,
            budget: Duration::from_secs(60),
        };
        let table = HeldTable::default();
        let read = hold(LockMode::Read);
        table.insert(read.clone(), &Node::root(), true);
        let join = |terms, epoch| table.join("lock:{k}", &Node::root(), (terms, limits), epoch);
        // A connection was lost since the hold was last confirmed (epoch 3).
        assert!(join(terms, 4).is_none());
        // Other terms.
        let longer = Terms {
            lease: lease * 2,
            ..terms
        };
        assert!(join(longer, 3).is_none());
        let write = Terms {
            read: false,
            ..terms
        };
        assert!(join(write, 3).is_none());
        // Twice, then the limit.
        let (held, _) = join(terms, 3).unwrap();
        assert_eq!(held.fence(), 7);
        assert!(join(terms, 3).is_some());
        assert!(join(terms, 3).is_none(), "past the cohort limit");
        // A lost hold is never joined.
        let other = HeldTable::default();
        let lost = hold(LockMode::Read);
        other.insert(lost.clone(), &Node::root(), true);
        lost.mark_lost();
        assert!(other
            .join("lock:{k}", &Node::root(), (terms, limits), 3)
            .is_none());
        // Nor a write hold.
        let writes = HeldTable::default();
        writes.insert(hold(LockMode::Write), &Node::root(), true);
        assert!(writes
            .join("lock:{k}", &Node::root(), (terms, limits), 3)
            .is_none());
    }
}
