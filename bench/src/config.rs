//! What to run and how big: scenario selection, `--quick`, runs, output.
//!
//! All counts and durations of every scenario live in [`Scale`], so the full
//! and the quick variant differ in one place, and every loop of the harness
//! has a bound taken from here.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::keys::KeyChoice;

/// One scenario of the issue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// Uncontended lock + unlock against 2 PINGs (and rslock).
    S1,
    /// Nested re-entry of a held key.
    S2,
    /// Contended handoff, 8 workers in 2 processes (and rslock).
    S3,
    /// Redis commands per acquisition under S3's contention.
    S4,
    /// 64 tasks over 10,000 keys against raw scripts.
    S5,
    /// Watchdog with 10,000 held locks.
    S6,
    /// Memory per held lock and per waiting task.
    S7,
    /// 8 processes x 8 tasks on one key: more processes than cores.
    S8,
    /// 64 tasks in 4 processes on 1,000 Zipf-distributed (hot) keys.
    S9,
    /// What 100,000 distinct keys locked once leave in Redis.
    S10,
    /// S1 and S3 on a 3-master Redis Cluster, beside the single server.
    S11,
    /// S1 and S3 on etcd, beside Redis, against etcd's own round trip.
    S12,
    /// S1, S3/S4 and S5 on ZooKeeper, beside Redis, against ZooKeeper's
    /// own round trip, with Apache Curator as the peer.
    S13,
    /// A read-heavy key: 8 workers in 2 processes, 90 % reads, under
    /// read-write locks, the exclusive lock, and an in-process
    /// read-write lock (the limit).
    S14,
    /// Transfers between 100 accounts, 16 workers in 2 processes: a
    /// multi-key lock on both accounts, against one global lock and two
    /// nested single-key locks.
    S15,
    /// A flash sale: a stock split into N segments behind N permits of one
    /// lock, 32 workers in 2 processes buying until it is sold out.
    S16,
}

impl Scenario {
    /// All of them, in order.
    pub const ALL: [Scenario; 16] = [
        Scenario::S1,
        Scenario::S2,
        Scenario::S3,
        Scenario::S4,
        Scenario::S5,
        Scenario::S6,
        Scenario::S7,
        Scenario::S8,
        Scenario::S9,
        Scenario::S10,
        Scenario::S11,
        Scenario::S12,
        Scenario::S13,
        Scenario::S14,
        Scenario::S15,
        Scenario::S16,
    ];

    fn parse(name: &str) -> Option<Scenario> {
        // Scenarios with a name too (their issues call them so).
        match name {
            "transfers" => return Some(Scenario::S15),
            "flashsale" => return Some(Scenario::S16),
            _ => {}
        }
        let n = name.trim_start_matches(['s', 'S']);
        Scenario::ALL
            .into_iter()
            .find(|s| format!("{s:?}").trim_start_matches('S') == n)
    }
}

/// Who contends for what, and for how long, in one contention run: the
/// worker processes (`--worker contend`), the tasks in each, and how each
/// acquisition chooses its key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Worker processes.
    pub processes: u32,
    /// Tasks per process.
    pub tasks: u32,
    /// The key of each acquisition.
    pub keys: KeyChoice,
    /// How long the workers contend per run.
    pub duration: Duration,
}

impl Shape {
    /// Workers in all processes.
    pub fn workers(&self) -> u32 {
        self.processes * self.tasks
    }
}

/// Counts and durations of one variant.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// S1: measured operations per kind per run.
    pub s1_ops: usize,
    /// S2: nested pairs per run.
    pub s2_pairs: usize,
    /// PINGs measured for a PING p50 baseline.
    pub pings: usize,
    /// S3 (and S4, S11): 8 workers in 2 processes on one key.
    pub s3: Shape,
    /// S3 with the data on the lock server (the same as `s3` in the full
    /// benchmark; shorter in the quick one, which only keeps it working).
    pub s3_shared: Shape,
    /// S8: more processes than cores, one key.
    pub s8: Shape,
    /// S8 with the data on the lock server (as `s3_shared`).
    pub s8_shared: Shape,
    /// S9: many tasks on Zipf-distributed keys.
    pub s9: Shape,
    /// S5: how long each side runs per run.
    pub s5_duration: Duration,
    /// S6: locks held.
    pub s6_locks: usize,
    /// S6: their lease.
    pub s6_lease: Duration,
    /// S7: locks held / waiters parked.
    pub s7_items: usize,
    /// S10: distinct keys locked and released per run and mode.
    pub s10_keys: u64,
    /// S10: the fence window of its runtime (shortened, to see keys expire).
    pub s10_window: Duration,
    /// S13: measured operations per kind per run (S1 on ZooKeeper, where
    /// an operation takes a millisecond or more).
    pub s13_ops: usize,
    /// S13: S3's workers on ZooKeeper (and Curator's, and Redis's beside
    /// them), for a shorter time than S3's: a ZooKeeper handoff takes
    /// milliseconds, so 5 s give thousands of samples.
    pub s13: Shape,
    /// S14: S3's workers on one read-heavy key, per contender and run.
    pub s14: Shape,
    /// S15: the transfer workers (16 in 2 processes; the key choice is
    /// theirs, not the shape's), per variant and run.
    pub s15: Shape,
    /// S16: the buyers (32 in 2 processes; each call's segment is its
    /// permit's), per variant and run; the duration only bounds a run,
    /// which ends when the stock is sold out.
    pub s16: Shape,
    /// S16: units on sale per run.
    pub s16_units: u32,
}

impl Scale {
    /// The full benchmark (about 6 minutes with 3 runs).
    pub const FULL: Scale = Scale {
        s1_ops: 4000,
        s2_pairs: 20_000,
        pings: 2000,
        s3: Shape {
            processes: 2,
            tasks: 4,
            keys: KeyChoice::One,
            duration: Duration::from_secs(10),
        },
        s3_shared: Shape {
            processes: 2,
            tasks: 4,
            keys: KeyChoice::One,
            duration: Duration::from_secs(10),
        },
        s8: Shape {
            processes: 8,
            tasks: 8,
            keys: KeyChoice::One,
            duration: Duration::from_secs(5),
        },
        s8_shared: Shape {
            processes: 8,
            tasks: 8,
            keys: KeyChoice::One,
            duration: Duration::from_secs(5),
        },
        s9: Shape {
            processes: 4,
            tasks: 16,
            keys: KeyChoice::Zipf { keys: 1000, s: 1.1 },
            duration: Duration::from_secs(5),
        },
        s5_duration: Duration::from_secs(2),
        s6_locks: 10_000,
        s6_lease: Duration::from_secs(3),
        s7_items: 10_000,
        s10_keys: 100_000,
        s10_window: Duration::from_secs(5),
        s13_ops: 1000,
        s13: Shape {
            processes: 2,
            tasks: 4,
            keys: KeyChoice::One,
            duration: Duration::from_secs(5),
        },
        s14: Shape {
            processes: 2,
            tasks: 4,
            keys: KeyChoice::One,
            duration: Duration::from_secs(5),
        },
        s15: Shape {
            processes: 2,
            tasks: 8,
            keys: KeyChoice::One,
            duration: Duration::from_secs(5),
        },
        s16: Shape {
            processes: 2,
            tasks: 16,
            keys: KeyChoice::One,
            duration: Duration::from_secs(60),
        },
        s16_units: 20_000,
    };

    /// The quick variant (`--quick`, and the `cargo test` smoke test).
    pub const QUICK: Scale = Scale {
        s1_ops: 200,
        s2_pairs: 1000,
        pings: 200,
        s3: Shape {
            processes: 2,
            tasks: 4,
            keys: KeyChoice::One,
            duration: Duration::from_secs(1),
        },
        s3_shared: Shape {
            processes: 2,
            tasks: 4,
            keys: KeyChoice::One,
            duration: Duration::from_millis(300),
        },
        s8: Shape {
            processes: 4,
            tasks: 2,
            keys: KeyChoice::One,
            duration: Duration::from_millis(500),
        },
        s8_shared: Shape {
            processes: 4,
            tasks: 2,
            keys: KeyChoice::One,
            duration: Duration::from_millis(300),
        },
        s9: Shape {
            processes: 2,
            tasks: 4,
            keys: KeyChoice::Zipf { keys: 1000, s: 1.1 },
            duration: Duration::from_millis(500),
        },
        s5_duration: Duration::from_millis(500),
        s6_locks: 1000,
        s6_lease: Duration::from_secs(1),
        s7_items: 1000,
        s10_keys: 2000,
        s10_window: Duration::from_secs(1),
        s13_ops: 100,
        s13: Shape {
            processes: 2,
            tasks: 4,
            keys: KeyChoice::One,
            duration: Duration::from_secs(1),
        },
        s14: Shape {
            processes: 2,
            tasks: 4,
            keys: KeyChoice::One,
            duration: Duration::from_millis(400),
        },
        s15: Shape {
            processes: 2,
            tasks: 8,
            keys: KeyChoice::One,
            duration: Duration::from_millis(300),
        },
        s16: Shape {
            processes: 2,
            tasks: 16,
            keys: KeyChoice::One,
            duration: Duration::from_secs(20),
        },
        s16_units: 1000,
    };
}

/// A benchmark invocation.
#[derive(Clone, Debug)]
pub struct Config {
    /// Scenarios to run, in order.
    pub scenarios: Vec<Scenario>,
    /// `--quick`.
    pub quick: bool,
    /// Repetitions of each scenario; figures are medians over them.
    pub runs: usize,
    /// Where results.json and handoff.svg go.
    pub out_dir: PathBuf,
    /// This binary, re-executed as the worker processes.
    pub worker_exe: PathBuf,
}

/// Usage text.
pub const USAGE: &str = "usage: lock-bench [s1 s2 s3 ... s16] [--quick] [--runs N] [--out DIR]\n\
    \n  no scenario named: run all of them (s3 and s4 share their runs)\
    \n  transfers another name for s15 (multi-key locks)\
    \n  flashsale another name for s16 (permits)\
    \n  --quick   small counts, one run (seconds instead of minutes)\
    \n  --runs N  repetitions per scenario, medians reported (default 3; quick 1)\
    \n  --out DIR results.json and handoff.svg (default <workspace>/target/bench)";

impl Config {
    /// Defaults for `quick`: all scenarios, this executable as the worker.
    pub fn new(quick: bool) -> Result<Self> {
        Ok(Config {
            scenarios: Scenario::ALL.to_vec(),
            quick,
            runs: if quick { 1 } else { 3 },
            out_dir: default_out_dir(),
            worker_exe: std::env::current_exe().context("find the lock-bench executable")?,
        })
    }

    /// Parses the command line (without the program name).
    pub fn from_args(args: &[String]) -> Result<Self> {
        let quick = args.iter().any(|a| a == "--quick");
        let mut config = Config::new(quick)?;
        let mut chosen = Vec::new();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--quick" => {}
                "--runs" => {
                    let n = it.next().context("--runs needs a number")?;
                    config.runs = n.parse().context("--runs needs a number")?;
                    if !(1..=20).contains(&config.runs) {
                        bail!("--runs must be 1..=20");
                    }
                }
                "--out" => {
                    config.out_dir = PathBuf::from(it.next().context("--out needs a directory")?);
                }
                "-h" | "--help" => bail!("{USAGE}"),
                "all" => chosen.extend(Scenario::ALL),
                name => match Scenario::parse(name) {
                    Some(s) => chosen.push(s),
                    None => bail!("unknown argument {name:?}\n{USAGE}"),
                },
            }
        }
        if !chosen.is_empty() {
            chosen.sort();
            chosen.dedup();
            config.scenarios = chosen;
        }
        Ok(config)
    }

    /// The counts of this variant.
    pub fn scale(&self) -> Scale {
        if self.quick {
            Scale::QUICK
        } else {
            Scale::FULL
        }
    }

    /// Whether `s` was asked for.
    pub fn wants(&self, s: Scenario) -> bool {
        self.scenarios.contains(&s)
    }
}

fn default_out_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("bench")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_scenarios_and_flags() {
        let args: Vec<String> = ["s3", "S1", "--quick", "--runs", "2"]
            .map(String::from)
            .to_vec();
        let c = Config::from_args(&args).unwrap();
        assert_eq!(c.scenarios, [Scenario::S1, Scenario::S3]);
        assert!(c.quick);
        assert_eq!(c.runs, 2);
        assert!(Config::from_args(&["s17".to_owned()]).is_err());
        assert_eq!(Config::from_args(&[]).unwrap().scenarios.len(), 16);
        let s16 = Config::from_args(&["flashsale".to_owned()]).unwrap();
        assert_eq!(s16.scenarios, [Scenario::S16]);
        let s15 = Config::from_args(&["s15".to_owned()]).unwrap();
        assert_eq!(s15.scenarios, [Scenario::S15]);
        let named = Config::from_args(&["transfers".to_owned()]).unwrap();
        assert_eq!(named.scenarios, [Scenario::S15]);
        let s14 = Config::from_args(&["s14".to_owned()]).unwrap();
        assert_eq!(s14.scenarios, [Scenario::S14]);
        let s13 = Config::from_args(&["s13".to_owned()]).unwrap();
        assert_eq!(s13.scenarios, [Scenario::S13]);
        let crowds = Config::from_args(&["s9".to_owned(), "s8".to_owned()]).unwrap();
        assert_eq!(crowds.scenarios, [Scenario::S8, Scenario::S9]);
        let s11 = Config::from_args(&["s11".to_owned()]).unwrap();
        assert_eq!(s11.scenarios, [Scenario::S11]);
        let s10 = Config::from_args(&["s10".to_owned()]).unwrap();
        assert_eq!(s10.scenarios, [Scenario::S10]);
    }
}
