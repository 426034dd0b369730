//! Signals to another process, through the `kill` command.
//!
//! The workspace forbids `unsafe` and the kit keeps its dependencies few, so
//! no `libc::kill`: the faults send a handful of signals per test, and a
//! process start each costs nothing that matters there.

use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// The signals the faults use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Freeze: the process keeps its sockets and answers nothing.
    Stop,
    /// Thaw a frozen process.
    Cont,
    /// End it now, with no chance to clean up.
    Kill,
    /// Ask it to stop (what orchestrators send first): a service shuts
    /// down gracefully.
    Term,
}

impl Signal {
    fn flag(self) -> &'static str {
        match self {
            Signal::Stop => "-STOP",
            Signal::Cont => "-CONT",
            Signal::Kill => "-KILL",
            Signal::Term => "-TERM",
        }
    }
}

/// Sends `signal` to process `pid`; an error when `kill` fails (no such
/// process, or no permission).
///
/// ```no_run
/// use lock_testkit::signal::{send, Signal};
/// send(4242, Signal::Stop).unwrap();
/// send(4242, Signal::Cont).unwrap();
/// ```
pub fn send(pid: u32, signal: Signal) -> Result<()> {
    let status = Command::new("kill")
        .args([signal.flag(), &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .context("run kill")?;
    if !status.success() {
        bail!("kill {} {pid} failed", signal.flag());
    }
    Ok(())
}
