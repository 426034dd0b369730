//! What `#[distributed_lock]` expands to. Not a public API: names here may
//! change in any release; use [`with_lock`](crate::with_lock) by hand instead.

pub use core::time::Duration;

use core::future::Future;
use core::pin::Pin;

use crate::error::LockError;
pub use crate::mode::LockMode;
pub use crate::request::{OnLost, Options};
use crate::runtime::LockRuntime;

/// `E: From<LockError>`, with an error message that says what to do when a
/// `#[distributed_lock]` fn's error type lacks it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot hold a `LockError`, so a #[distributed_lock] fn cannot return it as its error type",
    label = "this error type has no `From<LockError>`",
    note = "use an error type with `impl From<LockError>` (thiserror: `#[from] LockError`), `anyhow::Error`, or `LockError`"
)]
pub trait FromLockError: From<LockError> {}

impl<E: From<LockError>> FromLockError for E {}

/// Turns a lock failure into the error type of a `#[distributed_lock]` fn. The
/// attribute passes it to [`locked_with`], so the path `lift` is the one place
/// where `E: From<LockError>` is required, and a missing impl is one error, there.
pub fn lift<E: FromLockError>(error: LockError) -> E {
    E::from(error)
}

/// Runs `body` holding the lock `key` on the global runtime (re-entering the
/// caller's owner scope when there is one). Lock failures come back as
/// `Err(E::from(LockError))`.
pub async fn locked<T, E, F>(key: String, options: Options, body: F) -> Result<T, E>
where
    F: core::future::Future<Output = Result<T, E>>,
    E: FromLockError,
{
    locked_with(key, options, lift::<E>, body).await
}

/// [`locked`], with lock failures turned into `E` by `lift`; what the attribute
/// calls. It puts no bound on `E`: the future of an `async fn` carries the fn's
/// bounds, and rustc checks them again where the future is awaited, so a bound
/// here would report a missing `From<LockError>` twice (incremental builds).
pub async fn locked_with<T, E, F>(
    key: String,
    options: Options,
    lift: fn(LockError) -> E,
    body: F,
) -> Result<T, E>
where
    F: core::future::Future<Output = Result<T, E>>,
{
    let request = LockRuntime::global().map_err(lift)?.lock(key);
    let locked = crate::locked::with_lock(request.apply(options), boxed(body));
    Failure::split(locked.await, lift)
}

/// [`locked_with`] for `key = [...]`: every key of `keys` (formatted from
/// the templates) held at once.
pub async fn locked_many_with<T, E, F>(
    keys: Vec<String>,
    options: Options,
    lift: fn(LockError) -> E,
    body: F,
) -> Result<T, E>
where
    F: core::future::Future<Output = Result<T, E>>,
{
    let request = LockRuntime::global().map_err(lift)?.lock_many(keys);
    let locked = crate::many::with_locks(request.apply(options), boxed(body));
    Failure::split(locked.await, lift)
}

/// The body on the heap, its error as a [`Failure`]. A locked fn's future
/// then holds its body's state once (the fn's own argument) rather than in
/// every wrapper the call goes through, so nested locked fns grow by their
/// own size at each level, not several times over (a read fn in a write fn
/// in a read fn took 238 KB and overflowed a test thread's stack; 12 KB
/// boxed).
fn boxed<T, E, F>(body: F) -> Pin<Box<impl Future<Output = Result<T, Failure<E>>>>>
where
    F: Future<Output = Result<T, E>>,
{
    Box::pin(async move { body.await.map_err(Failure::Body) })
}

/// How a [`locked_with`] call failed: the body's own error, or the lock's,
/// before `lift` turns it into the body's type.
enum Failure<E> {
    Body(E),
    Lock(LockError),
}

impl<E> Failure<E> {
    /// A locked call's outcome in the body's error type.
    fn split<T>(outcome: Result<T, Failure<E>>, lift: fn(LockError) -> E) -> Result<T, E> {
        match outcome {
            Ok(value) => Ok(value),
            Err(Failure::Body(error)) => Err(error),
            Err(Failure::Lock(error)) => Err(lift(error)),
        }
    }
}

impl<E> From<LockError> for Failure<E> {
    fn from(error: LockError) -> Self {
        Failure::Lock(error)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// The locked future is `Send` whenever the body is, so annotated
    /// handlers stay usable with `tokio::spawn` and multi-threaded servers.
    #[test]
    fn locked_future_is_send_when_the_body_is() {
        let request = crate::request::LockRequest::new(None, "k".to_owned());
        let fut = crate::with_lock(request, async { Ok::<_, LockError>(1) });
        assert_send(&fut);
        let fut = super::locked("k".to_owned(), super::Options::DEFAULT, async {
            Ok::<_, LockError>(())
        });
        assert_send(&fut);
    }

    /// Every waiting acquire keeps this state for as long as it waits
    /// (bench S7: resident bytes per waiting task). Past causes of growth:
    /// an `async fn` wrapper keeping a second copy of what it wraps, and
    /// parameters of an `async fn` copied into locals.
    #[tokio::test]
    async fn a_waiting_acquire_stays_small() {
        let runtime = LockRuntime::builder().memory().build().await.unwrap();
        let acquire = runtime.lock("k").acquire();
        let size = std::mem::size_of_val(&acquire);
        eprintln!("an acquire() future: {size} bytes");
        assert!(size <= 1024, "an acquire() future takes {size} bytes");
    }
}
