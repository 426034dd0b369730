//! The one error type of the crate.
//!
//! Every variant says what happened in words a caller can act on, and none of
//! them ever carries a Redis URL or password: connection details are reduced to
//! `host:port` before they reach an error.

use std::fmt;
use std::time::Duration;

/// Everything that can go wrong when taking, holding or releasing a lock.
///
/// ```
/// use lock_runtime::LockError;
/// let err = LockError::NotInstalled;
/// assert!(err.to_string().contains("install"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// No runtime was installed before an annotated fn or `lock_runtime::lock` was used.
    #[error(
        "no lock runtime is installed: call `LockRuntime::builder()...build().await?.install()` \
         or `lock_runtime::init_from_env().await` once at startup"
    )]
    NotInstalled,

    /// `install` was called a second time; the first runtime stays in place.
    #[error("a lock runtime is already installed; install it once, at startup")]
    AlreadyInstalled,

    /// The wait ran out without the lock: it was still held by someone
    /// else, or the backend could not be asked (then `cause` says so, with
    /// its last error: an outage must not read as contention).
    #[error("timed out after {} ms waiting for lock `{key}`{cause}", waited.as_millis())]
    Timeout {
        /// The key as the caller gave it (without the runtime's prefix).
        key: String,
        /// How long the caller waited.
        waited: Duration,
        /// What the wait saw besides a busy lock: backend failures, or a
        /// holder in this same process. Empty when neither.
        cause: TimeoutCause,
    },

    /// Not returned any more; kept so that code matching on it compiles.
    ///
    /// It meant: the wait ran out while a guard that the waiting task took
    /// with `acquire()` held the lock. But a guard is `Send`, and the runtime
    /// cannot see it move to another task, so it could not know that the
    /// waiting task still had it; a guard handed to a worker task was
    /// reported as this task's own. Such a wait now ends with
    /// [`LockError::Timeout`], and its start logs a warning naming the key
    /// when a guard this task took holds it (`docs/reentry.md`).
    #[error(
        "gave up after {} ms waiting for lock `{key}`, which a guard this same task took \
         with `acquire()` still holds. Run the call inside `guard.scope(...)` to re-enter, \
         or release the guard first (docs/reentry.md)",
        waited.as_millis()
    )]
    SelfDeadlock {
        /// The key as the caller gave it.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lock stopped being ours while it was held: it expired, was deleted
    /// (a force unlock, an etcd lease revoked, a ZooKeeper session ended),
    /// or the lock backend could not be reached before the lease ran out.
    #[error(
        "lock `{key}` was lost while held (it expired, was deleted, or the lock backend was \
         unreachable for longer than the lease); another holder may have entered"
    )]
    Lost {
        /// The key as the caller gave it.
        key: String,
    },

    /// A release found the lock not held by this owner (it expired, or belongs to another).
    #[error("lock `{key}` is not held by this owner (it expired or was taken over)")]
    NotHeld {
        /// The key as the caller gave it.
        key: String,
    },

    /// The key cannot be used as a lock key.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given (shortened when very long).
        key: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// The runtime was shut down ([`LockRuntime::shutdown`](crate::LockRuntime::shutdown)):
    /// it takes no more locks, and the locks it held were given back.
    #[error(
        "the lock runtime was shut down: it takes no more locks, and the locks it held \
         were released (a body still running when that happened was stopped)"
    )]
    ShutDown,

    /// A write (or exclusive) lock was asked inside a read hold of the same
    /// key in the same call chain. Upgrading in place is refused: two
    /// readers doing it at once would each wait for the other for ever.
    /// Take the write lock in the outer call (a writer may read), or finish
    /// the read first.
    #[error(
        "a write (or exclusive) lock of `{key}` was asked inside a read hold of it in the same \
         call chain: upgrading is refused, since two readers doing it at once would deadlock; \
         take the write lock in the outer call (a writer may read), or finish the read first"
    )]
    UpgradeRefused {
        /// The key as the caller gave it.
        key: String,
    },

    /// A lock was asked inside a multi-key call (`key = [...]`,
    /// [`with_locks`](crate::with_locks)) that holds a key sorting after it,
    /// and does not hold it: multi-key calls take their keys in sorted
    /// order, and going back in that order could wait for a key another
    /// multi-key call holds while it waits for one of ours. Add the key to
    /// the outer call's list instead.
    #[error(
        "lock `{key}` was asked inside a multi-key call that holds `{held}`, which sorts \
         after it: multi-key calls take their keys in sorted order, so taking `{key}` now \
         could deadlock with another multi-key call; add `{key}` to the outer call's keys"
    )]
    OrderRefused {
        /// The key asked for.
        key: String,
        /// The key held around it that sorts after it.
        held: String,
    },

    /// A setting is out of range or malformed (lease, wait, URL, prefix).
    #[error("invalid lock configuration: {0}")]
    InvalidConfig(String),

    /// The backend refused the lock for good: the user this runtime
    /// connects as has no permission on the lock's name (a Redis ACL user
    /// without the key pattern or a command, `NOPERM`; an etcd user whose
    /// role does not cover the name, "permission denied"; a ZooKeeper ACL
    /// on the lock's path, `NoAuth`). Waiting would not change that, so the
    /// acquire fails at once, whatever its wait. Grant the permission
    /// (docs/deploying.md lists what each backend needs); `source` is the
    /// backend's answer.
    ///
    /// ```
    /// # fn handle(error: lock_runtime::LockError) {
    /// if let lock_runtime::LockError::PermissionDenied { key, source } = &error {
    ///     eprintln!("this service may not lock `{key}`: {source}");
    /// }
    /// # }
    /// ```
    #[error(
        "permission denied for lock `{key}`: the lock backend refused it ({}); waiting would \
         not change that, so the acquire failed at once: give the user this runtime connects \
         as access to the lock's names (docs/deploying.md)",
        .source.what_failed()
    )]
    PermissionDenied {
        /// The key as the caller gave it.
        key: String,
        /// The backend's refusal.
        source: BackendError,
    },

    /// The backend failed (unreachable, refused, or answered something
    /// unexpected).
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// What a wait that ran out ([`LockError::Timeout`]) saw besides a lock
/// held elsewhere. Its `Display` is the end of the timeout's message (empty
/// when there is nothing to add).
///
/// ```
/// # fn handle(error: lock_runtime::LockError) {
/// if let lock_runtime::LockError::Timeout { cause, .. } = &error {
///     if let Some(last) = cause.backend_error() {
///         eprintln!("the lock backend is failing, not busy: {last}");
///     }
/// }
/// # }
/// ```
#[derive(Debug, Default)]
pub struct TimeoutCause(Option<Box<Cause>>);

#[derive(Debug, Default)]
struct Cause {
    /// The backend failed during the wait: its last error, and from when
    /// to when into the wait.
    backend: Option<(String, Duration, Duration)>,
    /// This process held the key when the wait ran out.
    held_here: bool,
}

impl TimeoutCause {
    /// `backend`: the last backend error seen while waiting, and when the
    /// failures began and last happened (time into the wait); `held_here`:
    /// whether this process holds the key.
    pub(crate) fn new(backend: Option<(String, Duration, Duration)>, held_here: bool) -> Self {
        if backend.is_none() && !held_here {
            return TimeoutCause(None);
        }
        TimeoutCause(Some(Box::new(Cause { backend, held_here })))
    }

    /// The last error of the backend during the wait, if it failed: the
    /// timeout is then (also) an outage, not only contention.
    pub fn backend_error(&self) -> Option<&str> {
        let (last, ..) = self.0.as_ref()?.backend.as_ref()?;
        Some(last)
    }

    /// Whether this same process held the key when the wait ran out (in a
    /// scope the waiting call does not belong to: another task, a guard, or
    /// the locked body that spawned the waiting task).
    pub fn held_by_this_process(&self) -> bool {
        self.0.as_ref().is_some_and(|c| c.held_here)
    }
}

impl fmt::Display for TimeoutCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(cause) = &self.0 else {
            return Ok(());
        };
        if let Some((last, since, until)) = &cause.backend {
            let (since, until) = (since.as_millis(), until.as_millis());
            f.write_str("; the lock backend failed during the wait (")?;
            if since == until {
                write!(f, "{since} ms into it")?;
            } else {
                write!(f, "from {since} to {until} ms into it")?;
            }
            write!(f, "), its last error: {last}")?;
        }
        if cause.held_here {
            f.write_str(
                "; this same process holds the lock, in a scope this call is not part of \
                 (another task, a guard, or the locked body that spawned this task: a task \
                 started with tokio::spawn does not re-enter its parent's lock; spawn \
                 lock_runtime::inherit(future) to make it a nested call, and run a call \
                 meant to re-enter a guard's hold inside guard.scope(future); \
                 docs/reentry.md)",
            )?;
        }
        Ok(())
    }
}

/// A failure of the lock backend, with the cause kept as `source()`.
///
/// Its message names the operation and the server as `host:port`, never a
/// password or full URL.
pub struct BackendError {
    context: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    /// A failed `sync_replicas` check (see [`BackendError::is_replica_sync_failure`]).
    replica_sync: bool,
    /// A refusal for lack of a permission (see [`BackendError::is_permission_denied`]).
    denied: bool,
}

impl BackendError {
    pub(crate) fn new(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        BackendError {
            context: context.into(),
            source: Some(Box::new(source)),
            replica_sync: false,
            denied: false,
        }
    }

    pub(crate) fn msg(context: impl Into<String>) -> Self {
        BackendError {
            context: context.into(),
            source: None,
            replica_sync: false,
            denied: false,
        }
    }

    /// A failed `sync_replicas` check: a waiting acquire reports it at once
    /// instead of retrying until its deadline.
    pub(crate) fn replica_sync(context: impl Into<String>) -> Self {
        BackendError {
            replica_sync: true,
            ..BackendError::msg(context)
        }
    }

    /// The same error, marked as a refusal for lack of a permission when
    /// `denied`: each backend says so where it turns its client's errors
    /// into this type (Redis `NOPERM`, etcd's "permission denied",
    /// ZooKeeper's `NoAuth`), and an acquire ends at once on it.
    pub(crate) fn denied_if(mut self, denied: bool) -> Self {
        self.denied = denied;
        self
    }

    /// Whether the backend refused for good: the user the runtime connects
    /// as has no permission on the names (or for a command) the operation
    /// needs. Trying again does not help; an acquire refused so ends at once
    /// with [`LockError::PermissionDenied`].
    ///
    /// ```
    /// # fn handle(error: lock_runtime::LockError) {
    /// if let lock_runtime::LockError::Backend(e) = &error {
    ///     if e.is_permission_denied() {
    ///         eprintln!("check the lock backend's ACLs: {e}");
    ///     }
    /// }
    /// # }
    /// ```
    pub fn is_permission_denied(&self) -> bool {
        self.denied
    }

    /// Whether the lock was taken, but fewer replicas than
    /// [`sync_replicas`](crate::LockRuntimeBuilder::sync_replicas) asks for
    /// acknowledged it in time, so it was released again (a failover could
    /// have lost it). The replicas are missing or lagging: check them.
    ///
    /// ```
    /// # fn handle(error: lock_runtime::LockError) {
    /// if let lock_runtime::LockError::Backend(e) = &error {
    ///     if e.is_replica_sync_failure() {
    ///         eprintln!("replicas are not keeping up: {e}");
    ///     }
    /// }
    /// # }
    /// ```
    pub fn is_replica_sync_failure(&self) -> bool {
        self.replica_sync
    }
}

impl BackendError {
    /// The same error, with `note` after what failed: what the runtime does
    /// about it.
    pub(crate) fn noting(mut self, note: &str) -> Self {
        self.context = format!("{} ({note})", self.context);
        self
    }

    /// What failed and why, without the "lock backend error" in front (for
    /// a message that says whose error it is already).
    pub(crate) fn what_failed(&self) -> String {
        match &self.source {
            Some(source) => format!("{}: {source}", self.context),
            None => self.context.clone(),
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lock backend error: {}", self.what_failed())
    }
}

impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendError")
            .field("context", &self.context)
            .field("source", &self.source)
            .finish()
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl LockError {
    pub(crate) fn invalid_key(key: &str, reason: &'static str) -> Self {
        const SHOWN: usize = 64;
        let mut shown: String = key.chars().take(SHOWN).collect();
        if shown.len() < key.len() {
            shown.push('…');
        }
        LockError::InvalidKey { key: shown, reason }
    }
}
