//! The table of held locks: per backend lock name, a stack of frames (one
//! per hold of an owner scope, innermost last), and the rules that read it:
//! strict-nesting re-entry, a read joining another task's read hold, the
//! downgrade when a write hold's last write frame goes, and what shutdown
//! closes. It decides which hold a request may take a frame of; whether the
//! task may enter that hold now is the entry gate's to say (`gate.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use super::{mode_byte, HeldLock};
use crate::cohort::{Cohort, Terms};
use crate::context::Runner;
use crate::mode::LockMode;
use crate::owner::Node;

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
