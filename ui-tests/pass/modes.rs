//! The three modes, and what a read fn may do with its own key: take it again for reading,
//! take other keys in any mode, and be called by a writer of the same key.
use lock_runtime::{distributed_lock, lock, with_lock, LockError};

#[distributed_lock(key = "cfg:<tenant>", mode = "read")]
async fn config(tenant: u64) -> Result<u64, LockError> {
    // A read of the same key re-enters the read hold.
    let again = lock(format!("cfg:{}", tenant)).read().acquire().await?;
    drop(again);
    // Other keys may be taken in any mode.
    let other = lock(format!("audit:{}", tenant)).acquire().await?;
    drop(other);
    with_lock(lock("cfg:all").write(), async { Ok::<_, LockError>(()) }).await?;
    Ok(tenant)
}

#[distributed_lock(key = "cfg:<tenant>", mode = "write")]
async fn set_config(tenant: u64, value: u64) -> Result<u64, LockError> {
    // A writer may read what it writes: the read re-enters the write hold.
    let old = config(tenant).await?;
    Ok(old + value)
}

#[distributed_lock(key = "cfg:<tenant>", mode = "exclusive", lease = "10s", fair = true)]
async fn reset(tenant: u64) -> Result<u64, LockError> {
    set_config(tenant, 0).await
}

struct Tenant {
    id: u64,
}

impl Tenant {
    #[distributed_lock(key = "t:<self.id>", mode = "read")]
    async fn show(&self) -> Result<u64, LockError> {
        let again = lock(format!("t:{}", self.id)).read().acquire().await?;
        drop(again);
        Ok(self.id)
    }
}

macro_rules! reader {
    ($name:ident, $mode:literal) => {
        #[distributed_lock(key = "m:<id>", mode = $mode)]
        async fn $name(id: u64) -> Result<u64, LockError> {
            Ok(id)
        }
    };
}

reader!(from_a_macro, "read");

fn main() {
    let tenant = Tenant { id: 1 };
    let _ = (config(1), set_config(1, 2), reset(1), from_a_macro(1), tenant.show());
}
