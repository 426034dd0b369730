//! [`with_lock`]: a body run under a lock, in an owner scope of its own. This
//! is what `#[distributed_lock]` expands to (through `__private::locked`).

use std::future::Future;
use std::sync::Arc;

use crate::error::LockError;
use crate::held::HeldLock;
use crate::owner::{self, Scope};
use crate::request::{LockRequest, OnLost};

/// Runs `body` while holding the lock of `request`, and releases it after.
///
/// The body runs in an owner scope of its own, a child of the caller's, so
/// locked calls nested inside it re-enter, and [`fence`](crate::fence)
/// returns this lock's token there. Re-entry is strict nesting: two locked
/// calls on the same key running side by side inside the body (both arms of
/// a `join!`) do not both enter; the second waits, in the process and without
/// a round trip, until the first is done, then re-enters in turn.
/// If the lock is lost while the body runs, [`OnLost::Abort`] (the default)
/// drops the body at its next await and returns `Err(LockError::Lost)`;
/// [`OnLost::Continue`] lets it finish and logs the loss. A panic or a
/// cancelled call frees the lock through the runtime's background releaser.
///
/// This is what `#[distributed_lock]` expands to.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{lock, with_lock, LockError};
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// let total = with_lock(lock("cart:9"), async {
///     // Nested use of the same key re-enters instead of waiting on itself.
///     with_lock(lock("cart:9"), async { Ok::<_, LockError>(2) }).await
/// })
/// .await?;
/// assert_eq!(total, 2);
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub async fn with_lock<T, E, F>(request: LockRequest, body: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let on_lost = request.on_lost;
    // The body runs in a scope of its own, a child of the caller's.
    let node = owner::new_child();
    let guard = request.acquire_as(Some(node.clone())).await?;
    let scope = Scope {
        node,
        fence: Some(guard.fence()),
    };
    let body = owner::enter(scope, body);
    let result = match on_lost {
        OnLost::Abort => {
            let held: &Arc<HeldLock> = guard.held();
            tokio::select! {
                biased;
                result = body => result,
                () = guard.runtime().run(held.lost()) => {
                    let key = guard.key().to_owned();
                    let shut_down = guard.runtime().is_shut_down();
                    drop(guard);
                    return Err(if shut_down {
                        LockError::ShutDown
                    } else {
                        LockError::Lost { key }
                    }
                    .into());
                }
            }
        }
        OnLost::Continue => body.await,
    };
    match guard.release().await {
        Ok(()) => result,
        Err(LockError::Lost { key } | LockError::NotHeld { key })
            if on_lost == OnLost::Abort && result.is_ok() =>
        {
            Err(LockError::Lost { key }.into())
        }
        Err(LockError::ShutDown) if on_lost == OnLost::Abort && result.is_ok() => {
            Err(LockError::ShutDown.into())
        }
        Err(error) => {
            tracing::warn!(%error, "lock trouble after the body finished; returning its result");
            result
        }
    }
}
