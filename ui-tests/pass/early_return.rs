//! `return` and `?` in the body return from the body with the fn's error type; `?` converts
//! errors (`io::Error` into `anyhow::Error`) with no annotation.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "file:<path>")]
async fn read(path: &str) -> anyhow::Result<usize> {
    if path.is_empty() {
        return Ok(0);
    }
    let text = std::fs::read_to_string(path)?;
    let number: usize = text.trim().parse()?;
    Ok(number)
}

#[distributed_lock(key = "n:<n>")]
async fn early(n: u32) -> Result<u32, LockError> {
    if n > 10 {
        return Err(LockError::NotInstalled);
    }
    let doubled = Some(n * 2).ok_or(LockError::NotInstalled)?;
    Ok(doubled)
}

fn main() {
    let _ = (read("x"), early(1));
}
