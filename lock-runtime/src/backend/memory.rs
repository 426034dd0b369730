//! The embedded backend: the lock scripts' semantics in one process.
//!
//! A mutex-protected map stands in for Redis: one entry per held lock (holder
//! id, hold count, token, expiry) and one fence record per key (last token,
//! expiry). Expiry is checked when an entry is touched, exactly as a waiter
//! sees a Redis TTL run out; waiters are woken directly on release.
//!
//! The fence record lives as the Redis counter does (see `acquire.lua`):
//! `window` after its token was issued, so a process that locks a key per
//! order does not keep one record per order for good. Redis drops expired
//! keys by itself; here a sweep on acquire, at most once per window, drops
//! expired locks and fence records, so the maps hold about the keys used in
//! the last two windows (and the locks still held).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::{Acquire, Release, Wakeups};
use crate::mode::LockMode;

/// One held lock: a write hold (one holder) or a read hold (its readers).
#[derive(Debug)]
struct Entry {
    read: bool,
    holders: Vec<Holder>,
}

/// One holder id's hold (for a write hold, the Redis hash's fields; for a
/// read hold, one reader's).
#[derive(Debug)]
struct Holder {
    id: String,
    holds: u64,
    /// The hold's token.
    fence: u64,
    expires_at: Instant,
}

impl Entry {
    /// Drops holders whose lease has passed; `true` when none is left.
    fn prune(&mut self, now: Instant) -> bool {
        self.holders.retain(|h| h.expires_at > now);
        self.holders.is_empty()
    }

    /// When the last holder's lease ends (what a waiter sleeps until).
    fn expires_at(&self, now: Instant) -> Instant {
        self.holders
            .iter()
            .map(|h| h.expires_at)
            .max()
            .unwrap_or(now)
    }

    fn holder(&mut self, id: &str) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| h.id == id)
    }
}

/// The last token of a key, and when it may be forgotten.
#[derive(Debug)]
struct Fence {
    token: u64,
    expires_at: Instant,
}

#[derive(Debug)]
struct State {
    locks: HashMap<String, Entry>,
    /// By lock name (the hash), not by the Redis counter's name.
    fences: HashMap<String, Fence>,
    /// When the next acquire sweeps out what has expired.
    next_sweep: Instant,
}

impl State {
    /// The key's last token, unless its record expired (as a Redis `GET`).
    fn token(&self, lock_key: &str, now: Instant) -> u64 {
        self.fences
            .get(lock_key)
            .filter(|f| f.expires_at > now)
            .map_or(0, |f| f.token)
    }

    /// Issues the key's next token (as acquire.lua: max(counter + 1, the
    /// clock in µs)), recorded for `window`.
    fn next_token(&mut self, lock_key: &str, now: Instant, window: Duration) -> u64 {
        let fence = self
            .token(lock_key, now)
            .saturating_add(1)
            .max(micros_since_epoch());
        self.fences.insert(
            lock_key.to_owned(),
            Fence {
                token: fence,
                expires_at: now + window,
            },
        );
        fence
    }

    /// The key's live entry, with holders whose lease passed dropped.
    fn live(&mut self, lock_key: &str, now: Instant) -> Option<&mut Entry> {
        if self.locks.get_mut(lock_key)?.prune(now) {
            self.locks.remove(lock_key);
            return None;
        }
        self.locks.get_mut(lock_key)
    }

    /// Drops expired locks and fence records, at most once per `window`.
    fn sweep(&mut self, now: Instant, window: Duration) {
        if now < self.next_sweep {
            return;
        }
        self.locks.retain(|_, e| !e.prune(now));
        self.fences.retain(|_, f| f.expires_at > now);
        self.next_sweep = now + window;
    }
}

/// The in-process lock store of one runtime.
#[derive(Debug)]
pub(crate) struct MemoryBackend {
    state: Mutex<State>,
    wakeups: Weak<dyn Wakeups>,
    /// How long a fence record outlives its lock.
    window: Duration,
}

impl MemoryBackend {
    pub(crate) fn new(wakeups: Weak<dyn Wakeups>, window: Duration) -> Self {
        MemoryBackend {
            state: Mutex::new(State {
                locks: HashMap::new(),
                fences: HashMap::new(),
                next_sweep: Instant::now() + window,
            }),
            wakeups,
            window,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Mirrors `inspect.lua` (the embedded store keeps no fair queue). A
    /// read hold is described by the reader whose lease ends last (the one
    /// a writer waits for), and lists every reader.
    pub(crate) fn inspect(&self, lock_key: &str) -> Option<super::Recorded> {
        let now = Instant::now();
        let mut state = self.state();
        let entry = state.live(lock_key, now)?;
        let last = entry.holders.iter().max_by_key(|h| h.expires_at)?;
        let readers = if entry.read {
            entry
                .holders
                .iter()
                .map(|h| super::RecordedReader {
                    holder: h.id.clone(),
                    remaining: Some(h.expires_at - now),
                    fence: Some(h.fence),
                })
                .collect()
        } else {
            Vec::new()
        };
        Some(super::Recorded {
            holder: last.id.clone(),
            holds: last.holds,
            remaining: Some(last.expires_at - now),
            fence: Some(last.fence),
            queue: Vec::new(),
            mode: if entry.read {
                LockMode::Read
            } else {
                LockMode::Write
            },
            readers,
        })
    }

    /// Mirrors `acquire.lua` (and, for a read, the read script): a free key
    /// is taken; a holder id that holds it counts one more hold; a read
    /// joins the readers of a read hold with a token of its own; anything
    /// else is busy until the last holder's lease end.
    pub(crate) fn acquire(
        &self,
        lock_key: &str,
        holder: &str,
        lease: Duration,
        mode: LockMode,
    ) -> Acquire {
        let now = Instant::now();
        let read = mode.is_read();
        let mut guard = self.state();
        let state = &mut *guard;
        state.sweep(now, self.window);
        let fresh = |fence| Holder {
            id: holder.to_owned(),
            holds: 1,
            fence,
            expires_at: now + lease,
        };
        let held = |fence| Acquire::Held {
            fence,
            upto: fence,
            handed: false,
        };
        if let Some(entry) = state.live(lock_key, now) {
            if let Some(mine) = entry.holder(holder) {
                mine.holds += 1;
                mine.expires_at = now + lease;
                return held(mine.fence);
            }
            if !(read && entry.read) {
                return Acquire::Busy {
                    ttl: Some(entry.expires_at(now) - now),
                };
            }
        }
        // Free, or a read hold this read joins.
        let fence = state.next_token(lock_key, now, self.window);
        match state.locks.get_mut(lock_key) {
            Some(entry) => entry.holders.push(fresh(fence)),
            None => {
                let holders = vec![fresh(fence)];
                state
                    .locks
                    .insert(lock_key.to_owned(), Entry { read, holders });
            }
        }
        held(fence)
    }

    /// Mirrors `release.lua`: one hold of `holder` less; the key frees (and
    /// waiters are woken) when its last holder leaves. A reader that leaves
    /// other readers behind wakes nobody: the key is no freer for a writer.
    pub(crate) fn release(&self, lock_key: &str, holder: &str) -> Release {
        let now = Instant::now();
        let mut state = self.state();
        let Some(entry) = state.live(lock_key, now) else {
            return Release::NotHeld;
        };
        let Some(mine) = entry.holder(holder) else {
            return Release::NotHeld;
        };
        mine.holds -= 1;
        if mine.holds > 0 {
            return Release::StillHeld;
        }
        entry.holders.retain(|h| h.id != holder);
        if !entry.holders.is_empty() {
            return Release::Freed;
        }
        state.locks.remove(lock_key);
        drop(state);
        if let Some(wakeups) = self.wakeups.upgrade() {
            wakeups.released(lock_key);
        }
        Release::Freed
    }

    /// A downgrade: `holder`'s write hold becomes a read hold, keeping its
    /// token and lease, and the first local waiter is woken (a reader may
    /// join now). `false` when `holder` does not hold the key.
    pub(crate) fn downgrade(&self, lock_key: &str, holder: &str) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        let Some(entry) = state.live(lock_key, now) else {
            return false;
        };
        if entry.holder(holder).is_none() {
            return false;
        }
        if entry.read {
            return true;
        }
        entry.read = true;
        drop(state);
        if let Some(wakeups) = self.wakeups.upgrade() {
            wakeups.released(lock_key);
        }
        true
    }

    /// Mirrors `renew.lua`.
    pub(crate) fn renew(&self, lock_key: &str, holder: &str, lease: Duration) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        match state.live(lock_key, now).and_then(|e| e.holder(holder)) {
            Some(mine) => {
                mine.expires_at = now + lease;
                true
            }
            None => false,
        }
    }

    /// Mirrors `force_unlock.lua`: deletes a lock whatever its holders.
    pub(crate) fn delete(&self, lock_key: &str) -> bool {
        let mut state = self.state();
        let removed = state.live(lock_key, Instant::now()).is_some();
        state.locks.remove(lock_key);
        drop(state);
        if removed {
            if let Some(wakeups) = self.wakeups.upgrade() {
                wakeups.released(lock_key);
            }
        }
        removed
    }

    /// Locks and fence records in the store, expired or not (tests).
    #[cfg(test)]
    fn entries(&self) -> (usize, usize) {
        let state = self.state();
        (state.locks.len(), state.fences.len())
    }
}

fn micros_since_epoch() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);
    const WINDOW: Duration = Duration::from_millis(20);

    fn store() -> MemoryBackend {
        MemoryBackend::new(crate::backend::news::nobody(), WINDOW)
    }

    fn token(store: &MemoryBackend, lock_key: &str, holder: &str, lease: Duration) -> u64 {
        match store.acquire(lock_key, holder, lease, LockMode::Exclusive) {
            Acquire::Held { fence, .. } => fence,
            busy => panic!("{lock_key}: {busy:?}"),
        }
    }

    /// Waits out the window (a span of time, not an event: nothing to await).
    fn past_the_window() {
        std::thread::sleep(WINDOW + Duration::from_millis(5));
    }

    #[test]
    fn released_keys_leave_nothing_once_the_window_has_passed() {
        let store = store();
        for n in 0..2000 {
            let lock_key = format!("lock:{{order:{n}}}");
            token(&store, &lock_key, "h:1", LEASE);
            assert_eq!(store.release(&lock_key, "h:1"), Release::Freed);
        }
        past_the_window();
        token(&store, "lock:{next}", "h:2", LEASE);
        assert_eq!(store.entries(), (1, 1), "only the lock just taken is left");
    }

    #[test]
    fn a_lock_that_ran_out_is_dropped_with_its_fence_after_the_window() {
        let store = store();
        token(&store, "lock:{a}", "h:1", Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(10));
        past_the_window();
        token(&store, "lock:{b}", "h:2", LEASE);
        assert_eq!(store.entries(), (1, 1));
    }

    #[test]
    fn tokens_grow_across_the_window_and_a_long_hold_keeps_its_own() {
        let store = store();
        let lock_key = "lock:{k}";
        let first = token(&store, lock_key, "h:1", LEASE);
        assert_eq!(store.release(lock_key, "h:1"), Release::Freed);
        past_the_window();
        // (A lease of ten windows: a loaded machine may oversleep 15 ms by
        // more than a window, and the hold must not run out between two
        // renewals here.)
        let lease = Duration::from_millis(300);
        let second = token(&store, lock_key, "h:2", lease);
        assert!(second > first, "{second} <= {first}");
        // Renewed past the window: the key's record expires, the hold keeps
        // its token for a re-entry.
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(15));
            assert!(store.renew(lock_key, "h:2", lease));
        }
        assert_eq!(token(&store, lock_key, "h:2", LEASE), second, "re-entry");
        assert_eq!(store.release(lock_key, "h:2"), Release::StillHeld);
        assert_eq!(store.release(lock_key, "h:2"), Release::Freed);
        let third = token(&store, lock_key, "h:3", LEASE);
        assert!(third > second, "{third} <= {second}");
    }

    #[test]
    fn a_token_ahead_of_the_clock_is_kept_until_the_window_has_passed() {
        let store = store();
        let lock_key = "lock:{ahead}";
        token(&store, lock_key, "h:1", LEASE);
        // As if the clock had stepped back an hour after this token.
        let ahead = micros_since_epoch() + 3_600_000_000;
        store
            .state
            .lock()
            .unwrap()
            .fences
            .get_mut(lock_key)
            .unwrap()
            .token = ahead;
        assert!(store.delete(lock_key));
        assert_eq!(token(&store, lock_key, "h:2", LEASE), ahead + 1);
    }
}
