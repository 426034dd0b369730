use lock_runtime::{distributed_lock, LockError};

struct Request {
    id: u64,
}

struct Shop {
    tenant: String,
}

// `{id}` is `format!` syntax: in a key it would be literal text, one lock for every order.
#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

impl Shop {
    #[distributed_lock(key = "{self.tenant}:order:{req.id}")]
    async fn refund(&self, req: Request) -> Result<u64, LockError> {
        Ok(req.id + self.tenant.len() as u64)
    }
}

fn main() {}
