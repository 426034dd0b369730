//! [`ManyGuard`]: every key of a multi-key request, held. Giving it back
//! gives back every key; dropping it releases each in the background.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::owner::{self, Node, Scope};

/// Every key of a [`ManyRequest`](crate::ManyRequest), held: one
/// [`LockGuard`] per key, in the order they were taken (sorted). Release it
/// with [`release`](Self::release), or drop it to release every key in the
/// background.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
/// let held = runtime.lock_many(["b", "a", "b"]).acquire().await?;
/// let tokens: Vec<(&str, u64)> = held.fences().collect();
/// assert_eq!(tokens.len(), 2); // "b" twice is one key
/// held.release().await?;
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[must_use = "the locks are released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct ManyGuard {
    guards: Vec<LockGuard>,
    /// The scope the keys are held in (it records them: see `many/`).
    node: Arc<Node>,
}

impl ManyGuard {
    pub(crate) fn new(guards: Vec<LockGuard>, node: Arc<Node>) -> Self {
        ManyGuard { guards, node }
    }

    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The keys, in the order they were taken.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// Each key with its fencing token, in the order they were taken. Each
    /// token grows for each new holder of its key: pass each to the storage
    /// its key guards.
    pub fn fences(&self) -> impl Iterator<Item = (&str, u64)> {
        self.guards.iter().map(|g| (g.key(), g.fence()))
    }

    /// One guard per key, in the order they were taken.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Whether any key's lock is lost: then the set is no longer held.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Resolves when any key's lock is lost (never while all stay held).
    pub async fn lost(&self) {
        let mut each: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = self
            .guards
            .iter()
            .map(|g| Box::pin(g.lost()) as Pin<Box<dyn Future<Output = ()> + Send + '_>>)
            .collect();
        poll_fn(|cx| {
            if each
                .iter_mut()
                .any(|lost| lost.as_mut().poll(cx).is_ready())
            {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// Runs `fut` as a nested call of this hold: locked calls inside it
    /// re-enter these keys (and may take keys that sort after them; see
    /// [`LockError::OrderRefused`]), and [`fences`](crate::fences) returns
    /// these keys' tokens there.
    pub fn scope<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> {
        owner::enter(self.body_scope(Node::child_of(Some(&self.node))), fut)
    }

    /// The scope a body under these keys runs in, as `node`.
    pub(crate) fn body_scope(&self, node: Arc<Node>) -> Scope {
        let fences: Arc<[(String, u64)]> = self.fences().map(|(k, t)| (k.to_owned(), t)).collect();
        Scope {
            node,
            fence: fences.first().map(|(_, t)| *t),
            fences: Some(fences),
            permit: owner::current().and_then(|s| s.permit),
        }
    }

    /// Every guard, to give back one by one.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }

    /// Gives every key back, the last taken first, and waits for the
    /// backend to confirm each. Every key is released whatever the others'
    /// answers; the first error is returned (see [`LockGuard::release`]).
    pub async fn release(self) -> Result<(), LockError> {
        let mut first = Ok(());
        for guard in self.guards.into_iter().rev() {
            let released = guard.release().await;
            if first.is_ok() {
                first = released;
            }
        }
        first
    }
}
