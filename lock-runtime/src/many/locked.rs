//! [`with_locks`]: a body run holding every key of a [`ManyRequest`], in the
//! scope that records them. The body's watch for a loss and each key's
//! release after it are `locked.rs`'s, key by key.

use std::future::Future;

use tracing::Instrument;

use super::{ManyGuard, ManyRequest};
use crate::error::LockError;
use crate::locked::{lost_or_shut_down, release_after, unless_lost};
use crate::owner;
use crate::request::OnLost;

/// Runs `body` while holding every key of `request`, and releases them
/// after: [`with_lock`](crate::with_lock) for several keys, taken all or
/// none in sorted order (see [`ManyRequest`]).
///
/// Inside the body, [`fences`](crate::fences) gives each key's token and
/// [`fence`](crate::fence) the first key's; nested calls re-enter these
/// keys, and may take keys that sort after them (a key that sorts before
/// one of them is refused with [`LockError::OrderRefused`]). One key lost
/// while the body runs is the call lost, as [`OnLost`] says.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{lock_many, with_locks, LockError};
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// let moved = with_locks(lock_many(["account:1", "account:2"]), async {
///     // Both accounts are held here: move the money.
///     Ok::<_, LockError>(10)
/// })
/// .await?;
/// assert_eq!(moved, 10);
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub async fn with_locks<T, E, F>(request: ManyRequest, body: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let on_lost = request.on_lost_mode();
    let held = request.acquire_for(false).await?;
    // Nothing enters on a hold that is lost by now.
    if held.is_lost() {
        return Err(lost_one(held).into());
    }
    let scope = held.body_scope(held.node().clone());
    let keys: Vec<&str> = held.keys().collect();
    let span = tracing::debug_span!("lock_hold", key = %keys.join(" "), fence = scope.fence);
    let body = owner::enter(scope, body).instrument(span);
    let mut result = match on_lost {
        OnLost::Abort | OnLost::Confirm => match unless_lost!(held.is_lost(), held.lost(), body) {
            Some(result) => result,
            None => return Err(lost_one(held).into()),
        },
        OnLost::Continue => body.await,
    };
    for guard in held.into_guards().into_iter().rev() {
        result = release_after(guard, on_lost, result).await;
    }
    result
}

/// The error of a multi-key call one of whose keys was lost (or that
/// shutdown closed): the first key found lost; every guard is dropped.
fn lost_one(held: ManyGuard) -> LockError {
    let mut guards = held.into_guards();
    if guards.is_empty() {
        return LockError::ShutDown;
    }
    let lost = guards
        .iter()
        .position(crate::LockGuard::is_lost)
        .unwrap_or(0);
    lost_or_shut_down(guards.swap_remove(lost))
}
