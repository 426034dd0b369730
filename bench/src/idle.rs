//! Keeps the machine's idle CPUs from sleeping deeply while the benchmark
//! runs.
//!
//! On a quiet virtual machine an idle vCPU halts, and waking it (a reply
//! arrived, a task was woken) costs tens of microseconds: measured here, a
//! PING's p50 is 87 µs with the CPUs free to halt and 15 µs without. Which
//! of the two a run got depended on whatever else the machine was doing
//! (the "slow regime" of earlier results), and it moved the limit and every
//! contender's figures by 3–5x. The kernel's PM QoS request
//! (`/dev/cpu_dma_latency`: the largest wake-up latency allowed, here 0)
//! holds the CPUs in their polling idle state while the file stays open;
//! closing it (the process ending, however it ends) lifts the request.
//! Latency-tuned hosts run this way (tuned's `latency-performance` profile
//! sets the same request), and it is a machine setting: it does not favour
//! one contender over another.

use std::fs::{File, OpenOptions};
use std::io::Write;

/// The request, in force while this value lives.
#[derive(Debug)]
pub struct ShallowIdle {
    _request: File,
}

/// `LOCK_BENCH_IDLE=deep` leaves the idle states as they are.
const ENV: &str = "LOCK_BENCH_IDLE";

/// Asks for no idle-state latency, or says why it was not asked: the figures
/// then depend on how busy the machine happens to be.
pub fn hold_shallow() -> Result<ShallowIdle, String> {
    if std::env::var(ENV).is_ok_and(|v| v.trim() == "deep") {
        return Err(format!("{ENV}=deep"));
    }
    let mut request = OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .map_err(|e| format!("/dev/cpu_dma_latency: {e}"))?;
    request
        .write_all(&0i32.to_ne_bytes())
        .map_err(|e| format!("/dev/cpu_dma_latency: {e}"))?;
    Ok(ShallowIdle { _request: request })
}
