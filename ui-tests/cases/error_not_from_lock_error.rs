use lock_runtime::distributed_lock;

/// An application error that forgot `#[from] LockError`.
#[derive(Debug)]
pub enum AppError {
    NotFound,
}

#[distributed_lock(key = "order:<id>")]
async fn pay(id: u64) -> Result<u64, AppError> {
    if id == 0 {
        return Err(AppError::NotFound);
    }
    Ok(id)
}

fn main() {}
