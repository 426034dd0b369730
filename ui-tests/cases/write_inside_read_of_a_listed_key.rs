use lock_runtime::{distributed_lock, lock, LockError};

#[distributed_lock(key = ["cfg:<tenant>", "limits:<tenant>"], mode = "read")]
async fn config(tenant: u64) -> Result<u64, LockError> {
    // Each listed key is held for reading: a write of either is an upgrade.
    let guard = lock(format!("limits:{tenant}")).write().acquire().await?;
    drop(guard);
    let guard = lock(format!("cfg:{}", tenant)).acquire().await?;
    drop(guard);
    // A read of a listed key re-enters it; another key is not judged.
    let guard = lock(format!("limits:{tenant}")).read().acquire().await?;
    drop(guard);
    let guard = lock(format!("audit:{tenant}")).write().acquire().await?;
    drop(guard);
    Ok(tenant)
}

fn main() {}
