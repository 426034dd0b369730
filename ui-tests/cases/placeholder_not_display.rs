use lock_runtime::{distributed_lock, LockError};

struct OrderId(u64);

#[distributed_lock(key = "order:<id>")]
async fn pay(id: OrderId) -> Result<u64, LockError> {
    Ok(id.0)
}

struct Request {
    order: u64,
}

#[distributed_lock(key = "order:<req.order_id>")]
async fn refund(req: Request) -> Result<u64, LockError> {
    Ok(req.order)
}

fn main() {}
