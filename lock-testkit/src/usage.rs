//! What this process costs: CPU time and resident memory.
//!
//! Read from `/proc/self` (Linux): the benchmark's targets and the leak
//! tests are about the client's own CPU and memory, and the workspace
//! forbids `unsafe` (no `libc` calls).
//!
//! The two unit sizes `/proc` uses, clock ticks and pages, are asked of
//! `getconf` once.

use std::sync::OnceLock;

use anyhow::{Context, Result};

fn getconf(name: &str, fallback: u64) -> u64 {
    std::process::Command::new("getconf")
        .arg(name)
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(fallback)
}

fn clock_ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| getconf("CLK_TCK", 100).max(1))
}

fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| getconf("PAGESIZE", 4096).max(1))
}

/// CPU time (user + system, all threads, living and exited) this process has
/// used so far, in seconds.
///
/// ```
/// assert!(lock_testkit::usage::cpu_seconds().unwrap() >= 0.0);
/// ```
pub fn cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("read /proc/self/stat")?;
    // The command name (field 2) may hold spaces; count fields after its `)`.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unexpected /proc/self/stat format")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15) → indexes 11, 12.
    let utime: u64 = fields.get(11).context("utime")?.parse()?;
    let stime: u64 = fields.get(12).context("stime")?.parse()?;
    Ok((utime + stime) as f64 / clock_ticks_per_second() as f64)
}

/// Resident set size of this process, in bytes (pages in `/proc/self/statm`
/// times the page size `getconf` reports, not an assumed 4 KiB).
///
/// ```
/// assert!(lock_testkit::usage::rss_bytes().unwrap() > 0);
/// ```
pub fn rss_bytes() -> Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("read /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .context("unexpected /proc/self/statm format")?
        .parse()?;
    Ok(pages * page_size())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn proc_figures_are_plausible() {
        assert!(cpu_seconds().unwrap() >= 0.0);
        assert!(rss_bytes().unwrap() > 1024 * 1024);
    }
}
