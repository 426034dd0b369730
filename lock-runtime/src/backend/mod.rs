//! Where locks live: Redis, or the embedded in-process store.
//!
//! Both backends offer the same four operations with the same meaning (the
//! Lua scripts in `scripts/` define it; `memory.rs` mirrors them line by
//! line). Everything Redis-specific — connections, scripts, pub/sub,
//! reconnects — stays inside `redis.rs`; the rest of the crate only sees
//! [`Backend`].

pub(crate) mod memory;
pub(crate) mod redis;

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
    },
    /// Someone else holds it for about `ttl` more (None: no expiry known).
    Busy {
        /// Holder's remaining lease.
        ttl: Option<Duration>,
    },
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

/// Backend names of one lock. The user's key goes inside a `{hash tag}` so that
/// the hash, the fence counter and the channel of one lock land on one
/// Redis Cluster slot; the suffixes of the fence key and the channel can never
/// end in `}`, while a lock name always does, so no user key can name another
/// lock's fence or channel.
pub(crate) struct LockNames;

impl LockNames {
    /// The hash of `key` under `prefix`.
    pub(crate) fn hash(prefix: &str, key: &str) -> String {
        let mut name = String::with_capacity(prefix.len() + key.len() + 2);
        name.push_str(prefix);
        name.push('{');
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
}

impl Backend {
    /// One acquire attempt for `holder`.
    pub(crate) async fn acquire(
        &self,
        hash: &str,
        holder: &str,
        lease: Duration,
    ) -> Result<Acquire, BackendError> {
        match self {
            Backend::Redis(r) => r.acquire(hash, holder, lease).await,
            Backend::Memory(m) => Ok(m.acquire(hash, holder, lease)),
        }
    }

    /// Gives back one hold of `holder`.
    pub(crate) async fn release(&self, hash: &str, holder: &str) -> Result<Release, BackendError> {
        match self {
            Backend::Redis(r) => r.release(hash, holder).await,
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
    pub(crate) fn release_in_background(&self, hash: String, holder: String) {
        match self {
            Backend::Redis(r) => r.release_in_background(hash, holder),
            Backend::Memory(m) => {
                m.release(&hash, &holder);
            }
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
