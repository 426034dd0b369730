//! The embedded backend: the lock scripts' semantics in one process.
//!
//! A mutex-protected map stands in for Redis: one entry per held lock (holder
//! id, hold count, expiry) and one fence counter per key that survives
//! releases. Expiry is checked when an entry is touched, exactly as a waiter
//! sees a Redis TTL run out; waiters are woken directly on release.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::{Acquire, LockNames, Release};
use crate::waiters::Waiters;

#[derive(Debug)]
struct Entry {
    holder: String,
    holds: u64,
    expires_at: Instant,
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<String, Entry>,
    fences: HashMap<String, u64>,
}

/// The in-process lock store of one runtime.
#[derive(Debug)]
pub(crate) struct MemoryBackend {
    state: Mutex<State>,
    waiters: Arc<Waiters>,
}

impl MemoryBackend {
    pub(crate) fn new(waiters: Arc<Waiters>) -> Self {
        MemoryBackend {
            state: Mutex::new(State::default()),
            waiters,
        }
    }

    /// Mirrors `acquire.lua`.
    pub(crate) fn acquire(&self, hash: &str, holder: &str, lease: Duration) -> Acquire {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let State { locks, fences } = &mut *state;
        if locks.get(hash).is_some_and(|e| e.expires_at <= now) {
            locks.remove(hash);
        }
        match locks.get_mut(hash) {
            None => {
                // As acquire.lua: max(counter + 1, the clock in µs).
                let counter = fences.entry(LockNames::fence(hash)).or_insert(0);
                *counter = counter.saturating_add(1).max(micros_since_epoch());
                let fence = *counter;
                locks.insert(
                    hash.to_owned(),
                    Entry {
                        holder: holder.to_owned(),
                        holds: 1,
                        expires_at: now + lease,
                    },
                );
                Acquire::Held {
                    fence,
                    handed: false,
                }
            }
            Some(entry) if entry.holder == holder => {
                entry.holds += 1;
                entry.expires_at = now + lease;
                let fence = fences.get(&LockNames::fence(hash)).copied().unwrap_or(0);
                Acquire::Held {
                    fence,
                    handed: false,
                }
            }
            Some(entry) => Acquire::Busy {
                ttl: Some(entry.expires_at - now),
            },
        }
    }

    /// Mirrors `release.lua`.
    pub(crate) fn release(&self, hash: &str, holder: &str) -> Release {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = state.locks.get_mut(hash) else {
            return Release::NotHeld;
        };
        if entry.holder != holder || entry.expires_at <= now {
            return Release::NotHeld;
        }
        entry.holds -= 1;
        if entry.holds > 0 {
            return Release::StillHeld;
        }
        state.locks.remove(hash);
        drop(state);
        self.waiters.wake_one(&LockNames::channel(hash));
        Release::Freed
    }

    /// Mirrors `renew.lua`.
    pub(crate) fn renew(&self, hash: &str, holder: &str, lease: Duration) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match state.locks.get_mut(hash) {
            Some(entry) if entry.holder == holder && entry.expires_at > now => {
                entry.expires_at = now + lease;
                true
            }
            _ => false,
        }
    }

    /// Deletes a lock whatever its holder (tests: a lock deleted under its holder).
    pub(crate) fn delete(&self, hash: &str) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let removed = state.locks.remove(hash).is_some();
        drop(state);
        if removed {
            self.waiters.wake_one(&LockNames::channel(hash));
        }
        removed
    }
}

fn micros_since_epoch() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
