//! The parent's side of a worker process: start it, talk to it by lines.
//!
//! Scenarios that need other processes (S3's second client, S7's fresh heap)
//! re-execute this binary with `--worker ...`. The worker prints `ready` when
//! set up, waits for `go` on stdin, and prints its results as lines ending
//! with `done`. A thread per child turns its stdout into a channel, so every
//! wait here has a timeout, and a child still running when its handle is
//! dropped is killed.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::sync::mpsc;

/// A running worker process.
pub struct WorkerProcess {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
}

impl WorkerProcess {
    /// Starts `exe --worker <args...>`.
    pub fn spawn(exe: &Path, args: &[String]) -> Result<Self> {
        let mut child = Command::new(exe)
            .arg("--worker")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start worker {}", exe.display()))?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("worker-stdout".to_owned())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .context("start a reader thread")?;
        Ok(WorkerProcess {
            name: args.first().cloned().unwrap_or_default(),
            child,
            stdin,
            lines,
        })
    }

    /// The next line, waiting at most `limit`.
    pub async fn next_line(&mut self, limit: Duration) -> Result<String> {
        match tokio::time::timeout(limit, self.lines.recv()).await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => bail!("worker {} exited early", self.name),
            Err(_) => bail!("worker {} sent nothing for {limit:?}", self.name),
        }
    }

    /// Waits for the line `expected`, failing on anything else.
    pub async fn expect(&mut self, expected: &str, limit: Duration) -> Result<()> {
        let line = self.next_line(limit).await?;
        if line.trim() != expected {
            bail!("worker {} said {line:?}, expected {expected:?}", self.name);
        }
        Ok(())
    }

    /// Sends one line to the worker's stdin.
    pub fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("worker stdin closed")?;
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
        bail!("worker {} sent more than {max_lines} lines", self.name)
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.stdin = None;
        if matches!(self.child.try_wait(), Ok(None)) {
            // Give a finishing worker a moment, then make sure it is gone.
            std::thread::sleep(Duration::from_millis(50));
            if matches!(self.child.try_wait(), Ok(None)) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}
