//! The `metrics` feature: every acquire, hold, waiter, renewal and loss is
//! counted where it happens, against a real Redis and a recorder of our
//! own. One test: the recorder is process-wide, and the counts it checks
//! are exact.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lock_runtime::LockError;
use lock_tests::{builder_at, redis, unique, wait_until, FaultProxy, Kind};
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// Samples of one histogram.
#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

/// Every series by `name{label=value,…}` (labels in the order given).
#[derive(Default)]
struct Seen {
    counters: Mutex<HashMap<String, Arc<AtomicU64>>>,
    gauges: Mutex<HashMap<String, Arc<AtomicU64>>>,
    histograms: Mutex<HashMap<String, Arc<Samples>>>,
    described: Mutex<Vec<String>>,
}

impl Seen {
    /// Records that `key` was described.
    fn describe(&self, key: KeyName) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }
}

fn series(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    if labels.is_empty() {
        key.name().to_owned()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

struct Record(&'static Seen);

impl Recorder for Record {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.0.describe(key);
    }
    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.0.describe(key);
    }
    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.0.describe(key);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut map = self.0.counters.lock().unwrap();
        Counter::from_arc(map.entry(series(key)).or_default().clone())
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut map = self.0.gauges.lock().unwrap();
        Gauge::from_arc(map.entry(series(key)).or_default().clone())
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut map = self.0.histograms.lock().unwrap();
        Histogram::from_arc(map.entry(series(key)).or_default().clone())
    }
}

fn seen() -> &'static Seen {
    static SEEN: OnceLock<&'static Seen> = OnceLock::new();
    SEEN.get_or_init(|| {
        let seen: &'static Seen = Box::leak(Box::default());
        metrics::set_global_recorder(Record(seen)).expect("the only recorder");
        seen
    })
}

fn counter(name: &str) -> u64 {
    let map = seen().counters.lock().unwrap();
    map.get(name).map_or(0, |c| c.load(Ordering::Relaxed))
}

fn gauge(name: &str) -> f64 {
    let map = seen().gauges.lock().unwrap();
    map.get(name)
        .map_or(0.0, |g| f64::from_bits(g.load(Ordering::Relaxed)))
}

fn samples(name: &str) -> Vec<f64> {
    let map = seen().histograms.lock().unwrap();
    map.get(name)
        .map_or(Vec::new(), |h| h.0.lock().unwrap().clone())
}

const ACQUIRED: &str = "lock_acquisitions_total{outcome=acquired}";
const BUSY: &str = "lock_acquisitions_total{outcome=busy}";
const TIMEOUT: &str = "lock_acquisitions_total{outcome=timeout}";

/// Acquired, busy and timed-out acquires, holds, waiters, renewals (good
/// and failed) and lost locks each move their metric by exactly what
/// happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_holds_waiters_renewals_and_losses_are_counted() {
    let seen = seen();
    lock_runtime::describe_metrics();
    for name in [
        "lock_acquisitions_total",
        "lock_hold_seconds",
        "lock_waiters",
    ] {
        assert!(
            seen.described.lock().unwrap().iter().any(|d| d == name),
            "{name}"
        );
    }
    let prefix = unique("metrics");
    let (a, b) = (
        Kind::Redis.runtime(&prefix).await,
        Kind::Redis.runtime(&prefix).await,
    );

    // An acquire that takes the lock: one acquisition, one wait sample, one hold.
    let acquired = counter(ACQUIRED);
    let waits = samples("lock_wait_seconds{outcome=acquired}").len();
    let guard = a.lock("order:1").acquire().await.unwrap();
    assert_eq!(counter(ACQUIRED), acquired + 1);
    assert_eq!(
        samples("lock_wait_seconds{outcome=acquired}").len(),
        waits + 1
    );
    assert_eq!(gauge("lock_held"), 1.0);

    // A try-once that finds it held is `busy`, a bounded wait that runs out
    // `timeout`; neither is a hold.
    let busy = counter(BUSY);
    assert!(b.lock("order:1").try_acquire().await.unwrap().is_none());
    assert_eq!(counter(BUSY), busy + 1);
    let timeouts = counter(TIMEOUT);
    let request = b.lock("order:1").wait(Duration::from_millis(50));
    let waited = request.acquire().await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    assert_eq!(counter(TIMEOUT), timeouts + 1);
    assert_eq!(gauge("lock_held"), 1.0);

    // A waiter shows in the gauge while it waits, and leaves it with the lock.
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            b.lock("order:1")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        }
    });
    wait_until("one waiter", || gauge("lock_waiters") == 1.0).await;
    let holds = samples("lock_hold_seconds").len();
    guard.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(gauge("lock_waiters"), 0.0);
    assert_eq!(samples("lock_hold_seconds").len(), holds + 1);
    assert_eq!(counter(ACQUIRED), acquired + 2);
    assert_eq!(gauge("lock_held"), 1.0);
    drop(second.release().await);
    wait_until("no hold left", || gauge("lock_held") == 0.0).await;

    // A renewed lock costs renewal round trips; one deleted under its holder
    // is lost, and counted once.
    let renewals = counter("lock_renewal_round_trips_total");
    let lost = counter("lock_lost_total");
    // (1 s: a shorter lease could run out before its first renewal on a
    // loaded machine, which is a loss by the server, not by force.)
    let request = a.lock("order:2").lease(Duration::from_secs(1));
    let guard = request.acquire().await.unwrap();
    wait_until("a renewal", || {
        counter("lock_renewal_round_trips_total") > renewals
    })
    .await;
    assert!(b.force_unlock("order:2").await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the holder learns its lock is gone");
    // (The client-side lease end may tell the guard before the renewal that
    // finds the key gone counts the loss.)
    wait_until("the loss counted", || counter("lock_lost_total") > lost).await;
    assert_eq!(counter("lock_lost_total"), lost + 1);
    assert_eq!(counter("lock_renewal_failures_total"), 0);
    drop(guard);
    wait_until("no hold left", || gauge("lock_held") == 0.0).await;

    // Renewals that get no answer (a stalled network) are failures; the
    // lock is lost at its lease end, and counted so.
    let proxy = FaultProxy::start(redis().port()).await;
    let builder = builder_at(&proxy.url(), &prefix);
    // Short, so that its stop does not wait long for the stalled releases.
    let through = builder
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let lost = counter("lock_lost_total");
    let request = through.lock("order:3").lease(Duration::from_millis(300));
    let guard = request.acquire().await.unwrap();
    proxy.stall();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost at its lease end");
    wait_until("a failed renewal", || {
        counter("lock_renewal_failures_total") >= 1
    })
    .await;
    wait_until("the loss counted", || counter("lock_lost_total") > lost).await;
    assert_eq!(counter("lock_lost_total"), lost + 1);
    drop(guard);
    proxy.resume();
}
