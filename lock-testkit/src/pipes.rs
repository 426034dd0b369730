//! A child process with its stdin and stdout piped to an async test.
//!
//! The cross-process tests start helper binaries (a contender, the nemesis
//! worker) that print a line when they are ready or hold a lock, and read
//! their stdin to know when to go or to exit. The child is killed when its
//! handle is dropped, so a failed assertion leaves no process behind.

use std::process::Stdio;

use anyhow::{Context, Result};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// A child's stdout, line by line.
pub type Lines = tokio::io::Lines<BufReader<ChildStdout>>;

/// Starts `command` with stdin and stdout piped (stderr inherited), killed
/// on drop; returns the child, its stdin still inside, and its stdout as
/// lines.
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// let mut command = tokio::process::Command::new("cat");
/// let (mut child, mut lines) = lock_testkit::pipes::spawn(&mut command)?;
/// let stdin = child.stdin.take();
/// drop(stdin); // cat ends
/// assert_eq!(lines.next_line().await?, None);
/// # Ok(()) }
/// ```
pub fn spawn(command: &mut Command) -> Result<(Child, Lines)> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawn {:?}", command.as_std().get_program()))?;
    let stdout = child.stdout.take().context("child stdout")?;
    Ok((child, BufReader::new(stdout).lines()))
}
