//! Braces in a key: `{{` and `}}` are a literal `{` and `}`, and a brace group that names no
//! parameter stays as written. Each body asks, from another task (another owner), which key
//! is taken.
use lock_runtime::{distributed_lock, lock, LockError, LockRuntime};

/// Whether `key` is held by someone else.
async fn taken(key: String) -> Result<bool, LockError> {
    let other = tokio::spawn(lock(key).try_acquire());
    Ok(other.await.expect("task")?.is_none())
}

#[distributed_lock(key = "order:{{id}}:<id>")]
async fn escaped(id: u64) -> Result<bool, LockError> {
    taken(format!("order:{{id}}:{id}")).await
}

#[distributed_lock(key = "{tenant}:{{{{}}}}:<id>")]
async fn unnamed(id: u64) -> Result<bool, LockError> {
    taken(format!("{{tenant}}:{{{{}}}}:{id}")).await
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    LockRuntime::builder().memory().build().await?.install()?;
    assert!(escaped(7).await?);
    assert!(unnamed(8).await?);
    Ok(())
}
