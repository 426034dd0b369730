//! What the runtime logs, and how often: an outage of the backend is said
//! once, with what is still pending, not once per retry for as long as it
//! lasts. A binary of its own: it installs the process-wide `tracing`
//! subscriber (the runtime logs from its own thread).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_testkit::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

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
    let events = Events::default();
    tracing::subscriber::set_global_default(events.clone()).unwrap();
    let mut server = RedisServer::start();
    let runtime = lock_tests::impatient_runtime(&server.url()).await;
    let warned = "background release";
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
                if events.count("INFO", "background releases go through again") == outage {
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
