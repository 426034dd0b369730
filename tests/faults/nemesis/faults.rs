//! The faults: one at a time at random moments (network, server, worker
//! processes), each healed before the next.

use std::sync::Arc;
use std::time::Duration;

use lock_testkit::RedisServer;
use lock_tests::FaultProxy;
use tokio::time::Instant;

use super::workers::Live;
use super::{now_ns, ns, LINGER_RECOVERY, PROCESSES, RECOVERY};
use crate::XorShift;

/// One fault the test injected.
#[derive(Clone, Debug)]
pub(super) struct Fault {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) what: String,
    /// Can lose lock data (restart empty, restart from a snapshot).
    pub(super) loses_data: bool,
    /// The system may be unavailable until then.
    pub(super) settled: u64,
    /// The proxy (so the process) a fault hits; `None`: the server.
    pub(super) proxy: Option<usize>,
    /// A drop-at-command fault: armed at `start`; once it fired, its window
    /// is the firing (see `place_firings`).
    pub(super) armed: bool,
    /// A fault (not a snapshot taken for a later restore).
    pub(super) counted: bool,
}

pub(super) fn millis(rng: &mut XorShift, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(lo + rng.below(hi - lo + 1))
}

/// Injects one fault at a time at random moments until 4 s before the end
/// of the run, each healed before the next, a proxy fault mostly at a
/// process that holds a lock at that moment; takes a snapshot every 2-4 s
/// for the restarts from a snapshot.
pub(super) async fn drive_faults(
    server: &mut RedisServer,
    proxies: &[FaultProxy],
    live: &[Arc<Live>],
    rng: &mut XorShift,
    secs: u64,
) -> Vec<Fault> {
    // The longest fault lasts 3 s: all are over 1 s before the run ends.
    let stop_at = Instant::now() + Duration::from_secs(secs).saturating_sub(Duration::from_secs(4));
    let mut faults = Vec::new();
    let mut snapshot: Option<u64> = None;
    let mut next_snapshot = Instant::now() + millis(rng, 300, 1500);
    // Bounded by time (`stop_at`) and by count.
    for _ in 0..10_000 {
        let gap = millis(rng, 200, 1500);
        tokio::time::sleep_until((Instant::now() + gap).min(stop_at)).await;
        if Instant::now() >= stop_at {
            break;
        }
        if Instant::now() >= next_snapshot {
            // `SAVE` blocks the server while it writes (briefly: the data
            // directory is in memory); it gets a window like a fault's, but
            // is not counted as one.
            let start = now_ns();
            server.snapshot().await;
            let end = now_ns();
            snapshot = Some(start);
            next_snapshot = Instant::now() + millis(rng, 2000, 4000);
            faults.push(Fault {
                start,
                end,
                what: "snapshot (SAVE)".to_owned(),
                loses_data: false,
                settled: end + ns(RECOVERY),
                proxy: None,
                armed: false,
                counted: false,
            });
        }
        // Mostly at a process that holds a lock now.
        let holders: Vec<usize> = (0..PROCESSES).filter(|&i| live[i].holds()).collect();
        let p = if !holders.is_empty() && rng.below(100) < 70 {
            holders[rng.below(holders.len() as u64) as usize]
        } else {
            rng.below(PROCESSES as u64) as usize
        };
        let proxy = &proxies[p];
        let start = now_ns();
        let mut fault = Fault {
            start,
            end: start,
            what: String::new(),
            loses_data: false,
            settled: start,
            proxy: None,
            armed: false,
            counted: true,
        };
        let mut recovery = RECOVERY;
        let pick = rng.below(100);
        if pick < 70 {
            fault.proxy = Some(p);
        }
        match pick {
            0..=19 => {
                let d = millis(rng, 200, 3000);
                proxy.stall();
                tokio::time::sleep(d).await;
                proxy.resume();
                fault.what = format!("stall proxy {p} for {} ms", d.as_millis());
            }
            20..=31 => {
                let delay = millis(rng, 20, 250);
                let d = millis(rng, 500, 3000);
                proxy.slow(Some(delay));
                tokio::time::sleep(d).await;
                proxy.slow(None);
                fault.what = format!(
                    "slow proxy {p} by {} ms for {} ms",
                    delay.as_millis(),
                    d.as_millis()
                );
            }
            32..=43 => {
                proxy.drop_connections();
                fault.what = format!("drop connections of proxy {p}");
                recovery = LINGER_RECOVERY;
            }
            44..=57 => {
                let command = if rng.below(2) == 0 {
                    "SUBSCRIBE"
                } else {
                    "EVALSHA"
                };
                proxy.drop_at_command(command);
                fault.what = format!("drop proxy {p} at its next {command}");
                fault.armed = true;
                // No window until it fires (see `place_firings`).
                faults.push(fault);
                continue;
            }
            58..=69 => {
                let d = millis(rng, 300, 3000);
                proxy.refuse(true);
                let cut = rng.below(2) == 0;
                if cut {
                    proxy.drop_connections();
                    recovery = LINGER_RECOVERY;
                }
                tokio::time::sleep(d).await;
                proxy.refuse(false);
                fault.what = format!(
                    "refuse proxy {p} for {} ms{}",
                    d.as_millis(),
                    if cut { ", connections dropped" } else { "" }
                );
            }
            70..=81 => {
                let d = millis(rng, 200, 2000);
                server.freeze();
                tokio::time::sleep(d).await;
                server.thaw();
                fault.what = format!("SIGSTOP the server for {} ms", d.as_millis());
            }
            pick => {
                let old_enough = snapshot.filter(|&t| start.saturating_sub(t) >= 1_000_000_000);
                match old_enough {
                    Some(taken) if pick >= 90 => {
                        server.restart_from_snapshot().await;
                        fault.what = format!(
                            "restart the server from a snapshot taken {} ms before",
                            (start - taken) / 1_000_000
                        );
                        recovery = LINGER_RECOVERY;
                    }
                    _ => {
                        server.restart().await;
                        snapshot = None;
                        fault.what = "restart the server empty".to_owned();
                    }
                }
                fault.loses_data = true;
                next_snapshot = next_snapshot.min(Instant::now() + millis(rng, 500, 1500));
            }
        }
        fault.end = now_ns();
        fault.settled = fault.end + ns(recovery);
        faults.push(fault);
    }
    faults
}

/// Gives each armed drop-at-command fault of proxy `p` the moment it fired
/// (the latest arming before each firing).
pub(super) fn place_firings(faults: &mut [Fault], p: usize, fired: &[u64]) {
    for &t in fired {
        if let Some(fault) = faults
            .iter_mut()
            .rev()
            .find(|f| f.armed && f.proxy == Some(p) && f.start <= t)
        {
            fault.what.push_str(" (fired)");
            fault.start = t;
            fault.end = t;
            fault.settled = t + ns(LINGER_RECOVERY);
        }
    }
}
