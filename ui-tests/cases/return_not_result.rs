use lock_runtime::distributed_lock;

#[distributed_lock(key = "a")]
async fn unit() -> () {}

#[distributed_lock(key = "b")]
async fn option() -> Option<u64> {
    None
}

#[distributed_lock(key = "c")]
async fn string() -> String {
    String::new()
}

#[distributed_lock(key = "d")]
async fn number() -> u64 {
    1
}

#[distributed_lock(key = "e")]
async fn tuple() -> (u64, bool) {
    (1, true)
}

#[distributed_lock(key = "f")]
async fn reference() -> &'static str {
    ""
}

fn main() {}
