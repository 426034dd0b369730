//! Puts whose fate is unknown, and the tombstones that make them harmless.
//!
//! Unlike commands on one Redis connection, etcd's gRPC calls from one
//! process are applied in no particular order: two calls run as two
//! streams, may go to two members, and a member may forward a proposal to
//! the leader long after the client gave up on it (a frozen follower
//! thawed, a stalled socket drained). So a put of `name/<holder>` that was
//! never answered (a timeout, a dropped connection) may still be applied
//! later, after the delete this process sent for the same key when it gave
//! the attempt up. The key would then be made again on a lease this
//! runtime keeps alive, and stand in the lock's queue for good: nobody owns
//! it, nobody deletes it.
//!
//! Every put of a holder's key is therefore conditional on that holder's
//! tombstone not existing, and the delete of a key whose put was never
//! answered writes the tombstone in the same transaction, on the lease the
//! unanswered put named. A late put then either finds the tombstone (its
//! lease is alive: so is the tombstone) or finds its lease gone (then it
//! fails by itself): in both cases it writes nothing. A tombstone lives as
//! long as that lease: one small key per unanswered put, gone with the
//! runtime's lease (or sooner, a fixed hold's).
//!
//! The other order, a late delete removing a key made again afterwards,
//! cannot happen: a holder id whose attempt failed is never put again (the
//! waiters make a new place, see `WaitTicket::abandon_place`), and a key is
//! only deleted after the last put of its id.
//!
//! Owns the record of unanswered puts and the tombstone's key; sends no
//! transaction itself (`release.rs` writes the tombstones).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::error::BackendError;

/// The tombstone of `holder`'s key in `lock`: `lock%gone/<holder>`. No lock
/// name made by `lock_name` contains `%g` (its `%` is always followed by
/// `25` or `2F`), so this is neither a lock's key nor in a lock's
/// directory `name/`: `etcdctl lock`, the queue reads and the watches never
/// see it.
pub(super) fn key(lock: &str, holder: &str) -> String {
    format!("{lock}%gone/{holder}")
}

/// Whether a failed request failed because a lease it named is gone.
pub(super) fn lease_gone(error: &BackendError) -> bool {
    format!("{error} {error:?}").contains("lease not found")
}

/// The keys whose put is out with no answer, and the lease each named.
#[derive(Debug, Default)]
pub(super) struct Unanswered {
    keys: Mutex<HashMap<String, i64>>,
}

impl Unanswered {
    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lease the unanswered put of `key` named, if there is one.
    pub(super) fn lease_of(&self, key: &str) -> Option<i64> {
        self.keys().get(key).copied()
    }

    /// `key`'s tombstone is written (or its lease is gone): a late put of
    /// it can write nothing any more.
    pub(super) fn settled(&self, key: &str) {
        self.keys().remove(key);
    }

    /// A put of `key` on `lease` goes out: unless [`PutOut::answered`] is
    /// called, it counts as unanswered (also when the future sending it is
    /// dropped midway).
    pub(super) fn put_out<'a>(&'a self, key: &'a str, lease: i64) -> PutOut<'a> {
        PutOut {
            unanswered: self,
            key,
            lease,
            answered: false,
        }
    }
}

/// A put on its way; see [`Unanswered::put_out`].
pub(super) struct PutOut<'a> {
    unanswered: &'a Unanswered,
    key: &'a str,
    lease: i64,
    answered: bool,
}

impl PutOut<'_> {
    /// etcd answered: the put was applied or refused, for good.
    pub(super) fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for PutOut<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.unanswered
                .keys()
                .insert(self.key.to_owned(), self.lease);
        }
    }
}
