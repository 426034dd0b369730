//! What both test files share: the built `lockctl`, run with exactly the
//! environment a test gives it, bounded in time, and its output read.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdout, Command};

/// How long one `lockctl` run may take before the test fails.
pub const RUN_LIMIT: Duration = Duration::from_secs(20);

/// `lockctl args` with an empty environment: what it sees of the servers
/// is what the test passes, as flags or in `env`.
pub fn lockctl(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs `lockctl args` with `env` and `stdin`, and waits for it (bounded).
pub async fn run_env(args: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
    let mut child = lockctl(args, env)
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

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn code(output: &Output) -> i32 {
    output.status.code().expect("exited, not killed")
}

/// The next line of a child's output (bounded).
pub async fn next_line(lines: &mut tokio::io::Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(RUN_LIMIT, lines.next_line())
        .await
        .expect("a line in time")
        .unwrap()
        .expect("a line")
}

/// The lines of a child's stdout.
pub fn lines_of(stdout: ChildStdout) -> tokio::io::Lines<BufReader<ChildStdout>> {
    BufReader::new(stdout).lines()
}

/// A running `lockctl watch`, its printed lines read one by one.
pub struct Watching {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Watching {
    /// Starts `lockctl args` with `env` (see [`lockctl`]).
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Watching {
        let mut child = lockctl(args, env).stdout(Stdio::piped()).spawn().unwrap();
        let lines = lines_of(child.stdout.take().unwrap());
        Watching { child, lines }
    }

    /// The next line printed (bounded), which must contain every one of
    /// `parts`.
    pub async fn next_with(&mut self, parts: &[&str]) -> String {
        let line = next_line(&mut self.lines).await;
        assert!(parts.iter().all(|part| line.contains(part)), "{line}");
        line
    }

    /// Releases `guard`, held by `holder` (as `inspect` names it) on
    /// `key`, and reads the line that tells of it.
    pub async fn release_seen(&mut self, guard: lock_runtime::LockGuard, key: &str, holder: &str) {
        guard.release().await.unwrap();
        self.next_with(&[&format!("{key}: released by {holder}")])
            .await;
    }

    /// Waits for the exit (bounded), which must be with `expected`.
    pub async fn exits_with(mut self, expected: i32) {
        let status = tokio::time::timeout(RUN_LIMIT, self.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.code(), Some(expected));
    }
}

/// Exit codes, as `--help` documents them.
pub const FOUND: i32 = 0;
pub const NOT_FOUND: i32 = 1;
pub const ERROR: i32 = 2;
pub const PARTIAL: i32 = 3;

/// Waits until `runtime`'s identity is published for `holder` (its
/// watchdog does it at its first tick, right after the build; no event says
/// when it landed, so this looks, at most 100 times in 2 s).
pub async fn until_published(runtime: &lock_runtime::LockRuntime, holder: &str) {
    for _ in 0..100 {
        if runtime.client_of(holder).await.unwrap().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the identity of {holder} was not published within 2 s");
}

/// `key` taken on `runtime` with a lease of `secs` seconds.
pub async fn held(
    runtime: &lock_runtime::LockRuntime,
    key: &str,
    secs: u64,
) -> lock_runtime::LockGuard {
    let request = runtime.lock(key).lease(Duration::from_secs(secs));
    request.acquire().await.unwrap()
}

/// `key` taken on `runtime`, and the holder id `inspect` gives for it: what
/// `lockctl` prints as the holder.
pub async fn taken(
    runtime: &lock_runtime::LockRuntime,
    key: &str,
) -> (lock_runtime::LockGuard, String) {
    let guard = runtime.lock(key).acquire().await.unwrap();
    (guard, holder_of(runtime, key).await)
}

/// The holder id `inspect` gives for `key`, which `runtime` must see held:
/// what `lockctl` prints as the holder.
pub async fn holder_of(runtime: &lock_runtime::LockRuntime, key: &str) -> String {
    runtime.inspect(key).await.unwrap().unwrap().holder
}

/// `lockctl release key --force --yes` with `env`: it must succeed, and
/// `runtime` then see `key` free.
pub async fn force_release(runtime: &lock_runtime::LockRuntime, key: &str, env: &[(&str, &str)]) {
    let release = run_env(&["release", key, "--force", "--yes"], env, "").await;
    assert_eq!(code(&release), FOUND, "{}", stderr(&release));
    assert!(!runtime.is_locked(key).await.unwrap());
}

/// Two runtimes under `prefix`, each holding `key` for reading: a read
/// hold of two readers of two processes as `lockctl` sees it.
pub async fn two_readers(
    kind: lock_tests::Kind,
    prefix: &str,
    key: &str,
) -> ([lock_runtime::LockRuntime; 2], [lock_runtime::LockGuard; 2]) {
    let one = kind.runtime(prefix).await;
    let two = kind.runtime(prefix).await;
    let a = one.lock(key).read().acquire().await.unwrap();
    let b = two.lock(key).read().acquire().await.unwrap();
    ([one, two], [a, b])
}

/// What `show` prints of the test process as the holder's process.
pub fn this_process() -> String {
    format!(", pid {}", std::process::id())
}
