//! A child process driven by lines: start it, send it lines, read its lines
//! with a timeout.
//!
//! The benchmark's worker processes speak such a protocol (print `ready`
//! when set up, wait for `go`, print results, end with `done`). A thread per
//! child turns its stdout into a channel, so every wait here has a timeout
//! and a silent or dead child is an error, not a hang; and since the thread
//! reads while the parent is busy measuring, a worker never stalls on a full
//! pipe. A child still running when its handle is dropped is killed.
//! ([`crate::pipes`] is the plain async form the tests use.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::sync::mpsc;

/// A running child process with piped stdin and stdout.
pub struct LineChild {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
}

impl LineChild {
    /// Starts `command` with its stdin and stdout piped to us (stderr
    /// inherited); `name` is what errors call it.
    ///
    /// ```no_run
    /// # async fn demo() -> anyhow::Result<()> {
    /// use std::time::Duration;
    /// let mut cat = lock_testkit::LineChild::spawn(&mut std::process::Command::new("cat"), "cat")?;
    /// cat.send("ready")?;
    /// cat.expect("ready", Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    pub fn spawn(command: &mut Command, name: &str) -> Result<Self> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start {name}"))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("child-stdout".to_owned())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .context("start a reader thread")?;
        Ok(LineChild {
            name: name.to_owned(),
            child,
            stdin,
            lines,
        })
    }

    /// The child's process id (to signal it: [`crate::signal::send`]).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the child has exited.
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// The next line, waiting at most `limit`.
    pub async fn next_line(&mut self, limit: Duration) -> Result<String> {
        match tokio::time::timeout(limit, self.lines.recv()).await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => bail!("{} exited early", self.name),
            Err(_) => bail!("{} sent nothing for {limit:?}", self.name),
        }
    }

    /// Waits for the line `expected`, failing on anything else.
    pub async fn expect(&mut self, expected: &str, limit: Duration) -> Result<()> {
        let line = self.next_line(limit).await?;
        if line.trim() != expected {
            bail!("{} said {line:?}, expected {expected:?}", self.name);
        }
        Ok(())
    }

    /// Sends one line to the child's stdin.
    pub fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("child stdin closed")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    /// Every line up to (not including) `done`; at most `max_lines`, and
    /// at most `limit` between two lines.
    pub async fn collect_until_done(
        &mut self,
        limit: Duration,
        max_lines: usize,
    ) -> Result<Vec<String>> {
        let mut out = Vec::new();
        while out.len() < max_lines {
            let line = self.next_line(limit).await?;
            if line.trim() == "done" {
                return Ok(out);
            }
            out.push(line);
        }
        bail!("{} sent more than {max_lines} lines", self.name)
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        self.stdin = None;
        if matches!(self.child.try_wait(), Ok(None)) {
            // Give a finishing child a moment, then make sure it is gone.
            std::thread::sleep(Duration::from_millis(50));
            if matches!(self.child.try_wait(), Ok(None)) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}
