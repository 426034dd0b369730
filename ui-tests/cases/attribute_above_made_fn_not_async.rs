use lock_runtime::{distributed_lock, LockError};

// #[tokio::test] expands first and turns the `async fn` into a blocking fn: the message names
// that cause and the fix (put #[distributed_lock] above #[tokio::test]).
#[tokio::test]
#[distributed_lock(key = "serialised")]
async fn serialised_test() -> Result<(), LockError> {
    Ok(())
}

#[tokio::main]
#[distributed_lock(key = "main")]
async fn main() -> Result<(), LockError> {
    Ok(())
}
