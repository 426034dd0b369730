use lock_runtime::{distributed_lock, LockError};

pub struct Request {
    pub id: u64,
    pub tenant: String,
}

#[distributed_lock(key = "order:<req.idd>")]
async fn pay(req: Request) -> Result<u64, LockError> {
    Ok(req.id)
}

#[distributed_lock(key = "order:<req.tenant.id>")]
async fn refund(req: &Request) -> Result<u64, LockError> {
    Ok(req.id)
}

fn main() {}
