#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Test harness: a private `redis-server` per test binary, runtimes on both
//! backends, and small helpers the behaviour tests share.
//!
//! The server is `lock_testkit`'s (shared with the benchmark): on a free
//! loopback port, no data on disk, gone when the test process exits however
//! it exits. When `redis-server` is not installed every test that needs it
//! fails with the install command; nothing is skipped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use lock_runtime::{LockError, LockRuntime, LockRuntimeBuilder};
use lock_testkit::{RedisCluster, RedisServer};

pub mod proxy;
pub use proxy::FaultProxy;

/// The shared server of this test binary, started on first use.
pub fn redis() -> &'static RedisServer {
    RedisServer::shared()
}

/// The shared 3-master Redis Cluster of this test binary, started on first
/// use.
pub fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3))
}

/// A name no other test of this run uses (for keys and prefixes).
pub fn unique(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Which backend a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The shared test `redis-server`.
    Redis,
    /// The embedded backend.
    Memory,
    /// The shared 3-master test Redis Cluster.
    Cluster,
}

impl Kind {
    /// A fresh runtime on this backend. Redis runtimes of one test share the
    /// server and the prefix, like processes sharing a Redis would.
    pub async fn runtime(self, prefix: &str) -> LockRuntime {
        self.try_runtime(prefix)
            .await
            .expect("build the lock runtime")
    }

    /// Like [`runtime`](Self::runtime), returning the error.
    pub async fn try_runtime(self, prefix: &str) -> Result<LockRuntime, LockError> {
        self.builder(prefix).build().await
    }

    /// A runtime builder on this backend with this prefix, for a test that
    /// sets more.
    pub fn builder(self, prefix: &str) -> LockRuntimeBuilder {
        let builder = match self {
            Kind::Redis => LockRuntime::builder().redis(redis().url()),
            Kind::Memory => LockRuntime::builder().memory(),
            Kind::Cluster => LockRuntime::builder().redis_cluster(cluster().urls()),
        };
        builder.key_prefix(prefix)
    }

    /// A plain connection to every server of this backend, for a test that
    /// looks at what is stored (none for the embedded store).
    pub async fn connections(self) -> Vec<redis::aio::MultiplexedConnection> {
        match self {
            Kind::Redis => vec![redis().connection().await],
            Kind::Memory => Vec::new(),
            Kind::Cluster => {
                let mut all = Vec::new();
                for node in 0..3 {
                    all.push(cluster().node(node).connection().await);
                }
                all
            }
        }
    }

    /// A plain connection to the server that stores `name` (a backend name,
    /// see `LockRuntime::backend_key`); none for the embedded store.
    pub async fn connection_storing(self, name: &str) -> Option<redis::aio::MultiplexedConnection> {
        match self {
            Kind::Redis => Some(redis().connection().await),
            Kind::Memory => None,
            Kind::Cluster => {
                let owner = cluster().owner_of(cluster().slot_of(name));
                Some(cluster().node(owner).connection().await)
            }
        }
    }

    /// A second client of the same lock store: another runtime on the same
    /// Redis, or — the embedded store being per runtime — the same runtime.
    pub async fn peer(self, first: &LockRuntime, prefix: &str) -> LockRuntime {
        match self {
            Kind::Redis | Kind::Cluster => self.runtime(prefix).await,
            Kind::Memory => first.clone(),
        }
    }
}

/// Declares one `#[tokio::test]` per backend (a Redis server, the embedded
/// store, a Redis Cluster) for `async fn $name(kind: Kind)`.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn redis() {
                    super::$name($crate::Kind::Redis).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn memory() {
                    super::$name($crate::Kind::Memory).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn cluster() {
                    super::$name($crate::Kind::Cluster).await;
                }
            }
        )+
    };
}

/// Counts how many bodies are inside a critical section at once, and the
/// most ever seen: two holders at once would show as a maximum above one.
#[derive(Debug, Default)]
pub struct Occupancy {
    now: AtomicU64,
    max: AtomicU64,
}

impl Occupancy {
    /// An empty counter (usable in a `static`).
    pub const fn new() -> Self {
        Occupancy {
            now: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    /// Marks entry; the returned token marks exit when dropped.
    pub fn enter(&self) -> OccupancyToken<'_> {
        let inside = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(inside, Ordering::SeqCst);
        OccupancyToken(self)
    }

    /// The most bodies ever inside at once.
    pub fn max(&self) -> u64 {
        self.max.load(Ordering::SeqCst)
    }
}

/// Runs `tasks` tasks, task `t` on `runtimes[t % runtimes.len()]`, each
/// making `rounds` non-atomic increments (load, yield, store) of one counter
/// under the lock `key`, which loses updates without the lock. Returns the
/// final count and the most bodies ever inside the lock at once.
pub async fn count_under_lock(
    runtimes: &[LockRuntime],
    key: &str,
    tasks: usize,
    rounds: u64,
) -> (u64, u64) {
    use std::sync::Arc;
    let counter = Arc::new(AtomicU64::new(0));
    let occupancy = Arc::new(Occupancy::new());
    let mut spawned = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let rt = runtimes[t % runtimes.len()].clone();
        let (counter, occupancy, key) = (counter.clone(), occupancy.clone(), key.to_owned());
        spawned.push(tokio::spawn(async move {
            for _ in 0..rounds {
                lock_runtime::with_lock(rt.lock(key.clone()), async {
                    let _inside = occupancy.enter();
                    let value = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(value + 1, Ordering::SeqCst);
                    Ok::<_, LockError>(())
                })
                .await
                .unwrap();
            }
        }));
    }
    for task in spawned {
        task.await.unwrap();
    }
    (counter.load(Ordering::SeqCst), occupancy.max())
}

/// Leaves the critical section on drop.
pub struct OccupancyToken<'a>(&'a Occupancy);

impl Drop for OccupancyToken<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Path of the contender binary built with these tests (usable from
/// integration tests, where Cargo defines it).
#[macro_export]
macro_rules! contender_bin {
    () => {
        env!("CARGO_BIN_EXE_contender")
    };
}

/// A fair-mode runtime on the Redis at `url` (another "process" of a test).
pub async fn fair_runtime(url: &str, prefix: &str) -> LockRuntime {
    LockRuntime::builder()
        .redis(url)
        .key_prefix(prefix)
        .fair(true)
        .build()
        .await
        .expect("build the lock runtime")
}

/// Waits (bounded: 5 s) until `ready` says yes: for state with no event to
/// await (a runtime's counters, say). Panics naming `what` otherwise.
pub async fn wait_until(what: &str, ready: impl Fn() -> bool) {
    for _ in 0..1000 {
        if ready() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("timed out: {what}");
}

/// Wakes a thread parked in [`block_on`].
pub struct Unpark(pub std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// A minimal executor that is not tokio: polls `fut` on the calling thread
/// and parks until woken (bounded: a future never woken within 20 s fails
/// the test).
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::task::{Context, Poll};
    use std::time::{Duration, Instant};
    let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        assert!(Instant::now() < give_up, "the future was never woken");
        std::thread::park_timeout(Duration::from_millis(200));
    }
}
