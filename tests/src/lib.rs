#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Test harness: the servers of every backend, shared per test binary, a
//! runtime on any of them, the one list of backends every behaviour runs
//! on, and the small helpers the behaviour tests share.
//!
//! Each server is `lock_testkit`'s (shared with the benchmark): on a free
//! loopback port, no data on disk, gone when the test process exits however
//! it exits, and started on first use, so a binary that never asks for a
//! backend never starts it. When `redis-server` is not installed every test
//! that needs it fails with the install command; nothing is skipped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime, LockRuntimeBuilder};
use lock_testkit::{
    EtcdCluster, RedisCluster, RedisServer, SentinelSet, ZooKeeperEnsemble, ZooKeeperServer,
};
use redis::aio::MultiplexedConnection;

pub mod backends;
pub mod cut_off;
pub mod looked;
pub mod on_cluster;
pub mod own;
pub mod pki;
pub mod poll;
pub mod proxy;
pub mod spawn;
pub mod stall;
pub mod stored;
pub use own::OwnServers;
pub use pki::TestPki;
pub use poll::{poll_every, poll_until, wait_until};
pub use proxy::FaultProxy;
pub use spawn::{acquire_elsewhere, spawn_acquire, spawn_waiting};
pub use stall::StallableExecutor;
pub use stored::{
    names_left, queue_len, until_exists, until_listed, until_nothing_left, until_queued,
};

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

/// The shared Sentinel deployment of this test binary (a primary, one
/// replica, three sentinels), started on first use. Nothing fails it over:
/// the failover tests (`sentinel.rs`) start sets of their own.
pub fn sentinel() -> &'static SentinelSet {
    static SET: OnceLock<SentinelSet> = OnceLock::new();
    SET.get_or_init(|| SentinelSet::start(1))
}

/// The shared Redlock fleet of this test binary: three independent masters
/// (a quorum is two), started on first use. The quorum's faults
/// (`redlock.rs`) run on fleets of their own.
pub fn redlock() -> &'static [RedisServer] {
    static FLEET: OnceLock<Vec<RedisServer>> = OnceLock::new();
    FLEET.get_or_init(|| (0..3).map(|_| RedisServer::start()).collect())
}

/// The shared one-member etcd of this test binary, started on first use.
pub fn etcd() -> &'static EtcdCluster {
    static ETCD: OnceLock<EtcdCluster> = OnceLock::new();
    ETCD.get_or_init(|| EtcdCluster::start(1))
}

/// The shared etcd cluster of three members of this test binary, started
/// on first use. Nothing kills its members: the fault tests (`etcd.rs`)
/// start clusters of their own.
pub fn etcd3() -> &'static EtcdCluster {
    static ETCD: OnceLock<EtcdCluster> = OnceLock::new();
    ETCD.get_or_init(|| EtcdCluster::start(3))
}

/// The shared standalone ZooKeeper server of this test binary, started on
/// first use (its faults, and the ensemble, are `zookeeper.rs`'s own).
pub fn zookeeper() -> &'static ZooKeeperServer {
    ZooKeeperServer::shared()
}

/// The shared ZooKeeper ensemble of three of this test binary, started on
/// first use. Nothing kills its servers: the fault tests (`zookeeper.rs`)
/// start ensembles of their own.
pub fn zookeeper3() -> &'static ZooKeeperEnsemble {
    static ENSEMBLE: OnceLock<ZooKeeperEnsemble> = OnceLock::new();
    ENSEMBLE.get_or_init(ZooKeeperEnsemble::start)
}

/// Asserts that `guard`'s token is above `before`, a token handed out
/// earlier on its key (`whose` names that hold): tokens never go back.
#[track_caller]
pub fn assert_token_above(guard: &lock_runtime::LockGuard, before: u64, whose: &str) {
    let token = guard.fence();
    assert!(token > before, "token {token} not above {whose}'s {before}");
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

/// Which backend a test runs on. The list every behaviour runs on is
/// [`backends!`](macro@crate::backends); a new backend adds a variant here, its
/// arms below, and its line there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The shared test `redis-server`.
    Redis,
    /// The embedded backend.
    Memory,
    /// The shared 3-master test Redis Cluster.
    Cluster,
    /// The shared Sentinel deployment's primary, found through its sentinels.
    Sentinel,
    /// The shared fleet of three independent masters.
    Redlock,
    /// The shared one-member etcd.
    Etcd,
    /// The shared etcd cluster of three members.
    Etcd3,
    /// The shared standalone ZooKeeper server.
    Zookeeper,
    /// The shared ZooKeeper ensemble of three.
    Zookeeper3,
}

impl Kind {
    /// Every backend, in the order of [`backends!`](macro@crate::backends).
    pub const ALL: [Kind; 9] = [
        Kind::Redis,
        Kind::Memory,
        Kind::Cluster,
        Kind::Sentinel,
        Kind::Redlock,
        Kind::Etcd,
        Kind::Etcd3,
        Kind::Zookeeper,
        Kind::Zookeeper3,
    ];

    /// A fresh runtime on this backend. Runtimes of one test on a server
    /// backend share the servers and the prefix, like processes sharing a
    /// Redis would.
    ///
    /// A ZooKeeper ensemble of three on two busy cores sometimes opens no
    /// session within the builder's connect timeout (2 s); the build is
    /// tried again (three times at most), so that a test fails on what it
    /// checks, not on a slow start.
    pub async fn runtime(self, prefix: &str) -> LockRuntime {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.try_runtime(prefix).await {
                Err(LockError::Backend(e))
                    if tries < 3
                        && matches!(self, Kind::Zookeeper | Kind::Zookeeper3)
                        && e.to_string().contains("cannot open a ZooKeeper session") => {}
                built => return built.expect("build the lock runtime"),
            }
        }
    }

    /// Like [`runtime`](Self::runtime), returning the error.
    pub async fn try_runtime(self, prefix: &str) -> Result<LockRuntime, LockError> {
        self.builder(prefix).build().await
    }

    /// A runtime builder on this backend with this prefix, for a test that
    /// sets more.
    ///
    /// Its try timeout is 2 s, not the default 250 ms: on a loaded machine
    /// (the whole suite on 2 cores) a try-once on a three-member etcd,
    /// ZooKeeper ensemble or Redlock fleet sometimes got its answer later
    /// than that, and a behaviour test read it as a backend error. The try
    /// timeout's own tests build their runtimes with it set.
    pub fn builder(self, prefix: &str) -> LockRuntimeBuilder {
        self.untimed_builder(prefix)
            .try_timeout(Duration::from_secs(2))
    }

    fn untimed_builder(self, prefix: &str) -> LockRuntimeBuilder {
        let builder = match self {
            Kind::Redis => LockRuntime::builder().redis(redis().url()),
            Kind::Memory => LockRuntime::builder().memory(),
            Kind::Cluster => LockRuntime::builder().redis_cluster(cluster().urls()),
            Kind::Sentinel => LockRuntime::builder()
                .redis_sentinel(sentinel().sentinel_urls(), lock_testkit::sentinel::SERVICE),
            // Redlock has no fair mode: plain whatever `LOCK_FAIR` says (a
            // test that asks for fair mode still gets the refusal).
            Kind::Redlock => LockRuntime::builder()
                .redlock(redlock().iter().map(RedisServer::url))
                .fair(false),
            Kind::Etcd => LockRuntime::builder().etcd(etcd().endpoints()),
            Kind::Etcd3 => LockRuntime::builder().etcd(etcd3().endpoints()),
            // A ZooKeeper prefix is a path: the test's prefix as a directory.
            Kind::Zookeeper => {
                return LockRuntime::builder()
                    .zookeeper(zookeeper().connect_string())
                    .key_prefix(format!("/{prefix}/"))
            }
            Kind::Zookeeper3 => {
                return LockRuntime::builder()
                    .zookeeper(zookeeper3().connect_string())
                    .key_prefix(format!("/{prefix}/"))
            }
        };
        builder.key_prefix(prefix)
    }

    /// A plain connection to every server that stores locks of this
    /// backend, for a test that looks at what is stored (none for the
    /// embedded store; Sentinel's primary only, which its replica copies).
    pub async fn connections(self) -> Vec<MultiplexedConnection> {
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
            Kind::Sentinel => vec![sentinel().first_primary().connection().await],
            Kind::Redlock => {
                let mut all = Vec::new();
                for master in redlock() {
                    all.push(master.connection().await);
                }
                all
            }
            Kind::Etcd | Kind::Etcd3 | Kind::Zookeeper | Kind::Zookeeper3 => Vec::new(),
        }
    }

    /// A plain connection to the one server that stores `name` (a backend
    /// name, see `LockRuntime::backend_key`); none for the embedded store,
    /// nor for Redlock, whose locks live on a majority.
    pub async fn connection_storing(self, name: &str) -> Option<MultiplexedConnection> {
        match self {
            Kind::Redis => Some(redis().connection().await),
            Kind::Memory
            | Kind::Redlock
            | Kind::Etcd
            | Kind::Etcd3
            | Kind::Zookeeper
            | Kind::Zookeeper3 => None,
            Kind::Cluster => {
                let owner = cluster().owner_of(cluster().slot_of(name));
                Some(cluster().node(owner).connection().await)
            }
            Kind::Sentinel => Some(sentinel().first_primary().connection().await),
        }
    }

    /// Two clients of one lock store under a fresh prefix made from
    /// `name`: a runtime and its [`peer`](Self::peer).
    pub async fn two(self, name: &str) -> (LockRuntime, LockRuntime) {
        let prefix = unique(name);
        let first = self.runtime(&prefix).await;
        let second = self.peer(&first, &prefix).await;
        (first, second)
    }

    /// A second client of the same lock store: another runtime on the same
    /// servers, or (the embedded store being per runtime) the same runtime.
    pub async fn peer(self, first: &LockRuntime, prefix: &str) -> LockRuntime {
        match self {
            Kind::Memory => first.clone(),
            _ => self.runtime(prefix).await,
        }
    }
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

/// A runtime builder on the Redis at `url` (another "process" of a test,
/// or one that reaches the server through a [`FaultProxy`]) with this
/// prefix, for a test that sets more.
pub fn builder_at(url: &str, prefix: &str) -> LockRuntimeBuilder {
    LockRuntime::builder().redis(url).key_prefix(prefix)
}

/// A runtime on the Redis at `url` (another "process" of a test, or one
/// that reaches the server through a [`FaultProxy`]), in the mode the
/// builder's default gives.
pub async fn runtime_at(url: &str, prefix: &str) -> LockRuntime {
    builder_at(url, prefix)
        .build()
        .await
        .expect("build the lock runtime")
}

/// A fault proxy of the test's own in front of the shared Redis, and a
/// runtime (keys under `prefix`) that reaches Redis only through it: for a
/// test that stalls, delays or cuts the network of this one client.
pub async fn behind_proxy(prefix: &str) -> (FaultProxy, LockRuntime) {
    let proxy = FaultProxy::start(redis().port()).await;
    let runtime = runtime_at(&proxy.url(), prefix).await;
    (proxy, runtime)
}

/// A fair-mode runtime on the Redis at `url` (another "process" of a test).
pub async fn fair_runtime(url: &str, prefix: &str) -> LockRuntime {
    builder_at(url, prefix)
        .fair(true)
        .build()
        .await
        .expect("build the lock runtime")
}

/// A runtime on the Redis at `url` (default prefix) whose response and
/// connect timeouts are 300 ms: for a test that takes the server away and
/// wants the calls to find out soon.
pub async fn impatient_runtime(url: &str) -> LockRuntime {
    impatient(LockRuntime::builder().redis(url)).await
}

/// The runtime `builder` makes (of any backend), with response and connect
/// timeouts of 300 ms, as [`impatient_runtime`]'s.
pub async fn impatient(builder: LockRuntimeBuilder) -> LockRuntime {
    let timeout = Duration::from_millis(300);
    let builder = builder.response_timeout(timeout).connect_timeout(timeout);
    builder.build().await.expect("build the lock runtime")
}

/// Installs a runtime on the shared Redis under `prefix` as the global
/// runtime (once per test binary: a later call, or a race lost to another
/// test, gets the one installed).
pub async fn install_global(prefix: &str) -> LockRuntime {
    if let Ok(runtime) = LockRuntime::global() {
        return runtime;
    }
    let runtime = runtime_at(&redis().url(), prefix).await;
    match runtime.clone().install() {
        Ok(()) => runtime,
        Err(LockError::AlreadyInstalled) => LockRuntime::global().unwrap(),
        Err(e) => panic!("{e}"),
    }
}

/// Takes the test binary's timing turn: the tests that measure a bound
/// with little slack hold it, so that no other such test runs beside them
/// (the machine has few cores).
pub async fn timing_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

/// Whether the lock `request` asks for is taken at once (`try_acquire`);
/// a hold it gets is given back at once (its guard dropped).
pub async fn try_takes(request: lock_runtime::LockRequest) -> bool {
    request.try_acquire().await.unwrap().is_some()
}

/// Takes the lock `request` asks for and gives it back at once (a warm-up,
/// or a lock a test needs taken once), failing the test if either fails.
pub async fn take_and_release(request: lock_runtime::LockRequest) {
    request.acquire().await.unwrap().release().await.unwrap();
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
    use std::time::Instant;
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
