//! A loopback port to listen on.
//!
//! Why not bind port 0: the kernel answers with a port of its ephemeral
//! range (`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 by
//! default), the range it also takes the source port of every outgoing
//! connection from. A test server that is stopped and started again on its
//! port would then find it taken by some client's connection now and then
//! (an etcd member that exits at its restart). So the port is drawn at
//! random below that range, from 10,000 up, and checked by binding it; only
//! where the range leaves no room below it does port 0 serve.
//!
//! The check lets the listener go again, so another process may take the
//! port before ours binds: callers that start a server retry with a new port
//! when the start fails.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::ops::Range;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};

/// Where the drawn ports start: below it sit well-known services' ports.
const LOWEST: u16 = 10_000;

/// How many drawn ports are tried before giving up.
const ATTEMPTS: usize = 200;

/// Where the kernel's ephemeral range starts when `/proc` does not say.
const EPHEMERAL_START: u16 = 32_768;

/// A loopback port nobody listens on right now, below the ephemeral range.
///
/// ```
/// let port = lock_testkit::port::try_free_port().unwrap();
/// assert!(port > 0);
/// ```
pub fn try_free_port() -> Result<u16> {
    Ok(listen_below_range()?.local_addr()?.port())
}

/// [`try_free_port`], panicking on failure (for tests).
///
/// ```
/// assert!(lock_testkit::free_port() > 0);
/// ```
pub fn free_port() -> u16 {
    try_free_port().unwrap_or_else(|e| panic!("{e:#}"))
}

/// A loopback listener on a port drawn below the ephemeral range (tried
/// [`ATTEMPTS`] times), or on a port of the kernel's choice where the range
/// leaves no room below it.
fn listen_below_range() -> Result<TcpListener> {
    let range = LOWEST..ephemeral_start();
    if range.is_empty() {
        return TcpListener::bind("127.0.0.1:0").context("bind a free loopback port");
    }
    for _ in 0..ATTEMPTS {
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", draw(&range))) {
            return Ok(listener);
        }
    }
    bail!("no free loopback port in {range:?} after {ATTEMPTS} tries")
}

/// The first port of the kernel's ephemeral range, as `/proc` gives it, or
/// the Linux default where it cannot be read.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(EPHEMERAL_START)
}

/// A port drawn at random from `range` (not empty): std's randomly keyed
/// hasher, fed the clock, so each call and each process draws anew.
fn draw(range: &Range<u16>) -> u16 {
    let mut hasher = RandomState::new().build_hasher();
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    hasher.write_u128(nanos);
    let span = u64::from(range.end - range.start);
    let offset = u16::try_from(hasher.finish() % span).unwrap_or(0);
    range.start + offset
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The ports a test may expect: below the ephemeral range where there
    /// is room below it.
    fn expected() -> Range<u16> {
        match LOWEST..ephemeral_start() {
            range if range.is_empty() => 1..u16::MAX,
            range => range,
        }
    }

    #[test]
    fn a_free_port_is_below_the_ephemeral_range() {
        for _ in 0..20 {
            let port = free_port();
            assert!(expected().contains(&port), "{port} not in {:?}", expected());
        }
    }

    #[test]
    fn the_port_found_was_bound_on_loopback_and_is_bindable_again() {
        let listener = listen_below_range().unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(expected().contains(&port), "{port} not in {:?}", expected());
        assert!(
            TcpListener::bind(("127.0.0.1", port)).is_err(),
            "port {port} was not held by the listener found"
        );
        drop(listener);
        TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("port {port} cannot be bound again: {e}"));
    }

    #[test]
    fn drawn_ports_stay_in_their_range_and_vary() {
        let range = 20_000..20_010;
        let drawn: Vec<u16> = (0..100).map(|_| draw(&range)).collect();
        assert!(drawn.iter().all(|port| range.contains(port)));
        assert!(drawn.iter().any(|port| *port != drawn[0]), "{drawn:?}");
    }
}
