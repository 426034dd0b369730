//! Asking about a lock: [`LockRuntime::inspect`] (what the backend records:
//! holder, holds, remaining lease, token, fair queue), [`LockRuntime::is_locked`],
//! and for the running owner scope [`held`] and [`hold_count`], the
//! questions Redisson users know as `isLocked`, `getHoldCount` and
//! `remainTimeToLive`.

use std::time::Duration;

use crate::error::LockError;
use crate::mode::LockMode;
use crate::names::LockNames;
use crate::owner;
use crate::runtime::LockRuntime;
use crate::who::ClientInfo;

/// What the backend records of a held lock ([`LockRuntime::inspect`]).
///
/// A snapshot: by the time it is read the lock may have changed hands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key as asked for.
    pub key: String,
    /// The holder id the backend records: `<process-uuid>:<n>`.
    pub holder: String,
    /// Whether the holder is this process (its uuid is this process's).
    pub held_by_this_process: bool,
    /// Holds recorded under the holder id. Nested holds of one process are
    /// counted in the process ([`hold_count`]), so this is usually 1.
    pub holds: u64,
    /// How long the lease has left in the backend, that is, until the key
    /// frees itself if nobody renews or releases it; `None` when it has no
    /// expiry. (On Redlock each master holds a key for the lease plus the
    /// clock-drift allowance, lease / 100 + 2 ms, so this can exceed the
    /// lease asked for by that much.)
    pub remaining_lease: Option<Duration>,
    /// Whether [`remaining_lease`](Self::remaining_lease) is only the
    /// longest it can be, not a count-down: on ZooKeeper it is the holder's
    /// session timeout, how long its node would outlive a holder that died
    /// now (ZooKeeper does not tell another client when a session was last
    /// heard from, so it stays the same, also once the holder has died).
    pub remaining_lease_is_bound: bool,
    /// The holder's fencing token, when recorded.
    pub fence: Option<u64>,
    /// Fair mode: the holder ids queued for the lock, oldest first (one per
    /// waiting process; empty on the embedded backend and in plain mode).
    pub queue: Vec<String>,
    /// [`LockMode::Read`] for a read hold, shared by [`readers`](Self::readers);
    /// [`LockMode::Write`] otherwise (an exclusive hold is a write hold: the
    /// same lock). For a read hold, `holder`, `remaining_lease` and `fence`
    /// describe the reader whose lease ends last (the one a writer waits for).
    pub mode: LockMode,
    /// Every holder of a read hold (empty for a write hold).
    pub readers: Vec<ReaderInfo>,
}

/// One holder of a read hold ([`LockInfo::readers`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReaderInfo {
    /// The reader's holder id: `<process-uuid>:<n>`.
    pub holder: String,
    /// Whether the reader is this process.
    pub held_by_this_process: bool,
    /// How long its lease has left in the backend.
    pub remaining_lease: Option<Duration>,
    /// Its fencing token, when recorded.
    pub fence: Option<u64>,
}

impl LockRuntime {
    /// What the backend records of the lock `key` now; `Ok(None)` when it
    /// is free. One read-only round trip on Redis.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
    /// assert!(runtime.inspect("order:42").await?.is_none());
    /// let guard = runtime.lock("order:42").acquire().await?;
    /// let info = runtime.inspect("order:42").await?.expect("held");
    /// assert!(info.held_by_this_process);
    /// assert_eq!(info.fence, Some(guard.fence()));
    /// assert!(info.remaining_lease.is_some());
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        crate::request::validate_key(key)?;
        let lock_key = self.backend_key(key);
        // A locked call of this process that returned before its release
        // was answered (`LockRuntime::release_behind`) reads as released
        // here, as its caller expects; briefly, as for an acquire.
        if self.behind().is_pending(&lock_key) {
            let settled = self.behind().settled(&lock_key);
            let _ = self
                .run(tokio::time::timeout(self.try_timeout(), settled))
                .await;
        }
        let recorded = self.run(self.backend().inspect(&lock_key)).await?;
        let mine = format!("{}:", owner::process_id());
        Ok(recorded.map(|r| LockInfo {
            key: key.to_owned(),
            held_by_this_process: r.holder.starts_with(&mine),
            holder: r.holder,
            holds: r.holds,
            remaining_lease: r.remaining,
            remaining_lease_is_bound: self.backend().lease_left_is_bound(),
            fence: r.fence,
            queue: r.queue,
            mode: r.mode,
            readers: r
                .readers
                .into_iter()
                .map(|reader| ReaderInfo {
                    held_by_this_process: reader.holder.starts_with(&mine),
                    holder: reader.holder,
                    remaining_lease: reader.remaining,
                    fence: reader.fence,
                })
                .collect(),
        }))
    }

    /// Which process a holder id belongs to, as its runtime published it
    /// (host, pid, [`client_name`](crate::LockRuntimeBuilder::client_name),
    /// start time); `Ok(None)` when it published nothing or is gone (its
    /// identity lives 30 s after its last refresh), and always on the
    /// embedded backend. One round trip; for tools like `lockctl`.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
    /// let _guard = runtime.lock("order:42").acquire().await?;
    /// let info = runtime.inspect("order:42").await?.expect("held");
    /// // The embedded store has nobody to tell: no identity is published.
    /// assert_eq!(runtime.client_of(&info.holder).await?, None);
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn client_of(&self, holder: &str) -> Result<Option<ClientInfo>, LockError> {
        let process = holder.split(':').next().unwrap_or(holder);
        let key = LockNames::identity(self.prefix(), process);
        let value = self.run(self.backend().read_identity(&key)).await?;
        Ok(value.as_deref().and_then(ClientInfo::parse))
    }

    /// Whether anybody holds the lock `key` now (any process).
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        Ok(self.inspect(key).await?.is_some())
    }

    /// How many holds of `key` in this runtime the running code is inside:
    /// holds of its owner scope and of the scopes it is nested in (0 outside
    /// any locked body, or when the lock was lost). No round trip.
    pub fn hold_count(&self, key: &str) -> usize {
        let Some(scope) = owner::current() else {
            return 0;
        };
        let lock_key = self.backend_key(key);
        self.table().holds_in(&lock_key, &scope.node)
    }
}

/// Whether the running code holds `key` on the global runtime: inside a
/// locked body (or [`LockGuard::scope`](crate::LockGuard::scope)) of that
/// key, directly or through the calls it is nested in. `false` when no
/// runtime is installed.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{held, hold_count, lock, with_lock, LockError};
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// assert!(!held("report"));
/// with_lock(lock("report"), async {
///     assert!(held("report"));
///     with_lock(lock("report"), async {
///         assert_eq!(hold_count("report"), 2); // nested: re-entered
///         Ok::<_, LockError>(())
///     })
///     .await
/// })
/// .await?;
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub fn held(key: &str) -> bool {
    hold_count(key) > 0
}

/// How many holds of `key` on the global runtime the running code is
/// inside ([`LockRuntime::hold_count`]); 0 when no runtime is installed.
pub fn hold_count(key: &str) -> usize {
    LockRuntime::global().map_or(0, |runtime| runtime.hold_count(key))
}
