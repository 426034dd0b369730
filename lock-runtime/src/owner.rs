//! Who holds a lock: owner scopes and holder ids.
//!
//! An *owner scope* is the unit of reentrancy. The outermost locked call opens
//! one (a `tokio::task_local!`), and every locked call awaited inside its body
//! sees the same scope, so it re-enters instead of waiting on itself. Two
//! top-level calls polled by one task (both arms of a `join!`) each open their
//! own scope and exclude each other; a spawned task starts with no scope unless
//! the caller hands it over with [`inherit`].
//!
//! A *holder id* is what the lock hash in Redis records: `<process-uuid>:<n>`,
//! with a random v4 UUID per process (unguessable by other clients) and a
//! counter per Redis-level hold. Nested holds of one scope are counted in
//! process (see `held.rs`), so one holder id stands for the whole nest.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

tokio::task_local! {
    static SCOPE: Option<Scope>;
}

/// The owner scope a locked body runs in, plus the fencing token of the
/// innermost lock held there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scope {
    /// Process-unique id of the owner scope.
    pub(crate) owner: u64,
    /// Fencing token of the innermost held lock, if any.
    pub(crate) fence: Option<u64>,
}

static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);
static NEXT_HOLD: AtomicU64 = AtomicU64::new(1);

/// The scope the current task runs in, if any.
pub(crate) fn current() -> Option<Scope> {
    SCOPE.try_with(|s| *s).ok().flatten()
}

/// The current scope's owner, or a fresh owner when no scope is active.
pub(crate) fn current_or_new_owner() -> u64 {
    match current() {
        Some(scope) => scope.owner,
        None => NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
    }
}

/// Runs `fut` inside `scope`.
pub(crate) fn enter<F: Future>(scope: Scope, fut: F) -> impl Future<Output = F::Output> {
    SCOPE.scope(Some(scope), fut)
}

/// A fresh holder id, `<process-uuid>:<n>`.
pub(crate) fn new_holder_id() -> String {
    let n = NEXT_HOLD.fetch_add(1, Ordering::Relaxed);
    format!("{}:{n}", process_id())
}

/// The random id of this process, made once.
pub(crate) fn process_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| uuid::Uuid::new_v4().simple().to_string())
}

/// Carries the caller's owner scope into `fut`, typically a spawned task, so
/// that locks the caller holds are re-entered there instead of waited for.
///
/// Without it a spawned task is a stranger: it waits for the caller's locks
/// like any other owner would.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{fence, inherit, lock, with_lock, LockError};
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// with_lock(lock("report"), async {
///     let child = tokio::spawn(inherit(async {
///         // Same owner scope as the caller: this re-enters at once.
///         lock("report").acquire().await.map(|g| g.fence())
///     }));
///     let inner = child.await.expect("child task")?;
///     assert_eq!(Some(inner), fence());
///     Ok::<_, LockError>(())
/// })
/// .await?;
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub fn inherit<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    SCOPE.scope(current(), fut)
}

/// The fencing token of the innermost lock held by the running locked body,
/// or `None` outside any locked body.
///
/// Pass it to storage that rejects writes carrying a token lower than one it
/// has already seen: a holder that lost its lock (a long pause, a Redis
/// restart) then cannot overwrite the newer holder's work.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{fence, lock, with_lock};
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// assert_eq!(fence(), None);
/// let token = with_lock(lock("ledger"), async { Ok::<_, lock_runtime::LockError>(fence()) }).await?;
/// assert!(token.is_some());
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub fn fence() -> Option<u64> {
    current().and_then(|s| s.fence)
}
