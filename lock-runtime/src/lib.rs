#![cfg_attr(docsrs, feature(doc_cfg))]
//! Declarative, reentrant, self-renewing distributed locks for async Rust.
//!
//! Annotate a handler and every call runs holding a lock that excludes every
//! other process and task using the same key:
//!
//! ```
//! use lock_runtime::{distributed_lock, LockError, LockRuntime};
//!
//! #[distributed_lock(key = "order:<id>", lease = "30s", wait = "5s")]
//! async fn pay(id: u64, amount: u64) -> Result<u64, LockError> {
//!     refund_if_needed(id).await?; // same key, same call chain: re-enters
//!     Ok(amount)
//! }
//!
//! #[distributed_lock(key = "order:<id>")]
//! async fn refund_if_needed(id: u64) -> Result<(), LockError> {
//!     Ok(())
//! }
//!
//! # async fn demo() -> Result<(), LockError> {
//! LockRuntime::builder().memory().build().await?.install()?; // or .redis(url)
//! assert_eq!(pay(42, 100).await?, 100);
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! The lock lives in Redis (one server, Cluster, Sentinel or Redlock: a hash
//! per lock, changed only by Lua scripts), in etcd (etcd's own lock recipe:
//! `etcdctl lock` and this crate exclude each other), in ZooKeeper (Apache
//! Curator's recipes: Java services using Curator share the locks) or, by
//! default, in an embedded in-process store with the same semantics (see
//! [`LockRuntimeBuilder`] for each, and [`init_from_env`]). While
//! the body runs a watchdog renews the lease; if the holder crashes the lease
//! frees the lock; if the call is cancelled or panics the guard frees it at
//! once; waiters are woken by a release message, not by polling; and every
//! first acquisition hands out a fencing token ([`fence`]) that storage can
//! use to reject a stale holder.
//!
//! Three ways in, from most to least declarative:
//! - `#[distributed_lock(...)]` on an `async fn` returning `Result<T, E>` with
//!   `E: From<LockError>`, using the runtime installed with
//!   [`LockRuntime::install`] or [`init_from_env`];
//! - [`with_lock`]`(request, future)`, the same thing by hand;
//! - [`LockRuntime::lock`]`(key).acquire()` returning a [`LockGuard`].
//!
//! Nested locked calls awaited inside a locked body re-enter without a round
//! trip; sibling calls on the same key inside one body (`join!` arms) take
//! turns; tasks spawned from it do not re-enter, unless wrapped in
//! [`inherit`]. A guard from `acquire()` does not change the scope its
//! caller runs in; run calls that should re-enter it inside
//! [`LockGuard::scope`]. A task that waits for a lock that a guard it took
//! holds gets a warning naming the key when the wait starts, and every wait
//! is bounded by default ([`DEFAULT_WAIT`], 30 s).
//!
//! At the end, [`shutdown`] gives back every lock still held. The futures of
//! this crate work on any executor (the runtime has its own thread).
//!
//! Observability: `tracing` spans and events (`lock_acquire`, `lock_hold`,
//! `lock released`, `lock lost while held`; the library never installs a
//! subscriber), and with the cargo feature `metrics` counters, gauges and
//! histograms through the `metrics` facade (see `describe_metrics`).
//! [`layout`] names the Redis keys for tools such as `lockctl`.
//!
//! Waiters of one process are always served in arrival order. Across
//! processes, [`LockRequest::fair`] (or [`LockRuntimeBuilder::fair`],
//! `fair = true`, `LOCK_FAIR=1`) queues them in Redis and has each release
//! hand the lock straight to the next one.
//!
//! The manual is in the repository's `docs/` folder, beside this crate:
//! `docs/guarantees.md` (what the lock promises and what it does not),
//! `docs/reentry.md` (when a call re-enters, when it waits),
//! `docs/configuration.md` ([`init_from_env`]'s variables),
//! `docs/deploying.md` (one server, Cluster, Sentinel, Redlock, etcd,
//! ZooKeeper: what each needs and promises), `docs/fair-mode-and-cohorting.md` and `docs/operating.md`
//! (shutdown, `lockctl`, metrics, tracing). The repository's README is where
//! to start.

mod acquire;
mod backend;
mod builder;
#[cfg(test)]
mod captured;
mod cohort;
mod context;
mod env;
mod error;
mod gate;
mod guard;
mod held;
mod inflight;
mod inspect;
mod locked;
mod many;
mod meter;
mod mode;
mod names;
mod owner;
mod permits;
mod request;
mod runtime;
mod traced;
mod waiters;
mod watchdog;
mod who;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use builder::{
    LockRuntimeBuilder, DEFAULT_COHORT, DEFAULT_FAIR, DEFAULT_FENCE_WINDOW, DEFAULT_LEASE,
    DEFAULT_TRY_TIMEOUT, DEFAULT_WAIT,
};
pub use cohort::{Cohort, MAX_COHORT_HANDOFFS};
pub use env::init_from_env;
pub use error::{BackendError, LockError, TimeoutCause};
pub use guard::LockGuard;
pub use inspect::{held, hold_count, LockInfo, ReaderInfo};
pub use lock_macros::distributed_lock;
pub use locked::with_lock;
pub use many::{lock_many, with_locks, ManyGuard, ManyRequest};
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use meter::describe_metrics;
pub use mode::LockMode;
pub use names::layout;
pub use owner::{fence, fences, inherit, permit};
pub use permits::MAX_PERMITS;
pub use request::{lock, LockRequest, OnLost, MAX_KEY_LEN, MAX_LEASE, MIN_LEASE};
pub use runtime::{shutdown, LockRuntime, RuntimeStats};
pub use watchdog::WatchdogStats;
pub use who::ClientInfo;
