//! Where locks live: Redis, or the embedded in-process store.
//!
//! Both backends offer the same four operations with the same meaning (the
//! Lua scripts in `scripts/` define it; `memory.rs` mirrors them line by
//! line). Everything Redis-specific — connections, scripts, pub/sub,
//! reconnects — stays inside `redis.rs`; the rest of the crate only sees
//! [`Backend`].

pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod releases;

use std::sync::Arc;
use std::time::Duration;

use crate::error::BackendError;
use crate::held::HeldLock;

/// Reply of an acquire attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// The lock is ours; `fence` is the fencing token of this hold.
    Held {
        /// Fencing token.
        fence: u64,
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

/// The backend of one runtime.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    /// A Redis server.
    Redis(redis::RedisBackend),
    /// The embedded store.
    Memory(Arc<memory::MemoryBackend>),
}

/// Backend names of one lock.
///
/// The user's key goes inside a `{hash tag}`: `<prefix>{<key>}`, with
/// `:fence`, `:released`, `:queue` and `:queued` appended for the fence
/// counter, the release channel and the fair mode's queue and queue entries.
/// - No collisions: a lock name always ends in `}` and the other two never do,
///   and the prefix may not contain braces, so every name maps back to exactly
///   one key and role.
/// - One cluster slot: Redis hashes the text between the first `{` and the
///   next `}`, which lies inside the common start `<prefix>{<key>}` of all
///   three names. Only a key starting with `}` would make that text empty (and
///   Redis then hashes whole names, splitting the lock across slots), so a key
///   starting with `}` or with the escape `\` gets one `\` in front:
///   `}x` → `{\}x}`, `\x` → `{\\x}`. That keeps the mapping one-to-one.
pub(crate) struct LockNames;

impl LockNames {
    /// The hash of `key` under `prefix`.
    pub(crate) fn hash(prefix: &str, key: &str) -> String {
        let mut name = String::with_capacity(prefix.len() + key.len() + 2);
        name.push_str(prefix);
        name.push('{');
        if key.starts_with(['}', '\\']) {
            name.push('\\');
        }
        name.push_str(key);
        name.push('}');
        name
    }

    /// The fence counter of the lock named `hash`.
    pub(crate) fn fence(hash: &str) -> String {
        format!("{hash}:fence")
    }

    /// The release channel of the lock named `hash`.
    pub(crate) fn channel(hash: &str) -> String {
        format!("{hash}:released")
    }

    /// The lock named by a release channel (inverse of [`channel`](Self::channel)).
    pub(crate) fn hash_of_channel(channel: &str) -> &str {
        channel.strip_suffix(":released").unwrap_or(channel)
    }

    /// The fair mode's queue (a list of holder ids) of the lock named `hash`.
    pub(crate) fn queue(hash: &str) -> String {
        format!("{hash}:queue")
    }

    /// The fair mode's queue entries (holder id -> expiry and lease).
    pub(crate) fn queued(hash: &str) -> String {
        format!("{hash}:queued")
    }
}

impl Backend {
    /// One acquire attempt for `holder`. `queue` asks for the fair mode: when
    /// the lock is busy the holder id joins (or stays in) the key's queue.
    /// The embedded backend, where this process is the only contender and the
    /// local waiter queue is already first come first served, ignores it.
    pub(crate) async fn acquire(
        &self,
        hash: &str,
        holder: &str,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquire, BackendError> {
        match self {
            Backend::Redis(r) => r.acquire(hash, holder, lease, queue).await,
            Backend::Memory(m) => Ok(m.acquire(hash, holder, lease)),
        }
    }

    /// Gives back one hold of `holder` (`fair`: hand the lock to the first in
    /// the key's queue; for a queued holder id, leave the queue).
    pub(crate) async fn release(
        &self,
        hash: &str,
        holder: &str,
        fair: bool,
    ) -> Result<Release, BackendError> {
        match self {
            Backend::Redis(r) => r.release(hash, holder, fair).await,
            Backend::Memory(m) => Ok(m.release(hash, holder)),
        }
    }

    /// One round trip (Redis `PING`; nothing for the embedded store).
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        match self {
            Backend::Redis(r) => r.ping().await,
            Backend::Memory(_) => Ok(()),
        }
    }

    /// Deletes the lock whoever holds it; `true` when there was one.
    pub(crate) async fn force_unlock(&self, hash: &str) -> Result<bool, BackendError> {
        match self {
            Backend::Redis(r) => r.force_unlock(hash).await,
            Backend::Memory(m) => Ok(m.delete(hash)),
        }
    }

    /// Releases without waiting for the outcome; callable from `Drop`, with
    /// or without a tokio context.
    pub(crate) fn release_in_background(&self, hash: String, holder: String, fair: bool) {
        match self {
            Backend::Redis(r) => r.release_in_background(hash, holder, fair),
            Backend::Memory(m) => {
                m.release(&hash, &holder);
            }
        }
    }

    /// Whether a background release of `hash` is queued and not yet
    /// answered (never on the embedded backend, which frees at once).
    pub(crate) fn release_pending(&self, hash: &str) -> bool {
        match self {
            Backend::Redis(r) => r.pending().is_pending(hash),
            Backend::Memory(_) => false,
        }
    }

    /// Resolves once every background release of `hash` queued so far has
    /// been answered.
    pub(crate) async fn releases_settled(&self, hash: &str) {
        if let Backend::Redis(r) = self {
            r.pending().settled(hash).await;
        }
    }

    /// Resolves once every background release queued so far has been
    /// answered.
    pub(crate) async fn all_releases_settled(&self) {
        if let Backend::Redis(r) = self {
            r.pending().all_settled().await;
        }
    }

    /// Renews every lock of `batch` in one round trip: `Some(true)` renewed,
    /// `Some(false)` not ours any more, `None` unknown (that command failed).
    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        match self {
            Backend::Redis(r) => r.renew_many(batch).await,
            Backend::Memory(m) => Ok(batch
                .iter()
                .map(|l| Some(m.renew(&l.hash, &l.holder, l.lease)))
                .collect()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::LockNames;

    #[test]
    fn names_share_a_nonempty_hash_tag_and_never_collide() {
        let keys = [
            "a", "a}:fence", "}", "}x", "\\}x", "\\x", "x{y}z", "{", "a:fence", "\n",
        ];
        let mut names = std::collections::HashSet::new();
        for key in keys {
            let hash = LockNames::hash("lock:", key);
            let fence = LockNames::fence(&hash);
            let channel = LockNames::channel(&hash);
            assert_eq!(LockNames::hash_of_channel(&channel), hash);
            let queue = LockNames::queue(&hash);
            let queued = LockNames::queued(&hash);
            for name in [&hash, &fence, &channel, &queue, &queued] {
                assert!(names.insert(name.clone()), "{name} named twice");
                let open = name.find('{').unwrap();
                let close = open + 1 + name[open + 1..].find('}').unwrap();
                assert!(close > open + 1, "empty hash tag in {name}");
                assert_eq!(
                    &name[..=close],
                    &hash[..=close],
                    "{name}: other slot than {hash}"
                );
            }
        }
    }
}
