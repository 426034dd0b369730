//! What `#[distributed_lock]` expands to. Not a public API: names here may
//! change in any release; use [`with_lock`](crate::with_lock) by hand instead.

pub use core::time::Duration;

use crate::error::LockError;
pub use crate::request::OnLost;
use crate::runtime::LockRuntime;

/// The attribute's options. Build with `..Options::DEFAULT` so fields can be
/// added without breaking expanded code.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// `lease = ...`; `None`: the runtime's default.
    pub lease: Option<Duration>,
    /// `wait = ...`; `None`: the runtime's default; `Some(ZERO)`: try once.
    pub wait: Option<Duration>,
    /// `watchdog = ...`.
    pub watchdog: bool,
    /// `on_lost = ...`.
    pub on_lost: OnLost,
    /// `fair = ...`; `None`: the runtime's default.
    pub fair: Option<bool>,
}

impl Options {
    /// Everything at its default.
    pub const DEFAULT: Options = Options {
        lease: None,
        wait: None,
        watchdog: true,
        on_lost: OnLost::Abort,
        fair: None,
    };
}

/// `E: From<LockError>`, with an error message that says what to do when a
/// `#[distributed_lock]` fn's error type lacks it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot hold a `LockError`, so a #[distributed_lock] fn cannot return it as its error type",
    label = "this error type has no `From<LockError>`",
    note = "use an error type with `impl From<LockError>` (thiserror: `#[from] LockError`), `anyhow::Error`, or `LockError`"
)]
pub trait FromLockError: From<LockError> {}

impl<E: From<LockError>> FromLockError for E {}

/// Runs `body` holding the lock `key` on the global runtime (re-entering the
/// caller's owner scope when there is one). Lock failures come back as
/// `Err(E::from(LockError))`.
pub async fn locked<T, E, F>(key: String, options: Options, body: F) -> Result<T, E>
where
    F: core::future::Future<Output = Result<T, E>>,
    E: FromLockError,
{
    let runtime = match LockRuntime::global() {
        Ok(runtime) => runtime,
        Err(error) => return Err(error.into()),
    };
    let request = runtime.lock(key).apply(
        options.lease,
        options.wait,
        options.watchdog,
        options.on_lost,
        options.fair,
    );
    crate::request::with_lock(request, body).await
}
