use lock_runtime::distributed_lock;

// Every mistake is reported, not only the first.
#[distributed_lock(key = "order:<order>", lease = "5 sec", on_lost = "ignore")]
fn pay(id: u64) -> Option<u64> {
    Some(id)
}

fn main() {}
