//! An order service on axum whose handlers hold distributed locks, as a
//! service would use lock-runtime:
//!
//! - `POST /orders/{id}/pay?amount=N` runs [`orders::pay`], a
//!   `#[distributed_lock(key = "order:<id>")]` fn that calls another locked
//!   fn on the same key (it re-enters) and hands its fencing token to the
//!   [`store`], which refuses writes with a token older than one it took;
//! - `POST /orders/{id}/late-write?fence=N&amount=N` plays a holder that was
//!   paused past its lease and writes with its old token: refused;
//! - `GET /orders/{id}` the order as stored, `GET /locks/{key}` what
//!   `inspect` says of a lock (JSON), `GET /metrics` Prometheus text;
//! - [`load`] fires concurrent payments at the same orders from several
//!   processes and checks that no order was charged twice.
//!
//! `main.rs` wires it: the runtime from the environment
//! (`lock_runtime::init_from_env`: Redis with `REDIS_URL`, else the embedded
//! backend), the metrics recorder, and graceful shutdown on SIGTERM/ctrl-c
//! that ends with `lock_runtime::shutdown()`.

pub mod client;
pub mod load;
pub mod orders;
pub mod routes;
pub mod store;
