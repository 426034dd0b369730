//! The order service as it runs: the built binary on a free loopback port
//! against a private `redis-server`, driven over HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use lock_testkit::signal::{self, Signal};
use lock_tests::{poll_until, redis, unique, Kind};
use order_service::client::{self, Response};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// How long a start, a request or an exit may take before the test fails.
const LIMIT: Duration = Duration::from_secs(30);

/// `order-service` with the test server and `prefix`, and nothing else
/// from the environment.
fn command(prefix: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_order-service"));
    command
        .env("REDIS_URL", redis().url())
        .env("LOCK_PREFIX", prefix)
        .env_remove("LOCK_REDIS_URL")
        .env_remove("LOCK_BACKEND")
        .env_remove("LOCK_FAIR")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// A running service.
struct Service {
    child: Child,
    out: Lines<BufReader<ChildStdout>>,
    url: String,
}

impl Service {
    async fn start(prefix: &str, extra: &[&str]) -> Service {
        let addr = format!("127.0.0.1:{}", lock_testkit::free_port());
        let mut child = command(prefix)
            .args(["--addr", &addr])
            .args(extra)
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = next_line(&mut out).await;
        assert_eq!(first, format!("listening on http://{addr}"));
        Service {
            child,
            out,
            url: format!("http://{addr}"),
        }
    }

    async fn call(&self, method: &str, path: &str) -> (u16, Value) {
        let Response { status, body } = client::request(&self.url, method, path).await.unwrap();
        let value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        (status, value)
    }
}

async fn next_line(out: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(LIMIT, out.next_line())
        .await
        .expect("a line in time")
        .unwrap()
        .expect("a line")
}

/// A payment runs `pay`, whose nested locked check re-enters the order's
/// lock (two holds, one backend lock); a second payment finds it paid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_reenters_its_lock_in_the_nested_check_and_charges_once() {
    let service = Service::start(&unique("svc-pay"), &[]).await;
    let (status, paid) = service
        .call("POST", "/orders/1/pay?amount=100&work_ms=1")
        .await;
    assert_eq!(status, 200, "{paid}");
    assert_eq!(paid["nested_holds"], 2, "{paid}");
    assert_eq!(paid["order"]["charges"], 1);
    assert_eq!(paid["order"]["total"], 100);
    assert!(paid["fence"].as_u64().unwrap() > 0);
    assert_eq!(paid["order"]["fence"], paid["fence"]);

    let (status, again) = service
        .call("POST", "/orders/1/pay?amount=100&work_ms=1")
        .await;
    assert_eq!(status, 409);
    assert_eq!(again["kind"], "already_paid");
    let (_, order) = service.call("GET", "/orders/1").await;
    assert_eq!(order["charges"], 1);
}

/// A holder that comes back with an older token than the store has seen
/// (paused past its lease) is refused by the store, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_refuses_a_write_with_a_stale_fencing_token() {
    let service = Service::start(&unique("svc-fence"), &[]).await;
    let (status, paid) = service
        .call("POST", "/orders/2/pay?amount=100&work_ms=1")
        .await;
    assert_eq!(status, 200, "{paid}");
    let token = paid["fence"].as_u64().unwrap();

    let stale = format!("/orders/2/late-write?fence={}&amount=100", token - 1);
    let (status, refused) = service.call("POST", &stale).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["kind"], "stale_token");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains(&format!("already accepted {token}")),
        "{refused}"
    );
    let (_, order) = service.call("GET", "/orders/2").await;
    assert_eq!(
        (order["charges"].as_u64(), order["fence"].as_u64()),
        (Some(1), Some(token))
    );
}

/// `/locks/{key}` shows what `inspect` says: a lock held by another
/// process with its holder and token, then free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspect_endpoint_shows_a_lock_held_by_another_process() {
    let prefix = unique("svc-inspect");
    let service = Service::start(&prefix, &[]).await;
    let other = Kind::Redis.runtime(&prefix).await;
    let guard = other
        .lock("order:7")
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let holder = other.inspect("order:7").await.unwrap().unwrap().holder;

    let (status, lock) = service.call("GET", "/locks/order:7").await;
    assert_eq!(status, 200);
    assert_eq!(lock["held"], true);
    assert_eq!(lock["holder"], holder.as_str());
    assert_eq!(lock["held_by_this_process"], false);
    assert_eq!(lock["holds"], 1);
    assert_eq!(lock["fence"], guard.fence());
    let left = lock["remaining_lease_ms"].as_u64().unwrap();
    assert!((10_000..=20_000).contains(&left), "{left}");

    guard.release().await.unwrap();
    let (_, lock) = service.call("GET", "/locks/order:7").await;
    assert_eq!(lock, serde_json::json!({ "key": "order:7", "held": false }));
}

/// `/metrics` is Prometheus text with the runtime's lock metrics and the
/// service's own, counting what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_counts_acquisitions_holds_and_payments() {
    let service = Service::start(&unique("svc-metrics"), &[]).await;
    service
        .call("POST", "/orders/3/pay?amount=5&work_ms=1")
        .await;
    service
        .call("POST", "/orders/3/pay?amount=5&work_ms=1")
        .await;
    // The second payment's release goes to the server behind its
    // response: its hold ends (and is counted) when the server answers.
    let lines = [
        "# HELP lock_acquisitions_total Lock acquires that ended, by outcome",
        // Two payments, each with its nested check: four acquires, of which
        // two were backend holds.
        "lock_acquisitions_total{outcome=\"acquired\"} 4",
        "lock_hold_seconds_count 2",
        "lock_held 0",
        "orders_payments_total{result=\"charged\"} 1",
        "orders_payments_total{result=\"already_paid\"} 1",
    ];
    let mut text = String::new();
    poll_until("the metrics settle", LIMIT, async || {
        text = client::request(&service.url, "GET", "/metrics")
            .await
            .unwrap()
            .body;
        lines.iter().all(|line| text.lines().any(|l| l == *line))
    })
    .await;
}

/// The load mode starts several processes of the service, pays the same
/// orders concurrently through all of them, and finds each charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_mode_finds_no_order_charged_twice_across_processes() {
    let run = command(&unique("svc-load"))
        .args([
            "--load",
            "--processes",
            "2",
            "--orders",
            "3",
            "--requests",
            "6",
        ])
        .output();
    let output = tokio::time::timeout(LIMIT * 2, run).await.unwrap().unwrap();
    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(
        out.contains("load: 3 charged, 15 already paid, 0 failed"),
        "{out}"
    );
    assert!(
        out.contains(
            "load: no order was double-charged: each of the 3 orders was charged exactly once"
        ),
        "{out}"
    );
    assert!(
        out.contains("lock_acquisitions_total{outcome=\"acquired\"}"),
        "{out}"
    );
}

/// SIGTERM: the service stops taking requests, and the lock of a payment
/// still running is given back at once (free right after the exit, long
/// before its 10 s lease would end); that payment answers 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_locks_still_held_at_once() {
    let prefix = unique("svc-sigterm");
    let mut service = Service::start(&prefix, &["--grace-ms", "200"]).await;
    let observer = Kind::Redis.runtime(&prefix).await;
    let url = service.url.clone();
    let slow = tokio::spawn(async move {
        client::request(&url, "POST", "/orders/9/pay?amount=1&work_ms=60000").await
    });
    let started = Instant::now();
    while !observer.is_locked("order:9").await.unwrap() {
        assert!(started.elapsed() < LIMIT, "the payment never took its lock");
        tokio::task::yield_now().await;
    }

    let term = Instant::now();
    signal::send(service.child.id().unwrap(), Signal::Term).unwrap();
    let status = tokio::time::timeout(LIMIT, service.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        observer.inspect("order:9").await.unwrap().is_none(),
        "still locked after exit"
    );
    assert!(
        term.elapsed() < Duration::from_secs(5),
        "{:?}",
        term.elapsed()
    );

    let answer = slow.await.unwrap().unwrap();
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(answer.body.contains("shutting_down"), "{}", answer.body);
    let mut said = Vec::new();
    while let Ok(Some(line)) = service.out.next_line().await {
        said.push(line);
    }
    assert!(
        said.contains(&"stopped: released 1 lock(s)".to_owned()),
        "{said:?}"
    );
}
