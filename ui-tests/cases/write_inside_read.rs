use lock_runtime::{distributed_lock, lock, with_lock, LockError, LockMode};

#[distributed_lock(key = "cfg:<tenant>", mode = "read")]
async fn config(tenant: u64) -> Result<u64, LockError> {
    // The default mode is exclusive: a write.
    let guard = lock(format!("cfg:{}", tenant)).acquire().await?;
    drop(guard);
    // A read of the same key re-enters the read hold: no error.
    let guard = lock(format!("cfg:{tenant}")).read().acquire().await?;
    drop(guard);
    // Another key: no error.
    let guard = lock(format!("audit:{}", tenant)).write().acquire().await?;
    drop(guard);
    Ok(tenant)
}

#[distributed_lock(key = "cfg:global", mode = "read")]
async fn global() -> Result<(), LockError> {
    lock_runtime::lock("cfg:global")
        .mode(LockMode::Write)
        .try_acquire()
        .await?;
    with_lock(lock("cfg:global").write(), async { Ok::<_, LockError>(()) }).await
}

struct Tenant {
    id: u64,
}

impl Tenant {
    #[distributed_lock(key = "t:<self.id>", mode = "read")]
    async fn show(&self) -> Result<u64, LockError> {
        let guard = lock(format!("t:{id}", id = self.id)).write().acquire().await?;
        drop(guard);
        Ok(self.id)
    }
}

fn main() {}
