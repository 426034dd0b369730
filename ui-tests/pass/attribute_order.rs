//! #[distributed_lock] above a runtime's entry-point attribute (#[tokio::main],
//! #[tokio::test]) expands first and locks the `async fn`; the runtime attribute then makes
//! it the blocking fn that runs it.
use lock_runtime::{distributed_lock, LockError, LockRuntime};

#[distributed_lock(key = "serialised")]
#[tokio::test]
async fn serialised_test() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", wait = "1s")]
#[tokio::main(flavor = "current_thread")]
async fn job() -> Result<bool, LockError> {
    Ok(lock_runtime::fence().is_some())
}

fn main() {
    // The lock runtime lives on a runtime of its own; `job` blocks on one it builds.
    let runtime = tokio::runtime::Runtime::new().unwrap_or_else(|e| panic!("runtime: {e}"));
    runtime.block_on(async {
        let locks = LockRuntime::builder().memory().build().await;
        locks
            .and_then(LockRuntime::install)
            .unwrap_or_else(|e| panic!("lock runtime: {e}"));
    });
    assert!(job().unwrap_or_else(|e| panic!("{e}")), "the body ran holding the lock");
}
