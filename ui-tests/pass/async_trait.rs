//! With `#[async_trait]` on the impl (or trait) and `#[distributed_lock]` on the method:
//! async-trait expands first and the attribute locks the boxed future.
use async_trait::async_trait;
use lock_runtime::{distributed_lock, LockError};

#[async_trait]
trait Store {
    async fn load(&self, id: u64) -> Result<u64, LockError>;

    #[distributed_lock(key = "default:<id>")]
    async fn default_method(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

struct Memory {
    tenant: String,
}

#[async_trait]
impl Store for Memory {
    /// Documented.
    #[distributed_lock(key = "load:<self.tenant>:<id>", lease = "10s")]
    async fn load(&self, id: u64) -> Result<u64, LockError> {
        if id == 0 {
            return Err(LockError::NotInstalled);
        }
        Ok(id)
    }
}

#[async_trait(?Send)]
trait LocalStore {
    async fn local(&mut self, id: u64) -> anyhow::Result<u64>;
}

#[async_trait(?Send)]
impl LocalStore for Memory {
    #[distributed_lock(key = "local:<id>")]
    async fn local(&mut self, mut id: u64) -> anyhow::Result<u64> {
        id += "1".parse::<u64>()?;
        Ok(id)
    }
}

fn main() {
    let mut memory = Memory { tenant: "t".into() };
    let _ = memory.load(1);
    let _ = memory.default_method(1);
    let _ = memory.local(1);
}
