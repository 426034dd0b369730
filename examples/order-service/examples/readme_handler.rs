//! The README's axum handler, word for word, so that it keeps compiling
//! (`cargo build -p order-service --example readme_handler`).

use axum::{
    extract::Path,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use lock_runtime::{distributed_lock, LockError};

struct AppError(LockError);
impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}
impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        (StatusCode::SERVICE_UNAVAILABLE, self.0.to_string()).into_response()
    }
}

#[distributed_lock(key = "order:<path.0>", wait = "2s")]
async fn pay(path: Path<u64>) -> Result<String, AppError> {
    Ok(format!("paid order {}", path.0))
}

fn main() {
    let _app: axum::Router =
        axum::Router::new().route("/orders/{id}/pay", axum::routing::post(pay));
}
