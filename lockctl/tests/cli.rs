//! `lockctl` as an operator runs it: the built binary against a private
//! `redis-server`, with the lock held by this test process (another
//! process than `lockctl`'s). Output text, JSON and exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Output, Stdio};
use std::time::Duration;

use common::RUN_LIMIT;
use common::{
    code, held, holder_of, lockctl, run_env, stderr, stdout, taken, two_readers, Watching,
};
use common::{ERROR, FOUND, NOT_FOUND};
use lock_tests::{redis, unique, Kind};
use serde_json::Value;

/// Runs `lockctl args` on the test server under `prefix`, with `stdin`.
async fn run(prefix: &str, args: &[&str], stdin: &str) -> Output {
    let url = redis().url();
    let mut all = vec!["--redis-url", &url, "--prefix", prefix];
    all.extend_from_slice(args);
    run_raw(&all, stdin).await
}

/// Starts `lockctl watch args` on the test server under `prefix`.
fn watch(prefix: &str, args: &[&str]) -> Watching {
    let url = redis().url();
    let mut all = vec!["--redis-url", &url, "--prefix", prefix, "watch"];
    all.extend_from_slice(args);
    Watching::start(&all, &[])
}

async fn run_raw(args: &[&str], stdin: &str) -> Output {
    run_env(args, &[], stdin).await
}

/// `show` prints the holder, holds, lease, token and queue the runtime
/// records, as text and as JSON, exit 0; a free key prints `free`, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_tells_holder_token_and_lease_of_a_lock_held_elsewhere() {
    let prefix = unique("ctl-show");
    let holder = Kind::Redis.runtime(&prefix).await;
    let guard = held(&holder, "order:42", 30).await;
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
    assert!(out.contains("  mode        write\n"), "{out}");

    let json = run(&prefix, &["show", "order:42", "--json"], "").await;
    assert_eq!(code(&json), 0);
    let value: Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(value["key"], "order:42");
    assert_eq!(value["held"], true);
    assert_eq!(value["holder"], info.holder.as_str());
    assert_eq!(value["holds"], 1);
    assert_eq!(value["fence"], guard.fence());
    assert_eq!(value["queue"], Value::Array(vec![]));
    assert_eq!(value["mode"], "write");
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
    let guard = held(&holder, "stuck", 3).await;

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
    let (first, first_holder) = taken(&holder, "k").await;
    let mut watching = watch(&prefix, &["k", "--count", "2", "--for", "20s"]);
    watching
        .next_with(&[&format!("k: held by {first_holder}")])
        .await;
    // Subscribed before it printed the state: this release is seen.
    watching.release_seen(first, "k", &first_holder).await;
    let second = holder.lock("k").acquire().await.unwrap();
    let fence = second.fence().to_string();
    watching.next_with(&["k: acquired by ", &fence]).await;
    watching.exits_with(FOUND).await;
    second.release().await.unwrap();
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

/// No input makes lockctl print a password: not a URL without a scheme, not
/// a password holding `/`, not one in a query (`redis+unix://…?pass=`), not
/// a password given where the URL was expected, not a list of URLs, not
/// `REDIS_PASSWORD`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_is_never_printed_whatever_the_shape_of_the_input() {
    let port = lock_testkit::free_port();
    let server = format!("127.0.0.1:{port}");
    let urls = [
        ":hunter2@localhost:6379".to_owned(),
        "app:hunter2@localhost".to_owned(),
        format!("redis://:hunter2@{server}"),
        format!("redis://app:hun/ter2@{server}"),
        "redis+unix:///tmp/lockctl-no-such.sock?db=1&pass=hunter2".to_owned(),
        format!("redis://{server}/0?pass=hunter2"),
        "hunter2".to_owned(),
    ];
    let mut outputs = Vec::new();
    for url in &urls {
        outputs.push(run_raw(&["--redis-url", url, "show", "k"], "").await);
    }
    let cluster = format!("redis://:hunter2@{server},:hunter2@{server}");
    outputs.push(run_env(&["list"], &[("LOCK_REDIS_CLUSTER", &cluster)], "").await);
    let sentinel = [
        ("REDIS_SENTINELS", server.as_str()),
        ("REDIS_SENTINEL_SERVICE", "mymaster"),
        ("REDIS_PASSWORD", "hunter2"),
    ];
    outputs.push(run_env(&["show", "k"], &sentinel, "").await);
    let masters = format!("redis://:hunter2@{server},redis://:hunter2@{server},hunter2");
    outputs.push(run_env(&["list"], &[("REDLOCK_URLS", &masters)], "").await);
    outputs.push(run_env(&["show", "k"], &[("LOCK_REDIS_URL", "hunter2")], "").await);
    for output in &outputs {
        assert_eq!(code(output), ERROR, "{}", stderr(output));
        let all = format!("{}{}", stdout(output), stderr(output));
        assert!(
            !all.contains("hunter2") && !all.contains("hun/ter2"),
            "{all}"
        );
        assert!(all.contains("***") || !all.contains('@'), "{all}");
    }
}

/// `lockctl list | head -1`: the reader went away; lockctl stops quietly,
/// exit 0, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_into_a_closed_pipe_ends_quietly() {
    let prefix = unique("ctl-pipe");
    let holder = Kind::Redis.runtime(&prefix).await;
    let guard = holder.lock("a").acquire().await.unwrap();
    // The reading end is closed before lockctl writes: every write fails.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let url = redis().url();
    let child = lockctl(&["--redis-url", &url, "--prefix", &prefix, "list"], &[])
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code(&output), FOUND, "{}", stderr(&output));
    assert_eq!(stderr(&output), "");
    guard.release().await.unwrap();
}

/// `release KEY --yes` without `--force` suggests a command that runs as
/// written: with `--force --yes`, not one that asks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_with_yes_but_no_force_suggests_force_and_yes() {
    let prefix = unique("ctl-yes");
    let output = run(&prefix, &["release", "stuck", "--yes"], "").await;
    assert_eq!(code(&output), ERROR);
    assert!(
        stderr(&output).contains("`lockctl release stuck --force --yes`"),
        "{}",
        stderr(&output)
    );
}

/// A forced release is printed as forced, naming the hold it took, not as
/// a release by its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_says_a_forced_release_was_forced() {
    let prefix = unique("ctl-forced");
    let holder = Kind::Redis.runtime(&prefix).await;
    let (guard, held_by) = taken(&holder, "k").await;
    let mut watching = watch(&prefix, &["k", "--count", "1"]);
    watching
        .next_with(&[&format!("k: held by {held_by}")])
        .await;
    let freed = run(&prefix, &["release", "k", "--force", "--yes"], "").await;
    assert_eq!(code(&freed), FOUND, "{}", stderr(&freed));
    watching
        .next_with(&[&format!("k: forced release: was held by {held_by}")])
        .await;
    watching.exits_with(FOUND).await;
    drop(guard);
}

/// `watch` on a read hold: each reader that comes or goes is one event
/// (a second reader joining is not a release of the first, and a reader
/// leaving another behind, which sends no message, is seen at the next
/// look); the last reader's release frees the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_tells_each_reader_that_comes_and_goes() {
    let prefix = unique("ctl-watch-readers");
    let one = Kind::Redis.runtime(&prefix).await;
    let two = Kind::Redis.runtime(&prefix).await;
    let first = one.lock("k").read().acquire().await.unwrap();
    let first_holder = holder_of(&one, "k").await;
    let mut watching = watch(&prefix, &["k", "--count", "3", "--for", "20s"]);
    watching
        .next_with(&[&format!("k: held by {first_holder} (read×1")])
        .await;
    let second = two.lock("k").read().acquire().await.unwrap();
    let fence = second.fence().to_string();
    watching
        .next_with(&["k: acquired by ", &fence, "(read×2)"])
        .await;
    watching.release_seen(first, "k", &first_holder).await;
    second.release().await.unwrap();
    watching.next_with(&["k: released by "]).await;
    watching.exits_with(FOUND).await;
}

/// `release` of a read hold frees every reader and says how many, as text
/// and as JSON; each reader learns of its loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_of_a_read_hold_frees_and_names_every_reader() {
    let prefix = unique("ctl-release-readers");
    let ([one, _two], [a, b]) = two_readers(Kind::Redis, &prefix, "k").await;
    let info = one.inspect("k").await.unwrap().unwrap();
    let freed = run(&prefix, &["release", "k", "--force", "--yes"], "").await;
    assert_eq!(code(&freed), FOUND, "{}", stderr(&freed));
    let out = stdout(&freed);
    assert!(out.contains("k: released, freeing 2 readers"), "{out}");
    for reader in &info.readers {
        assert!(out.contains(&reader.holder), "{out}");
    }
    let writer = one.lock("k").write().try_acquire().await.unwrap();
    assert!(writer.is_some(), "the key stayed held");
    drop(writer);
    for guard in [&a, &b] {
        tokio::time::timeout(RUN_LIMIT, guard.lost())
            .await
            .expect("a reader was never told its hold was freed");
    }

    let c = one.lock("k").read().acquire().await.unwrap();
    let freed = run(&prefix, &["release", "k", "--force", "--yes", "--json"], "").await;
    let value: Value = serde_json::from_str(&stdout(&freed)).unwrap();
    assert_eq!(value["mode"], "read");
    assert_eq!(value["readers"].as_array().unwrap().len(), 1, "{value}");
    drop(c);
}

/// `--help` lists every exit code a script may see (3, partial, is checked
/// on the topologies, `tests/topologies.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_documents_every_exit_code() {
    let help = run_raw(&["--help"], "").await;
    assert_eq!(code(&help), FOUND);
    let text = stdout(&help);
    for line in [
        "Exit codes:",
        "  0  found, or done",
        "  1  not found (a free key, no locks) or refused",
        "  2  usage or connection error",
        "  3  partial answer: a server did not answer",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    let not_found = run(&unique("ctl-codes"), &["show", "nothing"], "").await;
    assert_eq!(code(&not_found), NOT_FOUND);
}

/// `show` and `list` say which process holds a lock: the name its runtime
/// was given, its host, its pid and how long it has been up, not only a
/// holder id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_and_list_say_which_process_holds_the_lock() {
    let prefix = unique("ctl-who");
    let holder = Kind::Redis
        .builder(&prefix)
        .client_name("billing-worker")
        .build()
        .await
        .unwrap();
    let (guard, held_by) = taken(&holder, "order:1").await;
    // The runtime's watchdog publishes its identity at its first tick,
    // right after the build; no event says when it landed: look (bounded).
    let mut published = None;
    for _ in 0..100 {
        published = holder.client_of(&held_by).await.unwrap();
        if published.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let published = published.expect("the identity is published within 2 s");
    assert_eq!(published.pid, std::process::id());

    let pid = format!(", pid {}", std::process::id());
    let show = run(&prefix, &["show", "order:1"], "").await;
    assert_eq!(code(&show), FOUND, "{}", stderr(&show));
    let out = stdout(&show);
    assert!(
        out.contains("  process     billing-worker on ") && out.contains(&pid),
        "{out}"
    );
    assert!(out.contains(&format!("{pid}, up ")), "{out}");
    let json = run(&prefix, &["show", "order:1", "--json"], "").await;
    let value: Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(value["client"]["name"], "billing-worker");
    assert_eq!(value["client"]["pid"], std::process::id());
    assert_eq!(value["client"]["host"], published.host.as_str());
    let started = published.started.duration_since(std::time::UNIX_EPOCH);
    let started = started.unwrap().as_millis() as u64;
    assert_eq!(value["client"]["started_ms"], started);

    let list = run(&prefix, &["list"], "").await;
    assert_eq!(code(&list), FOUND, "{}", stderr(&list));
    let out = stdout(&list);
    let line = out.lines().nth(1).unwrap_or_default();
    assert!(
        line.contains(&format!("{held_by} (billing-worker on ")) && line.contains(&pid),
        "{out}"
    );
    guard.release().await.unwrap();
}

/// Reading writes nothing: `list` and `show` leave no name under the prefix
/// (lockctl's runtime takes no lock and publishes no identity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_and_list_write_nothing() {
    let prefix = unique("ctl-readonly");
    for args in [&["list"][..], &["show", "k"], &["show", "k", "--json"]] {
        let output = run(&prefix, args, "").await;
        assert_eq!(code(&output), NOT_FOUND, "{}", stderr(&output));
    }
    let mut con = redis().connection().await;
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(names, Vec::<String>::new());
}

/// `show` of a key held by readers says `read×N` and lists every reader
/// with its token and lease, as text and as JSON; `list` marks the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_lists_the_readers_of_a_read_hold() {
    let prefix = unique("ctl-readers");
    let (_runtimes, [a, b]) = two_readers(Kind::Redis, &prefix, "cfg:1").await;

    let text = run(&prefix, &["show", "cfg:1"], "").await;
    assert_eq!(code(&text), 0, "{}", stderr(&text));
    let out = stdout(&text);
    assert!(out.contains("  mode        read×2\n"), "{out}");
    for guard in [&a, &b] {
        assert!(
            out.contains(&format!("(fence {}, lease left", guard.fence())),
            "{out}"
        );
    }

    let json = run(&prefix, &["show", "cfg:1", "--json"], "").await;
    let value: Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(value["mode"], "read");
    let mut fences: Vec<u64> = value["readers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["fence"].as_u64().unwrap())
        .collect();
    fences.sort_unstable();
    let mut expected = vec![a.fence(), b.fence()];
    expected.sort_unstable();
    assert_eq!(fences, expected, "{value}");

    let list = run(&prefix, &["list"], "").await;
    assert_eq!(code(&list), 0, "{}", stderr(&list));
    assert!(stdout(&list).contains("[read×2]"), "{}", stdout(&list));
    drop((a, b));
}
