//! The queue of background releases, which of them are not yet answered,
//! and whether they are failing (an outage, said once).
//!
//! A dropped guard hands its release to the Redis backend's background
//! releaser, which sends it a moment later. Without this record the same
//! process's next acquire of that key could reach Redis first and find its
//! own old hold still there: `let _ = lock(k).acquire().await` followed by
//! `lock(k).try_acquire()` said "busy" on Redis and succeeded on the
//! embedded backend, which frees at once. With it, an acquire first waits
//! (briefly, see `request.rs`) for the key's queued releases to be answered,
//! and a runtime being shut down or dropped waits for all of them.

use std::collections::{BTreeSet, HashMap};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{mpsc, Notify};

/// A queued background release: (lock hash, holder id, fair mode).
pub(crate) type ReleaseJob = (String, String, bool);

/// A queued background job that is a release or a downgrade (read-write
/// locks, issue 28): a queue of these keeps a dropped guard's downgrade
/// ahead of the later release of the same holder. etcd queues these; the
/// other backends still queue [`ReleaseJob`]s until they downgrade too.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) struct Job {
    /// The lock's backend name.
    pub(crate) lock_key: String,
    /// The holder id.
    pub(crate) holder: String,
    /// What to do.
    pub(crate) op: Op,
}

/// What a queued [`Job`] does.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) enum Op {
    /// Give the hold back (`fair`: hand the lock on).
    Release {
        /// Fair mode (etcd's releases need none: for the Redis family's).
        #[allow(dead_code)]
        fair: bool,
    },
    /// Turn the write hold into a read hold; a `NotHeld` answer marks the
    /// hold lost (if it still exists here).
    Downgrade(std::sync::Weak<crate::held::HeldLock>),
}

/// Where releases that nobody awaits go: the Redis backend's releaser task
/// (dropped guards, cancelled acquires, unused fair places). Every job is
/// counted as pending until the releaser has sent it and had an answer.
#[derive(Debug)]
pub(crate) struct ReleaseQueue<J = ReleaseJob> {
    jobs: mpsc::UnboundedSender<J>,
    pending: Arc<PendingReleases>,
}

impl<J> Clone for ReleaseQueue<J> {
    fn clone(&self) -> Self {
        ReleaseQueue {
            jobs: self.jobs.clone(),
            pending: self.pending.clone(),
        }
    }
}

impl<J> ReleaseQueue<J> {
    /// A queue, and the releaser's end of it.
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<J>) {
        let (jobs, receiver) = mpsc::unbounded_channel();
        let queue = ReleaseQueue {
            jobs,
            pending: Arc::new(PendingReleases::default()),
        };
        (queue, receiver)
    }

    /// Queues a job on `lock_key`, counted as pending like a release;
    /// `false` when the releaser has stopped.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn send_job(&self, lock_key: &str, job: J) -> bool {
        self.pending.add(lock_key);
        if self.jobs.send(job).is_ok() {
            return true;
        }
        self.pending.done([lock_key]);
        false
    }

    /// The releases queued and not yet answered.
    pub(crate) fn pending(&self) -> &Arc<PendingReleases> {
        &self.pending
    }
}

impl ReleaseQueue<ReleaseJob> {
    /// Queues a release; `false` when the releaser has stopped (the runtime
    /// is gone: the lease frees the lock).
    pub(crate) fn send(&self, lock_key: String, holder: String, fair: bool) -> bool {
        self.pending.add(&lock_key);
        match self.jobs.send((lock_key, holder, fair)) {
            Ok(()) => true,
            Err(mpsc::error::SendError((lock_key, _, _))) => {
                self.pending.done([lock_key.as_str()]);
                false
            }
        }
    }
}

/// Releases handed to the background releaser (or sent behind a locked
/// call) and not yet answered.
///
/// Two counts per lock. The releases an acquire of the lock in this
/// process waits for (*blocking*): not one that went out ahead of the
/// acquire on the same connection (`add_nonblocking`), nor one tried a few
/// times in vain that goes on being tried (`unblock`, ZooKeeper): the
/// acquire goes ahead. And every release not answered yet (*unanswered*):
/// what `shutdown` waits for, and names when its drain limit runs out. A
/// release ends answered (`done`) or given up unanswered (`given_up`); the
/// locks of those given up once shutdown began are named too
/// ([`unconfirmed`](Self::unconfirmed)): shutdown promised to confirm them.
#[derive(Debug, Default)]
pub(crate) struct PendingReleases {
    /// Unanswered releases, over all locks (a lock-free check for the
    /// common case).
    total: AtomicUsize,
    counts: Mutex<Counts>,
    /// Notified whenever a batch of them is answered (or given up).
    answered: Notify,
}

#[derive(Debug, Default)]
struct Counts {
    /// Per lock: the releases its acquires wait for.
    blocking: HashMap<String, usize>,
    /// Per lock: the releases not answered yet (blocking or not).
    unanswered: HashMap<String, usize>,
    /// The locks whose release was given up unanswered since
    /// [`record_given_up`](PendingReleases::record_given_up) (`None`
    /// before: nobody asks).
    given_up: Option<BTreeSet<String>>,
}

/// One less of `lock` in `counts`; whether it was there.
fn take_one(counts: &mut HashMap<String, usize>, lock: &str) -> bool {
    let Some(count) = counts.get_mut(lock) else {
        return false;
    };
    *count -= 1;
    if *count == 0 {
        counts.remove(lock);
    }
    true
}

impl PendingReleases {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a release of `lock_key` about to be queued.
    pub(crate) fn add(&self, lock_key: &str) {
        let mut counts = self.counts();
        *counts.blocking.entry(lock_key.to_owned()).or_default() += 1;
        *counts.unanswered.entry(lock_key.to_owned()).or_default() += 1;
        self.total.fetch_add(1, Ordering::AcqRel);
    }

    /// Records a release of `lock_key` that went out on the connection
    /// this process's next command on its lock goes through, ahead of that
    /// command (a locked call's release, `LockRuntime::release_behind`):
    /// the server applies it first, so an acquire need not wait for its
    /// answer. Shutdown still does.
    pub(crate) fn add_nonblocking(&self, lock_key: &str) {
        *self
            .counts()
            .unanswered
            .entry(lock_key.to_owned())
            .or_default() += 1;
        self.total.fetch_add(1, Ordering::AcqRel);
    }

    /// A release of `lock_key` counted by [`add`](Self::add) no longer holds
    /// up this process's acquires of the lock (it failed a few times and
    /// goes on being tried); it ends with
    /// [`done_nonblocking`](Self::done_nonblocking) or
    /// [`given_up_nonblocking`](Self::given_up_nonblocking).
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    pub(crate) fn unblock(&self, lock_key: &str) {
        take_one(&mut self.counts().blocking, lock_key);
        self.answered.notify_waiters();
    }

    /// Records that the releases of `hashes` were answered.
    pub(crate) fn done<'a>(&self, hashes: impl IntoIterator<Item = &'a str>) {
        self.end(hashes, true, false);
    }

    /// Records that the releases of `hashes` were given up unanswered
    /// (their locks are left to their leases).
    pub(crate) fn given_up<'a>(&self, hashes: impl IntoIterator<Item = &'a str>) {
        self.end(hashes, true, true);
    }

    /// Records that a release counted by
    /// [`add_nonblocking`](Self::add_nonblocking) (or
    /// [`unblock`](Self::unblock)ed) was answered (or handed to the
    /// background releaser, which counts it again).
    pub(crate) fn done_nonblocking(&self, lock_key: &str) {
        self.end([lock_key], false, false);
    }

    /// Records that a release [`unblock`](Self::unblock)ed was given up.
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    pub(crate) fn given_up_nonblocking(&self, lock_key: &str) {
        self.end([lock_key], false, true);
    }

    fn end<'a>(&self, hashes: impl IntoIterator<Item = &'a str>, blocking: bool, given_up: bool) {
        {
            let mut counts = self.counts();
            for lock_key in hashes {
                if blocking {
                    take_one(&mut counts.blocking, lock_key);
                }
                if take_one(&mut counts.unanswered, lock_key) {
                    self.total.fetch_sub(1, Ordering::AcqRel);
                }
                if given_up {
                    if let Some(locks) = &mut counts.given_up {
                        locks.insert(lock_key.to_owned());
                    }
                }
            }
        }
        self.answered.notify_waiters();
    }

    /// Whether a release of `lock_key` that its acquires wait for is queued
    /// and not yet answered.
    pub(crate) fn is_pending(&self, lock_key: &str) -> bool {
        self.total.load(Ordering::Acquire) > 0 && self.counts().blocking.contains_key(lock_key)
    }

    /// Resolves once no release of `lock_key` is pending (at once when none is).
    pub(crate) async fn settled(&self, lock_key: &str) {
        while self.is_pending(lock_key) {
            let mut answered = pin!(self.answered.notified());
            answered.as_mut().enable();
            if !self.is_pending(lock_key) {
                return;
            }
            answered.await;
        }
    }

    /// How many releases are unanswered, and the first `shown` of their locks.
    pub(crate) fn summary(&self, shown: usize) -> (usize, Vec<String>) {
        let counts = self.counts();
        let mut locks: Vec<String> = counts.unanswered.keys().take(shown).cloned().collect();
        locks.sort();
        (self.total.load(Ordering::Acquire), locks)
    }

    /// Resolves once no release at all is unanswered.
    pub(crate) async fn all_settled(&self) {
        loop {
            let mut answered = pin!(self.answered.notified());
            answered.as_mut().enable();
            if self.total.load(Ordering::Acquire) == 0 {
                return;
            }
            answered.await;
        }
    }

    /// From now on, the locks of releases given up unanswered are kept for
    /// [`unconfirmed`](Self::unconfirmed) (shutdown calls it first: it must
    /// not report `Ok` for a release nobody confirmed).
    pub(crate) fn record_given_up(&self) {
        self.counts().given_up.get_or_insert_with(BTreeSet::new);
    }

    /// The locks (backend names, sorted) of which a release is unanswered,
    /// or was given up since [`record_given_up`](Self::record_given_up).
    pub(crate) fn unconfirmed(&self) -> BTreeSet<String> {
        let counts = self.counts();
        let mut locks: BTreeSet<String> = counts.unanswered.keys().cloned().collect();
        locks.extend(counts.given_up.iter().flatten().cloned());
        locks
    }
}

/// Whether background releases are failing: a backend outage makes every
/// batch fail (a dropped guard's release, and the give-back of each failed
/// acquire attempt, about one a second per waiter), and a warning per batch
/// would repeat for as long as the outage lasts. So the first batch given
/// up says it, with what is still pending; the next ones are debug events;
/// a batch that goes through again ends the outage (one info event), and
/// the next failure is a new one.
#[derive(Debug, Default)]
pub(crate) struct ReleaseOutage {
    failing: AtomicBool,
    /// Releases given up (left to their leases) since the outage began.
    given_up: AtomicUsize,
}

/// An outage of background releases that are retried until the backend
/// answers (etcd, ZooKeeper): every failing release would otherwise warn
/// once (a waiter's give-backs alone make about one a second). The first
/// release past its quick attempts says it; the others are debug events
/// until one is answered again (one info event), and the next failure is a
/// new outage.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
#[derive(Debug, Default)]
pub(crate) struct RetriedOutage {
    failing: AtomicBool,
}

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
impl RetriedOutage {
    /// A release of `lock` failed past its quick attempts on `backend`
    /// (`etcd at host:port`), and goes on being retried.
    pub(crate) fn failing(&self, backend: &str, error: &dyn std::fmt::Display, lock: &str) {
        if self.failing.swap(true, Ordering::AcqRel) {
            tracing::debug!(%error, lock, "background release still failing; retrying");
            return;
        }
        tracing::warn!(
            %error,
            lock,
            "background releases fail: {backend} does not answer; they are retried until it \
             does (said once until one goes through again)"
        );
    }

    /// A release was answered: an outage, if there was one, is over.
    pub(crate) fn answered(&self, backend: &str) {
        if self.failing.swap(false, Ordering::AcqRel) {
            tracing::info!("background releases go through again on {backend}");
        }
    }
}

/// Lock names a warning lists at most.
const SHOWN_LOCKS: usize = 5;

impl ReleaseOutage {
    /// A batch of `count` releases failed after its retries: the locks are
    /// left to their leases. `pending` counts what is still unanswered.
    pub(crate) fn given_up(
        &self,
        error: &dyn std::fmt::Display,
        count: usize,
        pending: &PendingReleases,
    ) {
        self.given_up.fetch_add(count, Ordering::AcqRel);
        if self.failing.swap(true, Ordering::AcqRel) {
            tracing::debug!(%error, releases = count, "background releases still failing");
            return;
        }
        let (pending, locks) = pending.summary(SHOWN_LOCKS);
        tracing::warn!(
            %error,
            given_up = count,
            pending,
            locks = ?locks,
            "background releases fail: the locks of those given up are freed by their \
             leases instead (none of them is in use here); said once until releases go \
             through again"
        );
    }

    /// A batch was answered: an outage, if there was one, is over.
    pub(crate) fn went_through(&self) {
        if self.failing.swap(false, Ordering::AcqRel) {
            let given_up = self.given_up.swap(0, Ordering::AcqRel);
            tracing::info!(
                given_up,
                "background releases go through again; those given up during the outage \
                 were freed by their leases"
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::PendingReleases;

    #[tokio::test]
    async fn a_lock_is_settled_once_each_of_its_releases_is_answered() {
        let pending = PendingReleases::default();
        pending.settled("a").await;
        pending.add("a");
        pending.add("a");
        pending.add("b");
        assert!(pending.is_pending("a"));
        pending.done(["a"]);
        assert!(pending.is_pending("a"), "one release of `a` is still out");
        pending.done(["a", "b"]);
        pending.settled("a").await;
        pending.all_settled().await;
        assert!(!pending.is_pending("b"));
    }

    /// A release sent ahead of the next command on its connection holds
    /// up nobody's acquire, but shutdown still waits for its answer.
    #[tokio::test]
    async fn an_ordered_release_is_waited_for_by_shutdown_only() {
        let pending = std::sync::Arc::new(PendingReleases::default());
        pending.add_nonblocking("a");
        assert!(!pending.is_pending("a"));
        pending.settled("a").await;
        let all = tokio::spawn({
            let pending = pending.clone();
            async move { pending.all_settled().await }
        });
        tokio::task::yield_now().await;
        assert!(!all.is_finished());
        assert_eq!(pending.unconfirmed().into_iter().collect::<Vec<_>>(), ["a"]);
        pending.done_nonblocking("a");
        all.await.unwrap();
        assert!(pending.unconfirmed().is_empty());
    }

    /// A release that stops holding up acquires after failed tries is
    /// still unconfirmed for shutdown until it is answered.
    #[tokio::test]
    async fn an_unblocked_release_is_unconfirmed_until_answered() {
        let pending = PendingReleases::default();
        pending.add("a");
        pending.add("a");
        pending.unblock("a");
        assert!(
            pending.is_pending("a"),
            "the other release of `a` still blocks"
        );
        pending.done(["a"]);
        assert!(!pending.is_pending("a"));
        pending.settled("a").await;
        assert_eq!(pending.unconfirmed().into_iter().collect::<Vec<_>>(), ["a"]);
        pending.done_nonblocking("a");
        pending.all_settled().await;
        assert!(pending.unconfirmed().is_empty());
    }

    /// A release given up unanswered is unconfirmed once shutdown began
    /// recording (before, it was an outage that leases dealt with).
    #[tokio::test]
    async fn a_release_given_up_after_shutdown_began_stays_unconfirmed() {
        let pending = PendingReleases::default();
        pending.add("before");
        pending.given_up(["before"]);
        pending.record_given_up();
        pending.add("a");
        pending.add("b");
        pending.given_up(["a"]);
        pending.done(["b"]);
        pending.all_settled().await;
        assert_eq!(pending.unconfirmed().into_iter().collect::<Vec<_>>(), ["a"]);
    }
}
