use lock_runtime::distributed_lock;

#[distributed_lock(key = "order")]
struct Order {
    id: u64,
}

#[distributed_lock(key = "order")]
const LIMIT: u64 = 1;

fn main() {
    // The items are still emitted.
    let _ = Order { id: LIMIT };
}
