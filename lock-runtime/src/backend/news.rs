//! What a backend tells the rest of the runtime, and what it is asked to
//! watch: releases and handoffs for the waiters (`Wakeups`, `Watched`,
//! `Watches`), and the fair places and connection epochs the watchdog
//! keeps (`Heartbeats`). Traits only: the waiter registry and the watchdog
//! implement them, the backends hold them, neither knows the other.

use std::sync::Arc;

use super::{PlaceRefresh, Refreshed};

/// What a backend tells this process's waiters. The waiter registry
/// (`waiters.rs`) implements it; a backend holds it weakly and knows nothing
/// else of the waiters. How the news arrives is the backend's business (a
/// Redis release channel; a watch on the predecessor for etcd or ZooKeeper).
pub(crate) trait Wakeups: Send + Sync {
    /// The lock `lock` was released: its first local waiter should try.
    fn released(&self, lock: &str);
    /// A fair release handed `lock` to `holder`, with token `fence` (and
    /// the tokens up to `upto` reserved for local holders).
    fn handed_over(&self, lock: &str, holder: &str, fence: u64, upto: u64);
    /// News may have been lost (a dropped connection): every waiter tries.
    fn connection_lost(&self);
}

/// Waiters nobody has, for tests that call a backend directly.
#[cfg(test)]
pub(crate) fn nobody() -> std::sync::Weak<dyn Wakeups> {
    struct Nobody;
    impl Wakeups for Nobody {
        fn released(&self, _: &str) {}
        fn handed_over(&self, _: &str, _: &str, _: u64, _: u64) {}
        fn connection_lost(&self) {}
    }
    std::sync::Weak::<Nobody>::new()
}

/// The waiters of one lock, as the backend's watch on its releases sees
/// them.
pub(crate) trait Watched: Send + Sync + std::fmt::Debug {
    /// Every waiter has left: a watch still being set up is not wanted.
    fn is_closed(&self) -> bool;
    /// The watch is in place, or could not be set up (waiters then rely on
    /// the holder's lease, which is slower but still correct).
    fn set_ready(&self);
    /// A watch that had failed went through: a release may have been
    /// missed, so the first waiter tries.
    fn wake_first(&self);
}

/// How the waiters reach the backend: watching a lock's releases while it
/// has local waiters, and giving back fair-queue places nobody uses. `None`
/// from [`Backend::start`] when the backend needs neither (the embedded
/// store wakes waiters directly).
pub(crate) trait Watches: Send + Sync + std::fmt::Debug {
    /// Start watching `lock`'s releases for `watched` (ready when set up).
    fn watch(&self, lock: &str, watched: Arc<dyn Watched>);
    /// Stop watching `lock`: nobody waits for it any more.
    fn unwatch(&self, lock: &str);
    /// Give back a fair-queue place (`holder`) of `lock` nobody uses: it
    /// leaves the queue, or frees the lock if it was handed over meanwhile.
    fn give_back_place(&self, lock: String, holder: String);
}

/// Fair-queue places that must be refreshed while their process waits: the
/// waiter registry says which are due, the watchdog sends them in its tick
/// (pipelined batches, like renewals) and reports back.
pub(crate) trait Heartbeats: Send + Sync {
    /// How many times the backend reported a lost connection so far: a
    /// server restarted empty, or a failover, shows as one. A hold confirmed
    /// (acquired or renewed) in an older epoch may be gone without this
    /// process knowing yet, so it is not passed between tasks (lock
    /// cohorting) until a renewal confirms it again.
    fn connection_epoch(&self) -> u32;
    /// Resolves at the next lost connection (the watchdog then renews
    /// every hold at once, so that each is confirmed again, or found lost,
    /// as soon as the backend answers).
    fn connection_lost_notified(&self) -> tokio::sync::futures::Notified<'_>;
    /// The places due at `now` (now marked in flight), and when the next
    /// one falls due.
    fn due_places(
        &self,
        now: tokio::time::Instant,
    ) -> (Vec<PlaceRefresh>, Option<tokio::time::Instant>);
    /// The outcome of refreshing `places`, sent at `sent_at` (`None`:
    /// unknown).
    fn places_refreshed(
        &self,
        places: &[PlaceRefresh],
        outcome: &[Option<Refreshed>],
        sent_at: tokio::time::Instant,
    );
}
