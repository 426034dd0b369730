//! What the runtime logs, and how often: an outage of the backend is said
//! once, with what is still pending, not once per retry for as long as it
//! lasts. A binary of its own: it installs the process-wide `tracing`
//! subscriber (the runtime logs from its own thread).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lock_testkit::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// The events of this process's runtimes: one subscriber for the process,
/// installed by the first test that asks (each test counts its own
/// backend's messages).
fn events() -> Events {
    static EVENTS: OnceLock<Events> = OnceLock::new();
    EVENTS
        .get_or_init(|| {
            let events = Events::default();
            tracing::subscriber::set_global_default(events.clone()).unwrap();
            events
        })
        .clone()
}

/// Every event of the runtime, as `LEVEL message field=value …`.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<String>>>);

impl Events {
    fn count(&self, level: &str, text: &str) -> usize {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|e| e.starts_with(level) && e.contains(text))
            .count()
    }

    fn matching(&self, text: &str) -> Vec<String> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|e| e.contains(text))
            .cloned()
            .collect()
    }
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl Subscriber for Events {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target().starts_with("lock_runtime")
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(event.metadata().level().to_string());
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// During an outage every background release fails: a dropped guard's, and
/// the give-back of each failed acquire attempt of a waiter (about one a
/// second). That is one warning for the outage, naming what is pending, and
/// debug events for the rest; once releases go through again, the next
/// outage is a new one and is said again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_of_background_releases_is_warned_about_once_with_what_is_pending() {
    let events = events();
    let mut server = RedisServer::start();
    let runtime = lock_tests::impatient_runtime(&server.url()).await;
    let warned = "freed by their leases instead";
    let failed = |events: &Events| {
        events.count("WARN", warned) + events.count("DEBUG", "background releases still failing")
    };

    for outage in 1..=2 {
        let guard = runtime.lock("held").acquire().await.unwrap();
        server.kill();
        drop(guard);
        // A waiter whose failing attempts give their ids back, in the
        // background, until four batches of releases have failed.
        let waiter = runtime
            .lock("waited")
            .wait(Duration::from_secs(20))
            .acquire();
        let waiter = tokio::spawn(waiter);
        let start = Instant::now();
        while failed(&events) < 4 * outage {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "outage {outage}: background releases did not fail four times: {:?}",
                events.matching("release")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        waiter.abort();
        assert_eq!(
            events.count("WARN", warned),
            outage,
            "one warning per outage: {:#?}",
            events.matching(warned)
        );
        let warnings = events.matching(warned);
        let warning = warnings
            .iter()
            .rev()
            .find(|e| e.starts_with("WARN"))
            .unwrap();
        assert!(warning.contains("pending="), "{warning}");
        assert!(warning.contains("given_up="), "{warning}");

        // Releases go through again: the outage is over.
        server.restart().await;
        let start = Instant::now();
        loop {
            if let Ok(guard) = runtime.lock("after").acquire().await {
                drop(guard);
                if events.count("INFO", "go through again; those given up") == outage {
                    break;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no background release went through after the restart: {:?}",
                events.matching("release")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// On etcd and ZooKeeper a release is retried until the backend answers:
/// releases that fail one after another in an outage (guards dropped a
/// moment apart, each its own batch) are one warning naming the backend,
/// then debug events, and one info event once a release goes through.
async fn retried_releases_warn_once_per_outage(
    runtime: lock_runtime::LockRuntime,
    backend: &str,
    outage: impl FnOnce(),
    over: impl FnOnce(),
) {
    let events = events();
    let warned = format!("background releases fail: {backend}");
    let mut guards = Vec::new();
    for n in 0..3 {
        guards.push(
            runtime
                .lock(format!("dropped-{n}"))
                .acquire()
                .await
                .unwrap(),
        );
    }
    outage();
    for guard in guards {
        drop(guard);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let failing = |events: &Events| {
        events.count("WARN", &warned) + events.count("DEBUG", "background release still failing")
    };
    let start = Instant::now();
    while failing(&events) < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "three releases did not fail past their quick attempts: {:#?}",
            events.matching("release")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        events.count("WARN", &warned),
        1,
        "{:#?}",
        events.matching("release")
    );
    over();
    let again = format!("background releases go through again on {backend}");
    let start = Instant::now();
    while events.count("INFO", &again) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no release went through after the outage: {:#?}",
            events.matching("release")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_of_retried_releases_is_warned_about_once() {
    let cluster = lock_testkit::etcd::EtcdCluster::start(1);
    let timeout = Duration::from_millis(300);
    let runtime = lock_runtime::LockRuntime::builder()
        .etcd(cluster.endpoints())
        .response_timeout(timeout)
        .build()
        .await
        .unwrap();
    let name = format!("etcd at {}", cluster.endpoints().join(","));
    let (freeze, thaw) = (|| cluster.freeze(0), || cluster.thaw(0));
    retried_releases_warn_once_per_outage(runtime, &name, freeze, thaw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zookeeper_outage_of_retried_releases_is_warned_about_once() {
    let server = lock_testkit::zookeeper::ZooKeeperServer::start();
    let timeout = Duration::from_millis(300);
    let runtime = lock_runtime::LockRuntime::builder()
        .zookeeper(server.connect_string())
        .response_timeout(timeout)
        .build()
        .await
        .unwrap();
    let name = format!("ZooKeeper at {}", server.connect_string());
    let (freeze, thaw) = (|| server.freeze(), || server.thaw());
    retried_releases_warn_once_per_outage(runtime, &name, freeze, thaw).await;
}
