//! The parent's side of one run of worker processes (`--worker contend`,
//! `--worker read-write`, Curator's loop): how a shape's tasks are laid out
//! over processes, the `ready` / `go` / `done` exchange, and the sums of the
//! count lines the workers print after their records. `contention.rs` and
//! `read_write.rs` drive their runs through it, so both read the workers'
//! lines alike.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use lock_testkit::LineChild;

use crate::config::Shape;
use crate::worker::WAIT_LIMIT;

/// Most lines a worker may print (bounds the parent's reading).
const MAX_LINES: usize = 5_000_000;

/// How a run of `shape` is laid out: worker processes, tasks per process,
/// and data connections per process. The limit runs every task in one
/// process (its locks are in-process), with one data connection per
/// process of the shape.
pub fn layout(shape: Shape, limit: bool) -> (u32, u32, u32) {
    if limit {
        (1, shape.workers(), shape.processes)
    } else {
        (shape.processes, shape.tasks, 1)
    }
}

/// Waits until every worker has said `ready`.
pub async fn ready(workers: &mut [LineChild]) -> Result<()> {
    for w in workers {
        w.expect("ready", Duration::from_secs(60)).await?;
    }
    Ok(())
}

/// Says `go` to every worker.
pub fn go(workers: &mut [LineChild]) -> Result<()> {
    for w in workers {
        w.send("go")?;
    }
    Ok(())
}

/// Every worker's lines up to its `done`, the workers of a run that lasts
/// `duration` in turn.
pub async fn collect(workers: &mut [LineChild], duration: Duration) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for w in workers {
        let limit = duration + WAIT_LIMIT + Duration::from_secs(30);
        lines.extend(w.collect_until_done(limit, MAX_LINES).await?);
    }
    Ok(lines)
}

/// The sums of the workers' count lines (`timeouts 3`), by name.
pub struct Counts(BTreeMap<&'static str, u64>);

impl Counts {
    /// The sum of the `name` lines (0 when there was none).
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }
}

/// Reads the workers' `lines`: each is one that `take` takes (a record,
/// say: it answers `true`), or a count line `<name> <n>` of a name in
/// `counted`; any other line is an error.
pub fn tally(
    lines: &[String],
    counted: &[&'static str],
    mut take: impl FnMut(&str) -> Result<bool>,
) -> Result<Counts> {
    let mut counts = Counts(counted.iter().map(|&name| (name, 0)).collect());
    'lines: for line in lines {
        if take(line)? {
            continue;
        }
        for (name, sum) in &mut counts.0 {
            if let Some(n) = line.strip_prefix(name).and_then(|l| l.strip_prefix(' ')) {
                *sum += n.trim().parse::<u64>().context("count line")?;
                continue 'lines;
            }
        }
        bail!("unexpected worker line {line:?}");
    }
    Ok(counts)
}

/// Reads the workers' `lines` as records of one kind (the lines `parse`
/// knows) and count lines of the names in `counted` ([`tally`]).
pub fn records<R>(
    lines: &[String],
    counted: &[&'static str],
    parse: fn(&str) -> Option<Result<R>>,
) -> Result<(Vec<R>, Counts)> {
    let mut records = Vec::new();
    let counts = tally(lines, counted, |line| {
        Ok(match parse(line) {
            Some(record) => {
                records.push(record?);
                true
            }
            None => false,
        })
    })?;
    Ok((records, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_sums_count_lines_and_leaves_records_to_the_taker() -> Result<()> {
        let lines: Vec<String> = ["rec 1", "timeouts 2", "errors 0", "rec 2", "timeouts 3"]
            .map(String::from)
            .into();
        let mut records = Vec::new();
        let counts = tally(&lines, &["timeouts", "errors"], |line| {
            Ok(match line.strip_prefix("rec ") {
                Some(r) => {
                    records.push(r.to_owned());
                    true
                }
                None => false,
            })
        })?;
        assert_eq!(records, ["1", "2"]);
        assert_eq!((counts.get("timeouts"), counts.get("errors")), (5, 0));
        let unknown = ["switches 1".to_owned()];
        assert!(tally(&unknown, &["timeouts"], |_| Ok(false)).is_err());
        Ok(())
    }
}
