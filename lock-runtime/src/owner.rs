//! Who holds a lock: owner scopes and holder ids.
//!
//! An *owner scope* is the unit of reentrancy. Every locked call
//! ([`with_lock`](crate::with_lock), `#[distributed_lock]`) runs its body in a
//! scope of its own (a `tokio::task_local!`), a child of the scope it was
//! called from; [`inherit`] gives a spawned task a child of the caller's
//! scope. Re-entry is strict nesting: a request re-enters a key only when the
//! innermost current hold of that key in this process belongs to the
//! requesting scope or one of its ancestors. A nested call re-enters; two
//! sibling calls (both arms of a `join!` inside a locked body) take turns,
//! waiting for each other in the process without a round trip; two top-level
//! calls exclude each other through the backend.
//!
//! A *holder id* is what the lock hash in Redis records: `<process-uuid>:<n>`,
//! with a random v4 UUID per process (unguessable by other clients) and a
//! counter per Redis-level hold. Nested holds are counted in process (see
//! `held.rs`), so one holder id stands for the whole nest.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

tokio::task_local! {
    static SCOPE: Option<Scope>;
}

/// One owner scope: its process-unique id and the scope it was opened in.
#[derive(Debug)]
pub(crate) struct Node {
    /// Process-unique id of the scope.
    pub(crate) id: u64,
    parent: Option<Arc<Node>>,
    /// Made for a guard taken outside any locked body (`acquire()` at top
    /// level): nothing runs inside it, so a wait for its hold in the same
    /// task can only end if the code that holds the guard lets it go.
    pub(crate) for_guard: bool,
    /// The keys a multi-key call holds in this scope, in their order (see
    /// [`out_of_order`]); `None` for every other scope.
    ordered: Option<Arc<[String]>>,
}

impl Node {
    /// A scope with no parent.
    #[cfg(test)]
    pub(crate) fn root() -> Arc<Node> {
        Node::child_of(None)
    }

    /// A new scope opened inside `parent` (a root when there is none).
    pub(crate) fn child_of(parent: Option<&Arc<Node>>) -> Arc<Node> {
        Node::child_holding(parent, None, false)
    }

    /// A new scope inside `parent` for a multi-key call that takes `keys`
    /// (sorted); `for_guard` as for [`current_or_root`].
    pub(crate) fn child_holding(
        parent: Option<&Arc<Node>>,
        ordered: Option<Arc<[String]>>,
        for_guard: bool,
    ) -> Arc<Node> {
        Arc::new(Node {
            id: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
            parent: parent.cloned(),
            for_guard,
            ordered,
        })
    }

    /// Whether `owner` is this scope or one of its ancestors.
    pub(crate) fn descends_from(&self, owner: u64) -> bool {
        let mut node = Some(self);
        while let Some(n) = node {
            if n.id == owner {
                return true;
            }
            node = n.parent.as_deref();
        }
        false
    }
}

/// Why `key` may not be taken in `node`: a multi-key call of the scope's
/// chain holds a key (named in the answer) that sorts after it, and none
/// of them holds `key` itself. Multi-key calls take their keys in sorted
/// order; a nested call that went back in that order could wait for a key
/// another multi-key call holds while that one waits for ours. `None`: it
/// may (no multi-key call around, a re-entry, or a key past them all).
pub(crate) fn out_of_order(node: &Node, key: &str) -> Option<String> {
    let mut above: Option<&str> = None;
    let mut scope = Some(node);
    while let Some(n) = scope {
        if let Some(keys) = &n.ordered {
            if keys.binary_search_by(|k| k.as_str().cmp(key)).is_ok() {
                return None;
            }
            let last = keys.last().map(String::as_str);
            if last.is_some_and(|last| last > key && above.is_none_or(|a| last > a)) {
                above = last;
            }
        }
        scope = n.parent.as_deref();
    }
    above.map(str::to_owned)
}

/// The owner scope a locked body runs in, plus the fencing tokens of the
/// innermost locks held there.
#[derive(Clone, Debug)]
pub(crate) struct Scope {
    /// The scope itself.
    pub(crate) node: Arc<Node>,
    /// Fencing token of the innermost held lock, if any (a multi-key
    /// call's: its first key's).
    pub(crate) fence: Option<u64>,
    /// Every key and token of the innermost multi-key call around, if any.
    pub(crate) fences: Option<Arc<[(String, u64)]>>,
    /// The key and permit index of the innermost permit call around, if
    /// any.
    pub(crate) permit: Option<HeldPermit>,
}

/// A permit a locked body holds: its key (as asked, not the permit's
/// lock's) and its index.
#[derive(Clone, Debug)]
pub(crate) struct HeldPermit {
    pub(crate) key: Arc<str>,
    pub(crate) index: u32,
}

static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);
static NEXT_HOLD: AtomicU64 = AtomicU64::new(1);

/// The scope the current task runs in, if any.
pub(crate) fn current() -> Option<Scope> {
    SCOPE.try_with(Clone::clone).ok().flatten()
}

/// The current scope, or a fresh root scope when none is active: who a
/// [`LockGuard`](crate::LockGuard) taken here belongs to.
pub(crate) fn current_or_root() -> Arc<Node> {
    match current() {
        Some(scope) => scope.node,
        None => Node::child_holding(None, None, true),
    }
}

/// A new child of the current scope (a root outside any): the scope of one
/// locked call's body.
pub(crate) fn new_child() -> Arc<Node> {
    Node::child_of(current().as_ref().map(|s| &s.node))
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

/// Runs `fut`, typically a spawned task, in a child of the caller's owner
/// scope, so that locks the caller holds are re-entered there instead of
/// waited for.
///
/// Without it a spawned task is a stranger: it waits for the caller's locks
/// like any other owner would. With it the task is a nested call of the
/// caller: its locked calls re-enter the caller's keys, and while one of them
/// runs, the caller's own later locked calls on that key wait for it (strict
/// nesting). The caller's code *outside* locked calls keeps running beside
/// the child, though: a holder that goes on working while an `inherit`ed
/// child holds the same key overlaps it; await the child before touching what
/// the lock protects.
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
    let child = current().map(|scope| Scope {
        node: Node::child_of(Some(&scope.node)),
        fence: scope.fence,
        fences: scope.fences,
        permit: scope.permit.clone(),
    });
    SCOPE.scope(child, fut)
}

/// The fencing token of the innermost lock held by the running locked body,
/// or `None` outside any locked body.
///
/// A guard from `acquire()` is not a locked body: take its token with
/// [`LockGuard::fence`](crate::LockGuard::fence), or run code inside
/// [`LockGuard::scope`](crate::LockGuard::scope), where `fence()` returns it.
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

/// The key and fencing token of every key the innermost multi-key locked
/// call around the running code holds (`key = [...]`,
/// [`with_locks`](crate::with_locks)), in the order they were taken (sorted);
/// empty outside any. Each key's token grows for each new holder of that
/// key: pass each to the storage its key guards. (Inside a single-key call
/// nested in a multi-key one, this is still the multi-key call's set;
/// [`fence`] is the nested call's token.)
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{fences, lock_many, with_locks, LockError};
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// let seen = with_locks(lock_many(["account:2", "account:1"]), async {
///     Ok::<_, LockError>(fences())
/// })
/// .await?;
/// let keys: Vec<&str> = seen.iter().map(|(key, _)| key.as_str()).collect();
/// assert_eq!(keys, ["account:1", "account:2"]);
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub fn fences() -> Vec<(String, u64)> {
    current()
        .and_then(|s| s.fences)
        .map_or_else(Vec::new, |f| f.to_vec())
}

/// Which permit the innermost permit call around the running code holds
/// (`permits = N`, [`LockRequest::permits`](crate::LockRequest::permits)):
/// its index, `0..N`, the same for the whole body; `None` outside any. A
/// call nested in a permit call's body sees the outer call's permit unless
/// it is a permit call itself.
///
/// The design notes' split of a hot item: with the stock of an item split
/// over `N` counters, the body works on counter `permit()`, and `N` buyers
/// proceed at once, each on a counter of its own.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{lock, permit, with_lock, LockError};
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// assert_eq!(permit(), None);
/// let segment = with_lock(lock("stock:7").permits(4), async {
///     Ok::<_, LockError>(permit())
/// })
/// .await?;
/// assert!(segment.is_some_and(|p| p < 4));
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub fn permit() -> Option<u32> {
    SCOPE
        .try_with(|scope| Some(scope.as_ref()?.permit.as_ref()?.index))
        .ok()
        .flatten()
}

/// The permit of `key` that the innermost permit call around the running
/// code holds, if it is one of `key`'s: an ordinary call on `key` nested
/// in it re-enters that permit (see `permits.rs`).
pub(crate) fn permit_held_of(key: &str) -> Option<u32> {
    let held = |scope: &Option<Scope>| {
        let permit = scope.as_ref()?.permit.as_ref()?;
        (&*permit.key == key).then_some(permit.index)
    };
    SCOPE.try_with(held).ok().flatten()
}
