//! `lockctl` as an operator runs it: the built binary against a private
//! `redis-server`, with the lock held by this test process (another
//! process than `lockctl`'s). Output text, JSON and exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Output, Stdio};
use std::time::Duration;

use lock_tests::{redis, unique, Kind};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// How long one `lockctl` run may take before the test fails.
const RUN_LIMIT: Duration = Duration::from_secs(20);

/// `lockctl` with no URL or prefix from the environment.
fn lockctl(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("LOCK_REDIS_URL")
        .env_remove("LOCK_PREFIX")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs `lockctl args` on the test server under `prefix`, with `stdin`.
async fn run(prefix: &str, args: &[&str], stdin: &str) -> Output {
    let url = redis().url();
    let mut all = vec!["--redis-url", &url, "--prefix", prefix];
    all.extend_from_slice(args);
    run_raw(&all, stdin).await
}

async fn run_raw(args: &[&str], stdin: &str) -> Output {
    let mut child = lockctl(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .expect("lockctl finished in time")
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("exited, not killed")
}

/// `show` prints the holder, holds, lease, token and queue the runtime
/// records, as text and as JSON, exit 0; a free key prints `free`, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_tells_holder_token_and_lease_of_a_lock_held_elsewhere() {
    let prefix = unique("ctl-show");
    let holder = Kind::Redis.runtime(&prefix).await;
    let guard = holder
        .lock("order:42")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let info = holder.inspect("order:42").await.unwrap().unwrap();

    let text = run(&prefix, &["show", "order:42"], "").await;
    assert_eq!(code(&text), 0, "{}", stderr(&text));
    let out = stdout(&text);
    assert!(out.starts_with("order:42: held\n"), "{out}");
    assert!(
        out.contains(&format!("  holder      {}\n", info.holder)),
        "{out}"
    );
    assert!(out.contains("  holds       1\n"), "{out}");
    assert!(
        out.contains(&format!("  fence       {}\n", guard.fence())),
        "{out}"
    );
    assert!(out.contains("  queue       0 waiting"), "{out}");

    let json = run(&prefix, &["show", "order:42", "--json"], "").await;
    assert_eq!(code(&json), 0);
    let value: Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(value["key"], "order:42");
    assert_eq!(value["held"], true);
    assert_eq!(value["holder"], info.holder.as_str());
    assert_eq!(value["holds"], 1);
    assert_eq!(value["fence"], guard.fence());
    assert_eq!(value["queue"], Value::Array(vec![]));
    let left = value["remaining_lease_ms"].as_u64().unwrap();
    assert!((20_000..=30_000).contains(&left), "{left}");

    let free = run(&prefix, &["show", "order:7"], "").await;
    assert_eq!(code(&free), 1);
    assert_eq!(stdout(&free), "order:7: free\n");
    let free = run(&prefix, &["show", "order:7", "--json"], "").await;
    assert_eq!(code(&free), 1);
    let value: Value = serde_json::from_str(&stdout(&free)).unwrap();
    assert_eq!(
        value,
        serde_json::json!({ "key": "order:7", "held": false })
    );
    guard.release().await.unwrap();
}

/// `list` shows every lock held under the prefix and nothing of other
/// prefixes; with none held it says so, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_the_locks_of_its_prefix_only() {
    let prefix = unique("ctl-list");
    let holder = Kind::Redis.runtime(&prefix).await;
    let other = Kind::Redis.runtime(&format!("{prefix}other:")).await;
    let a = holder.lock("job:a").acquire().await.unwrap();
    let b = holder.lock("}odd").acquire().await.unwrap();
    let elsewhere = other.lock("job:z").acquire().await.unwrap();

    let text = run(&prefix, &["list"], "").await;
    assert_eq!(code(&text), 0, "{}", stderr(&text));
    let out = stdout(&text);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[1].starts_with("job:a "), "{out}");
    assert!(lines[1].contains(&a.fence().to_string()), "{out}");
    assert!(lines[2].starts_with("}odd "), "{out}");

    let json = run(&prefix, &["list", "--json"], "").await;
    let value: Value = serde_json::from_str(&stdout(&json)).unwrap();
    let keys: Vec<&str> = value
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["job:a", "}odd"]);

    let none = run(&unique("ctl-list-none"), &["list"], "").await;
    assert_eq!(code(&none), 1);
    assert!(
        stdout(&none).starts_with("no locks held"),
        "{}",
        stdout(&none)
    );
    for guard in [a, b, elsewhere] {
        guard.release().await.unwrap();
    }
}

/// `release` refuses without `--force`, asks before taking the lock (a
/// "no" keeps it), and with `--yes` frees it: the key is free at once and
/// the holder learns it lost the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_asks_and_then_frees_the_lock_from_its_holder() {
    let prefix = unique("ctl-release");
    let holder = Kind::Redis.runtime(&prefix).await;
    let guard = holder
        .lock("stuck")
        .lease(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();

    let unforced = run(&prefix, &["release", "stuck"], "").await;
    assert_eq!(code(&unforced), 2);
    assert!(
        stderr(&unforced).contains("--force"),
        "{}",
        stderr(&unforced)
    );

    let refused = run(&prefix, &["release", "stuck", "--force"], "n\n").await;
    assert_eq!(code(&refused), 1);
    assert!(
        stderr(&refused).contains("release stuck held by"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(stdout(&refused), "stuck: not released\n");
    assert!(holder.is_locked("stuck").await.unwrap());

    let done = run(&prefix, &["release", "stuck", "--force"], "yes\n").await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));
    assert!(
        stdout(&done).starts_with("stuck: released (was held by "),
        "{}",
        stdout(&done)
    );
    assert!(!holder.is_locked("stuck").await.unwrap());
    tokio::time::timeout(Duration::from_secs(40), guard.lost())
        .await
        .expect("the holder learns it lost the lock");

    let again = run(
        &prefix,
        &["release", "stuck", "--force", "--yes", "--json"],
        "",
    )
    .await;
    assert_eq!(code(&again), 1);
    let value: Value = serde_json::from_str(&stdout(&again)).unwrap();
    assert_eq!(value["released"], false);
}

/// `watch` prints the state, then a release and the next acquisition as
/// they happen, and stops after `--count` events with exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_releases_and_acquisitions_as_they_happen() {
    let prefix = unique("ctl-watch");
    let holder = Kind::Redis.runtime(&prefix).await;
    let first = holder.lock("k").acquire().await.unwrap();
    let first_holder = holder.inspect("k").await.unwrap().unwrap().holder;
    let url = redis().url();
    let mut child = lockctl(&[
        "--redis-url",
        &url,
        "--prefix",
        &prefix,
        "watch",
        "k",
        "--count",
        "2",
        "--for",
        "20s",
    ])
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let state = next_line(&mut lines).await;
    assert!(
        state.contains(&format!("k: held by {first_holder}")),
        "{state}"
    );
    // Subscribed before it printed the state: this release is seen.
    first.release().await.unwrap();
    let released = next_line(&mut lines).await;
    assert!(
        released.contains(&format!("k: released by {first_holder}")),
        "{released}"
    );
    let second = holder.lock("k").acquire().await.unwrap();
    let acquired = next_line(&mut lines).await;
    assert!(
        acquired.contains("k: acquired by ") && acquired.contains(&second.fence().to_string()),
        "{acquired}"
    );
    let status = tokio::time::timeout(RUN_LIMIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    second.release().await.unwrap();
}

/// The next line of a child's output (bounded).
async fn next_line(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> String {
    tokio::time::timeout(RUN_LIMIT, lines.next_line())
        .await
        .expect("a line in time")
        .unwrap()
        .expect("a line")
}

/// Bad input and an unreachable server are usage/connection errors (exit
/// 2) with a message saying which, and the password never appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_url_unreachable_server_and_no_url_are_clear_errors_without_the_password() {
    let bad = run_raw(
        &["--redis-url", "http://:hunter2@localhost", "show", "k"],
        "",
    )
    .await;
    assert_eq!(code(&bad), 2);
    assert!(
        stderr(&bad).contains("bad Redis URL http://:***@localhost"),
        "{}",
        stderr(&bad)
    );

    let port = lock_testkit::free_port();
    let url = format!("redis://app:hunter2@127.0.0.1:{port}");
    let unreachable = run_raw(&["--redis-url", &url, "show", "k"], "").await;
    assert_eq!(code(&unreachable), 2);
    let message = stderr(&unreachable);
    assert!(
        message.contains(&format!(
            "cannot reach Redis at redis://app:***@127.0.0.1:{port}"
        )),
        "{message}"
    );
    for output in [&bad, &unreachable] {
        assert!(!stderr(output).contains("hunter2") && !stdout(output).contains("hunter2"));
    }

    let none = run_raw(&["show", "k"], "").await;
    assert_eq!(code(&none), 2);
    assert!(
        stderr(&none).contains("pass --redis-url or set REDIS_URL"),
        "{}",
        stderr(&none)
    );

    let usage = run_raw(&["show"], "").await;
    assert_eq!(code(&usage), 2);
}
