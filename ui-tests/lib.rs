//! Compile-time tests live in tests/ui.rs; this library holds what the fixtures
//! (`pass/`) and the run tests (`tests/`) share, so each is written once.

use lock_runtime::LockError;

/// An application's own error type that a lock error converts into, as users write
/// them: the error type of the fns that check `Result<_, AppError>` returns, `?` on
/// another error (`ParseIntError`) and a lock failure coming back through `From`.
#[derive(Debug)]
pub enum AppError {
    /// The lock could not be taken (or was lost).
    Lock(LockError),
    /// The body's own failure.
    Parse(std::num::ParseIntError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(error: std::num::ParseIntError) -> Self {
        AppError::Parse(error)
    }
}
