//! The two S3 charts: handoff latency and wait to acquire, ours (plain and
//! fair mode) vs rslock.
//!
//! Handoff latency is the figure the target is about; the wait chart is
//! there because a polling peer's handoffs are rare (the releaser usually
//! re-grabs the lock), so its cost shows in the waits' tail instead.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::report::trim;
use crate::scenarios::Trio;
use crate::stats::Samples;
use crate::svg::{cdf_chart, Series};

/// What S3 hands over for charting.
pub struct S3Charts {
    /// Handoff latencies (ours, ours fair, rslock), µs.
    pub handoffs: Trio,
    /// Waits to acquire (ours, ours fair, rslock), µs.
    pub waits: Trio,
    /// Idle PING p50 on the runtime's connection, µs.
    pub ping_p50: Option<f64>,
}

const OURS: &str = "#1f77b4";
const FAIR: &str = "#2ca02c";
const PEER: &str = "#d62728";

/// `238 µs`, `1.224 ms`, `0.770 s`.
fn time(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", trim(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", trim(us / 1e3))
    } else {
        format!("{} µs", trim(us))
    }
}

fn label(name: &str, s: &Samples, what: &str) -> String {
    format!(
        "{name}: p50 {}, p99 {}, max {} (n={} {what})",
        time(s.p50()),
        time(s.p99()),
        time(s.max()),
        s.len()
    )
}

fn trio<'a>((ours, fair, peer): &'a Trio, what: &str) -> [Series<'a>; 3] {
    [
        Series {
            label: label("lock-runtime", ours, what),
            colour: OURS,
            samples: ours,
        },
        Series {
            label: label("lock-runtime, fair", fair, what),
            colour: FAIR,
            samples: fair,
        },
        Series {
            label: label("rslock 0.10", peer, what),
            colour: PEER,
            samples: peer,
        },
    ]
}

/// Writes `handoff.svg` and `waits.svg` into `dir`; returns their paths.
pub fn write(dir: &Path, charts: &S3Charts, quick: bool) -> Result<Vec<PathBuf>> {
    let suffix = if quick { " (quick run)" } else { "" };
    let mut markers = Vec::new();
    if let Some(p) = charts.ping_p50 {
        markers.push(("PING p50 (idle)".to_owned(), p));
        markers.push(("target: 3 x PING".to_owned(), 3.0 * p));
    }
    let handoff = cdf_chart(
        &format!("S3 handoff latency, 8 workers in 2 processes{suffix}"),
        "release by one holder → next holder's body starts",
        &trio(&charts.handoffs, "handoffs"),
        &markers,
    );
    let waits = cdf_chart(
        &format!("S3 wait to acquire, 8 workers in 2 processes{suffix}"),
        "asked for the lock → body starts",
        &trio(&charts.waits, "acquisitions"),
        &[
            ("target p99: 5 ms".to_owned(), 5_000.0),
            ("target max: 50 ms".to_owned(), 50_000.0),
        ],
    );
    let mut paths = Vec::new();
    for (name, svg) in [("handoff.svg", handoff), ("waits.svg", waits)] {
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("write {}", path.display()))?;
        paths.push(path);
    }
    Ok(paths)
}
