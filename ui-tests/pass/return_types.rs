//! `Result<T, E>`, `anyhow::Result<T>`, a fully qualified `Result` and a user alias
//! `type Result<T> = …` are all accepted.
use lock_runtime::{distributed_lock, LockError};
use lock_ui_tests::AppError;

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
