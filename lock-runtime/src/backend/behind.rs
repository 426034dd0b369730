//! Releases the caller does not wait for: each backend's background
//! releaser behind one set of calls (queue one, ask whether the key's are
//! answered, wait for them, name those given up at shutdown), and whether
//! this backend lets a locked call return before its release is answered.
//! The releasers themselves live in each backend; the record of what is
//! pending in `releases.rs`.

use super::Backend;

impl Backend {
    /// Releases without waiting for the outcome; callable from `Drop`, with
    /// or without a tokio context.
    pub(crate) fn release_in_background(&self, lock_key: String, holder: String, fair: bool) {
        match self {
            Backend::Redis(r) => r.release_in_background(lock_key, holder, fair),
            Backend::Memory(m) => {
                m.release(&lock_key, &holder);
            }
            Backend::Redlock(r) => r.release_in_background(lock_key, holder, fair),
            Backend::Sentinel(s) => s.release_in_background(lock_key, holder, fair),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.release_in_background(lock_key, holder, fair),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.release_in_background(lock_key, holder, fair),
        }
    }

    /// Whether a locked call may return before its release is answered
    /// (`LockRuntime::release_behind`): the Redis family and the embedded
    /// store. Not etcd or ZooKeeper: there this process's next acquire of
    /// the key waits for the answer anyway, and it did not measure faster.
    /// (The whole-wait stall once blamed on it was the bench's workers
    /// exiting without `shutdown`, their last release still behind them;
    /// they call it now. With it on, two interleaved `lock-bench s12` pairs
    /// on a loaded machine, off / on: S3 424 / 393 and 446 / 601
    /// acquisitions/s, wait max 115 / 268 and 115 / 114 ms: no clear gain.)
    pub(crate) fn releases_behind(&self) -> bool {
        match self {
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => false,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(_) => false,
            _ => true,
        }
    }

    /// Whether commands written one after another on this backend's
    /// connection are applied in that order, so that a release written
    /// before an acquire of the same key is applied first: one Redis
    /// server's connection. Not a Cluster (a redirected command is sent
    /// again later), Sentinel (the primary may change between the two),
    /// Redlock (a majority of several), etcd (one gRPC call may overtake
    /// another, see `etcd/tomb.rs`) or ZooKeeper (a release and an acquire
    /// may use different sessions); the embedded store frees at once.
    pub(crate) fn applies_in_order(&self) -> bool {
        match self {
            Backend::Redis(r) => !r.is_cluster(),
            _ => false,
        }
    }

    /// Whether a background release of `lock_key` is queued and not yet
    /// answered (never on the embedded backend, which frees at once).
    pub(crate) fn release_pending(&self, lock_key: &str) -> bool {
        match self {
            Backend::Redis(r) => r.pending().is_pending(lock_key),
            Backend::Memory(_) => false,
            Backend::Redlock(r) => r.release_pending(lock_key),
            Backend::Sentinel(s) => s.release_pending(lock_key),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.pending().is_pending(lock_key),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.pending().is_pending(lock_key),
        }
    }

    /// Resolves once every background release of `lock_key` queued so far has
    /// been answered.
    pub(crate) async fn releases_settled(&self, lock_key: &str) {
        match self {
            Backend::Redis(r) => r.pending().settled(lock_key).await,
            Backend::Redlock(r) => r.releases_settled(lock_key).await,
            Backend::Sentinel(s) => s.releases_settled(lock_key).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.pending().settled(lock_key).await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.pending().settled(lock_key).await,
            Backend::Memory(_) => {}
        }
    }

    /// Resolves once every background release queued so far has been
    /// answered.
    pub(crate) async fn all_releases_settled(&self) {
        match self {
            Backend::Redis(r) => r.pending().all_settled().await,
            Backend::Redlock(r) => r.all_releases_settled().await,
            Backend::Sentinel(s) => s.all_releases_settled().await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.pending().all_settled().await,
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.pending().all_settled().await,
            Backend::Memory(_) => {}
        }
    }

    /// From now on, background releases given up unanswered are named by
    /// [`unconfirmed_releases`](Self::unconfirmed_releases) (shutdown
    /// begins).
    pub(crate) fn record_given_up_releases(&self) {
        match self {
            Backend::Redis(r) => r.pending().record_given_up(),
            Backend::Redlock(r) => r.record_given_up_releases(),
            Backend::Sentinel(s) => s.record_given_up_releases(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.pending().record_given_up(),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.pending().record_given_up(),
            Backend::Memory(_) => {}
        }
    }

    /// The locks (backend names) of which a background release is not
    /// answered, or was given up unanswered since
    /// [`record_given_up_releases`](Self::record_given_up_releases).
    pub(crate) fn unconfirmed_releases(&self) -> std::collections::BTreeSet<String> {
        match self {
            Backend::Redis(r) => r.pending().unconfirmed(),
            Backend::Redlock(r) => r.unconfirmed_releases(),
            Backend::Sentinel(s) => s.unconfirmed_releases(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(e) => e.pending().unconfirmed(),
            #[cfg(feature = "zookeeper")]
            Backend::Zookeeper(z) => z.pending().unconfirmed(),
            Backend::Memory(_) => std::collections::BTreeSet::new(),
        }
    }
}
