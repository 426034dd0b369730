//! `Result<T, E>`, `anyhow::Result<T>`, a fully qualified `Result` and a user alias
//! `type Result<T> = …` are all accepted.
use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
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

mod app {
    pub type Result<T> = std::result::Result<T, super::AppError>;
}

#[distributed_lock(key = "a")]
async fn plain() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "b")]
async fn with_anyhow() -> anyhow::Result<u8> {
    Ok(1)
}

#[distributed_lock(key = "c")]
async fn with_alias(text: &str) -> app::Result<u64> {
    Ok(text.parse::<u64>()?)
}

#[distributed_lock(key = "d")]
async fn fully_qualified() -> ::core::result::Result<u8, LockError> {
    Ok(1)
}

fn main() {
    let _ = (plain(), with_anyhow(), with_alias("1"), fully_qualified());
    let _ = |e: AppError| match e {
        AppError::Lock(e) => drop(e),
        AppError::Parse(e) => drop(e),
    };
}
