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

/// What `show` prints of the test process as the holder's process.
pub fn this_process() -> String {
    format!(", pid {}", std::process::id())
}
