//! What a backend answers and records, in the words every backend uses:
//! an acquire's reply, a release's, a fair place due for a refresh and what
//! the refresh found, and a lock's record as `inspect` reads it. Types only;
//! no backend's logic lives here.

use std::time::Duration;

use crate::mode::LockMode;

/// One acquire attempt, as every backend is asked it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ask<'a> {
    /// The lock's name in the backend.
    pub(crate) lock_key: &'a str,
    /// The holder id the attempt takes it under.
    pub(crate) holder: &'a str,
    /// The lease.
    pub(crate) lease: Duration,
    /// Whether the watchdog will renew it (a fixed lease must end on the
    /// server by itself: on etcd it gets an etcd lease of its own). Read
    /// by the etcd and ZooKeeper backends only.
    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    pub(crate) renewed: bool,
    /// How it treats the key's fair queue.
    pub(crate) queue: Queue,
    /// Read or write (exclusive).
    pub(crate) mode: LockMode,
}

/// One holder id's hold of a lock, as every backend is asked to give it
/// back or downgrade it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Holding<'a> {
    /// The lock's name in the backend.
    pub(crate) lock_key: &'a str,
    /// The holder id.
    pub(crate) holder: &'a str,
    /// Fair mode: hand the lock to the first in the key's queue (a queued
    /// holder id leaves the queue).
    pub(crate) fair: bool,
}

/// A runtime's identity to publish (`who.rs`): `value` under `key`, for
/// `ttl` where the backend gives keys a TTL.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Published<'a> {
    /// Where: `<prefix>client:<process-uuid>`.
    pub(crate) key: &'a str,
    /// What: one `field=value` a line.
    pub(crate) value: &'a str,
    /// How long it lives without a refresh (Redis family, etcd).
    pub(crate) ttl: Duration,
}

#[cfg(test)]
impl<'a> Ask<'a> {
    /// An ask from its parts, in the order the backends' tests write them.
    pub(crate) fn of(
        lock_key: &'a str,
        holder: &'a str,
        (lease, renewed): (Duration, bool),
        queue: Queue,
        mode: LockMode,
    ) -> Self {
        Ask {
            lock_key,
            holder,
            lease,
            renewed,
            queue,
            mode,
        }
    }
}

#[cfg(test)]
impl<'a> Holding<'a> {
    /// A hold from its parts, for the backends' tests.
    pub(crate) fn of(lock_key: &'a str, holder: &'a str, fair: bool) -> Self {
        Holding {
            lock_key,
            holder,
            fair,
        }
    }
}

/// Reply of an acquire attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// The lock is ours; `fence` is the fencing token of this hold.
    Held {
        /// Fencing token.
        fence: u64,
        /// The last token reserved for holders this process passes the
        /// lock to (`fence` when none is; see `cohort.rs`).
        upto: u64,
        /// Fair mode: it was already held under this holder id (handed over
        /// by a release), rather than taken just now.
        handed: bool,
    },
    /// Someone else holds it for about `ttl` more (None: no expiry known).
    Busy {
        /// Holder's remaining lease.
        ttl: Option<Duration>,
    },
}

/// How long a fair-mode queue entry stays valid without a refresh. A waiting
/// process refreshes its entries three times as often; an entry of a waiter
/// that died is skipped once it has run out.
pub(crate) const QUEUE_ENTRY_LIFE: Duration = Duration::from_secs(3);

/// How an acquire attempt treats the key's fair queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queue {
    /// Plain mode: no queue.
    No,
    /// Fair mode, trying once: take the lock if free and nobody is queued.
    Peek,
    /// Fair mode, waiting: join the queue (or refresh the entry) when busy;
    /// a release hands the lock over with this lease.
    Join(Duration),
}

/// Reply of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// The lock is free now, and waiters were told.
    Freed,
    /// We still hold it (more holds recorded in the backend).
    StillHeld,
    /// It was not ours: expired, deleted, or taken over.
    NotHeld,
}

/// A waiting process's place in a key's fair queue, due for a refresh (see
/// [`Heartbeats`]).
#[derive(Clone, Debug)]
pub(crate) struct PlaceRefresh {
    /// The lock's backend name.
    pub(crate) lock_key: String,
    /// The place's holder id.
    pub(crate) holder: String,
    /// The lease a release hands the lock to it with.
    pub(crate) lease: Duration,
    /// A reader's place (Redis: a reader is told to try when it may come
    /// in beside other readers).
    pub(crate) read: bool,
}

/// What a refresh found of one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refreshed {
    /// Still queued (refreshed); `false`: dequeued (handed the lock, or its
    /// entry dropped).
    pub(crate) queued: bool,
    /// The lock's remaining lease in ms as Redis `PTTL` gives it (-2: free,
    /// -1: no expiry).
    pub(crate) lock_ttl: i64,
}

/// What the backend records of a held lock (see [`Backend::inspect`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// Holder id: `<process-uuid>:<n>`.
    pub(crate) holder: String,
    /// Holds recorded under it (nested holds of one process count once).
    pub(crate) holds: u64,
    /// Remaining lease; `None` when it has no expiry.
    pub(crate) remaining: Option<Duration>,
    /// The hold's fencing token, when recorded.
    pub(crate) fence: Option<u64>,
    /// Fair mode: holder ids queued for the lock, oldest first.
    pub(crate) queue: Vec<String>,
    /// Read (shared by `readers`) or write.
    pub(crate) mode: LockMode,
    /// The holders of a read hold, `holder` among them (empty for a write
    /// hold).
    pub(crate) readers: Vec<RecordedReader>,
}

/// One holder of a read hold, as the backend records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecordedReader {
    pub(crate) holder: String,
    pub(crate) remaining: Option<Duration>,
    pub(crate) fence: Option<u64>,
}
