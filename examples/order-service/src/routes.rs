//! HTTP: the routes, and how results and errors become responses.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lock_runtime::{LockError, LockRuntime};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;

use crate::orders::{self, OrderError};
use crate::store::{Store, StoreError};

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The orders.
    pub store: Store,
    /// The lock runtime (for `inspect`).
    pub runtime: LockRuntime,
    /// Renders the metrics recorder's state.
    pub metrics: PrometheusHandle,
}

/// The service's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/orders/{id}", get(order))
        .route("/orders/{id}/pay", post(pay))
        .route("/orders/{id}/late-write", post(late_write))
        .route("/locks/{key}", get(lock))
        .route("/metrics", get(metrics))
        .with_state(state)
}

#[derive(Deserialize)]
struct PayQuery {
    amount: u64,
    /// How long the payment provider takes, in ms (default 20).
    work_ms: Option<u64>,
}

async fn pay(
    State(state): State<AppState>,
    Path(id): Path<u64>,
    Query(query): Query<PayQuery>,
) -> Result<Response, OrderError> {
    let work = Duration::from_millis(query.work_ms.unwrap_or(20));
    let outcome = orders::pay(&state.store, id, query.amount, work).await;
    let label = match &outcome {
        Ok(_) => "charged",
        Err(OrderError::AlreadyPaid(_)) => "already_paid",
        Err(OrderError::Store(StoreError::Stale { .. })) => "stale_token",
        Err(_) => "error",
    };
    metrics::counter!("orders_payments_total", "result" => label).increment(1);
    Ok(Json(outcome?).into_response())
}

#[derive(Deserialize)]
struct LateQuery {
    fence: u64,
    amount: u64,
}

async fn late_write(
    State(state): State<AppState>,
    Path(id): Path<u64>,
    Query(query): Query<LateQuery>,
) -> Result<Response, OrderError> {
    let order = orders::late_write(&state.store, id, query.amount, query.fence).await?;
    Ok(Json(order).into_response())
}

async fn order(State(state): State<AppState>, Path(id): Path<u64>) -> Result<Response, OrderError> {
    let order = state.store.get(id).await.map_err(OrderError::Store)?;
    Ok(Json(order).into_response())
}

/// What `inspect` says of the lock `key`, as JSON.
async fn lock(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Response, OrderError> {
    let body = match state.runtime.inspect(&key).await? {
        Some(info) => json!({
            "key": info.key,
            "held": true,
            "holder": info.holder,
            "held_by_this_process": info.held_by_this_process,
            "holds": info.holds,
            "remaining_lease_ms": info.remaining_lease.map(|d| d.as_millis() as u64),
            "fence": info.fence,
            "queue": info.queue,
        }),
        None => json!({ "key": key, "held": false }),
    };
    Ok(Json(body).into_response())
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

impl IntoResponse for OrderError {
    fn into_response(self) -> Response {
        let (status, kind) = match &self {
            OrderError::AlreadyPaid(_) => (StatusCode::CONFLICT, "already_paid"),
            OrderError::Store(StoreError::Stale { .. }) => (StatusCode::CONFLICT, "stale_token"),
            OrderError::Lock(LockError::Timeout { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "lock_timeout")
            }
            OrderError::Lock(LockError::ShutDown) => {
                (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
            }
            OrderError::Lock(LockError::Lost { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "lock_lost")
            }
            OrderError::Lock(LockError::InvalidKey { .. }) => {
                (StatusCode::BAD_REQUEST, "invalid_key")
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let body = json!({ "error": self.to_string(), "kind": kind });
        (status, Json(body)).into_response()
    }
}
