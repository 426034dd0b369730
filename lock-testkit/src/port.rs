//! A loopback port to listen on.
//!
//! Found by binding port 0 and letting the listener go, so another process
//! may take it before ours binds: callers that start a server retry with a
//! new port when the start fails.

use std::net::TcpListener;

use anyhow::{Context, Result};

/// A loopback port nobody listens on right now.
///
/// ```
/// let port = lock_testkit::port::try_free_port().unwrap();
/// assert!(port > 0);
/// ```
pub fn try_free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// [`try_free_port`], panicking on failure (for tests).
///
/// ```
/// assert!(lock_testkit::free_port() > 0);
/// ```
pub fn free_port() -> u16 {
    try_free_port().unwrap_or_else(|e| panic!("{e:#}"))
}
