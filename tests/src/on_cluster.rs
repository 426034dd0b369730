//! What the Redis Cluster tests (`cluster.rs`) set up: a cluster of a test's
//! own (a slot move or a frozen master would disturb any other test on a
//! shared one) with runtimes on it, the master of a lock, keys on every
//! master, a master made to look restarted empty, and the load that runs
//! while slots move (workers on two runtimes, and the mover).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockRuntime, LockRuntimeBuilder};
use lock_testkit::RedisCluster;
use tokio::sync::MutexGuard;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::stored::kill_clients;
use crate::{timing_turn, unique, Occupancy};

/// A cluster for one test, a prefix for its runtimes, and (for a fault
/// test) the binary's timing turn, held while the test runs.
pub struct ClusterTest {
    /// The cluster, alive until the test process exits (so that a blocking
    /// task may move its slots).
    pub cluster: &'static RedisCluster,
    /// The prefix every runtime of the test shares.
    pub prefix: String,
    _turn: Option<MutexGuard<'static, ()>>,
}

impl ClusterTest {
    /// A cluster of three masters of the test's own, under a prefix made
    /// from `name`.
    pub fn own(name: &str) -> ClusterTest {
        ClusterTest {
            cluster: Box::leak(Box::new(RedisCluster::start(3))),
            prefix: unique(name),
            _turn: None,
        }
    }

    /// Like [`own`](Self::own), for a fault test: it first takes the timing
    /// turn, so that no other fault test runs beside it (they measure
    /// timing on a small machine).
    pub async fn own_in_turn(name: &str) -> ClusterTest {
        let turn = timing_turn().await;
        ClusterTest {
            _turn: Some(turn),
            ..ClusterTest::own(name)
        }
    }

    /// The binary's shared cluster (for a test that disturbs nothing),
    /// under a prefix made from `name`.
    pub fn shared(name: &str) -> ClusterTest {
        ClusterTest {
            cluster: crate::cluster(),
            prefix: unique(name),
            _turn: None,
        }
    }

    /// A builder on the cluster with the test's prefix.
    pub fn builder(&self) -> LockRuntimeBuilder {
        LockRuntime::builder()
            .redis_cluster(self.cluster.urls())
            .key_prefix(&self.prefix)
    }

    /// A runtime (one "process" of the test) in the builder's default mode.
    pub async fn runtime(&self) -> LockRuntime {
        self.builder().build().await.unwrap()
    }

    /// A runtime in plain mode (or fair mode, `fair`), default timeouts.
    pub async fn runtime_fair(&self, fair: bool) -> LockRuntime {
        self.builder().fair(fair).build().await.unwrap()
    }

    /// Two plain-mode runtimes: two processes (a holder and a waiter).
    pub async fn two_plain(&self) -> (LockRuntime, LockRuntime) {
        (
            self.runtime_fair(false).await,
            self.runtime_fair(false).await,
        )
    }

    /// Moves `slot` (with its keys) from its master to the next one;
    /// returns both masters.
    pub async fn move_to_next(&self, slot: u16) -> (usize, usize) {
        let cluster = self.cluster;
        let from = cluster.owner_of(slot);
        let to = (from + 1) % 3;
        let moved = tokio::task::spawn_blocking(move || cluster.move_slot(slot, to));
        moved.await.unwrap();
        (from, to)
    }

    /// The master that stores the lock of `key` of `runtime`.
    pub fn master_of(&self, runtime: &LockRuntime, key: &str) -> usize {
        master_of(self.cluster, runtime, key)
    }

    /// Makes master `index` look restarted empty, without losing its place
    /// in the cluster: its data and script cache are flushed and its
    /// clients' connections dropped (the test kit's `restart` needs the node
    /// mutably, which `RedisCluster` does not lend).
    pub async fn restart_empty(&self, index: usize) {
        let mut con = self.cluster.node(index).connection().await;
        for flush in [
            redis::cmd("FLUSHALL"),
            redis::cmd("SCRIPT").arg("FLUSH").clone(),
        ] {
            let () = flush.query_async(&mut con).await.unwrap();
        }
        kill_clients(&mut con, &["normal", "pubsub"]).await;
    }
}

/// The master of `cluster` that stores the lock of `key` of `runtime`.
pub fn master_of(cluster: &RedisCluster, runtime: &LockRuntime, key: &str) -> usize {
    cluster.owner_of(cluster.slot_of(&runtime.backend_key(key)))
}

/// `per` keys whose locks live on each master, by master.
pub fn keys_by_master(
    cluster: &RedisCluster,
    runtime: &LockRuntime,
    per: usize,
) -> Vec<Vec<String>> {
    let mut found: Vec<Vec<String>> = vec![Vec::new(); 3];
    for n in 0..10_000 {
        let key = format!("item:{n}");
        let owner = master_of(cluster, runtime, &key);
        if found[owner].len() < per {
            found[owner].push(key);
        }
        if found.iter().all(|keys| keys.len() == per) {
            return found;
        }
    }
    panic!("no keys found on every master");
}

/// Moves `slot` of `cluster` to the next master `moves` times, `pause`
/// apart (and `pause` before the first), then after `settle` raises `stop`.
/// The task returns how long each move took.
pub fn spawn_slot_mover(
    cluster: &'static RedisCluster,
    slot: u16,
    (moves, pause, settle): (usize, Duration, Duration),
    stop: Arc<AtomicBool>,
) -> JoinHandle<Vec<Duration>> {
    tokio::task::spawn_blocking(move || {
        let mut took = Vec::new();
        for _ in 0..moves {
            std::thread::sleep(pause);
            let to = (cluster.owner_of(slot) + 1) % 3;
            let at = std::time::Instant::now();
            cluster.move_slot(slot, to);
            took.push(at.elapsed());
        }
        std::thread::sleep(settle);
        stop.store(true, Ordering::SeqCst);
        took
    })
}

/// What the workers of a load test share: its keys and, per key, a
/// non-atomic counter (loses updates without the lock), an occupancy and
/// the tokens its holders got in order; the holds made, the failed acquires
/// and releases (as text), the longest wait, and the flag that stops them.
#[derive(Default)]
pub struct Load {
    /// The keys the workers lock, in turn.
    pub keys: Vec<String>,
    /// Per key: the counter, incremented by load, pause, store.
    pub counters: Vec<AtomicU64>,
    /// Per key: how many holders were inside at once.
    pub occupancy: Vec<Occupancy>,
    /// Per key: the tokens of its holders, in the order they held it.
    pub tokens: Vec<Mutex<Vec<u64>>>,
    /// Holds made, by every worker.
    pub holds: AtomicU64,
    /// Acquires and releases that failed.
    pub errors: Mutex<Vec<String>>,
    /// The longest an acquire waited, in ms.
    pub longest_wait_ms: AtomicU64,
    /// Raised when the workers are to stop (after the hold they are in).
    pub stop: Arc<AtomicBool>,
}

/// How each worker of a [`Load`] holds its keys.
#[derive(Clone, Copy)]
pub struct Worker {
    /// Worker `w` starts at key `w * stride`.
    pub stride: usize,
    /// The lease of each hold, and the longest an acquire waits.
    pub lease: Duration,
    /// The longest an acquire waits.
    pub wait: Duration,
    /// How long the body holds (zero: one yield), between the counter's
    /// load and store.
    pub inside: Duration,
}

impl Load {
    /// The load on `keys`, nothing counted yet.
    pub fn on(keys: Vec<String>) -> Arc<Load> {
        Arc::new(Load {
            counters: keys.iter().map(|_| AtomicU64::new(0)).collect(),
            occupancy: keys.iter().map(|_| Occupancy::new()).collect(),
            tokens: keys.iter().map(|_| Mutex::new(Vec::new())).collect(),
            keys,
            ..Load::default()
        })
    }

    /// Spawns `workers` workers, worker `w` on `runtimes[w % 2]`, each
    /// holding the keys in turn until `stop` is raised.
    pub fn spawn(
        self: &Arc<Self>,
        runtimes: [&LockRuntime; 2],
        workers: usize,
        how: Worker,
    ) -> Vec<JoinHandle<()>> {
        (0..workers)
            .map(|w| tokio::spawn(self.clone().work(runtimes[w % 2].clone(), w, how)))
            .collect()
    }

    /// One worker's loop (see [`spawn`](Self::spawn)).
    async fn work(self: Arc<Self>, rt: LockRuntime, worker: usize, how: Worker) {
        let mut round = 0usize;
        while !self.stop.load(Ordering::SeqCst) {
            let i = (worker * how.stride + round) % self.keys.len();
            round += 1;
            let asked = Instant::now();
            let request = rt.lock(&self.keys[i]).lease(how.lease).wait(how.wait);
            let guard = match request.acquire().await {
                Ok(guard) => guard,
                Err(e) => {
                    self.error(format!("acquire {}: {e}", self.keys[i]));
                    continue;
                }
            };
            let waited = u64::try_from(asked.elapsed().as_millis()).unwrap();
            self.longest_wait_ms.fetch_max(waited, Ordering::SeqCst);
            {
                let _inside = self.occupancy[i].enter();
                self.tokens[i].lock().unwrap().push(guard.fence());
                let read = self.counters[i].load(Ordering::SeqCst);
                if how.inside.is_zero() {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(how.inside).await;
                }
                self.counters[i].store(read + 1, Ordering::SeqCst);
            }
            self.holds.fetch_add(1, Ordering::SeqCst);
            if let Err(e) = guard.release().await {
                self.error(format!("release {}: {e}", self.keys[i]));
            }
        }
    }

    fn error(&self, what: String) {
        eprintln!("{what}");
        self.errors.lock().unwrap().push(what);
    }

    /// The keys that had two holders at once, and the keys whose tokens did
    /// not grow in the order of their holders.
    pub fn doubled_and_unordered(&self) -> (Vec<String>, Vec<String>) {
        let mut doubled = Vec::new();
        let mut unordered = Vec::new();
        for (i, key) in self.keys.iter().enumerate() {
            if self.occupancy[i].max() > 1 {
                doubled.push(key.clone());
            }
            if !self.tokens[i]
                .lock()
                .unwrap()
                .windows(2)
                .all(|w| w[0] < w[1])
            {
                unordered.push(key.clone());
            }
        }
        (doubled, unordered)
    }

    /// The sum of the key counters.
    pub fn counted(&self) -> u64 {
        self.counters.iter().map(|c| c.load(Ordering::SeqCst)).sum()
    }
}
