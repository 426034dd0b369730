//! Counting Redis commands from `INFO commandstats`.
//!
//! Redis counts every command it executes, including the ones a Lua script
//! issues with `redis.call`. A lock client's cost on the wire is what it
//! *sends*, so [`Delta::sent`] leaves out the commands that only run inside
//! a library's scripts (named by the caller) and the harness's own `INFO`.
//! `PUBLISH` is the exception the targets ask for: issued inside our release
//! script, it still puts one message on the wire to every subscriber, so the
//! benchmark's S4 counts `sent + publish`.

use std::collections::BTreeMap;

use anyhow::Result;
use redis::aio::MultiplexedConnection;

/// Calls of one command, and the server's time spent in them (µs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    /// Number of calls.
    pub calls: u64,
    /// Total server time in them, µs.
    pub usec: u64,
}

/// Counters per command name (`get`, `evalsha`, `client|setinfo`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandStats(pub BTreeMap<String, Calls>);

/// Commands the harness itself sends while measuring.
const HARNESS: &[&str] = &["info", "config|resetstat"];

impl CommandStats {
    /// Parses the text of `INFO commandstats`.
    pub fn parse(info: &str) -> Self {
        let mut calls = BTreeMap::new();
        for line in info.lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            let counters = Calls {
                calls: field("calls="),
                usec: field("usec="),
            };
            calls.insert(name.to_owned(), counters);
        }
        CommandStats(calls)
    }

    /// Calls of `name` so far (0 when it never ran).
    ///
    /// ```
    /// let stats = lock_testkit::CommandStats::parse("cmdstat_evalsha:calls=3,usec=9\r\n");
    /// assert_eq!(stats.calls("evalsha"), 3);
    /// assert_eq!(stats.calls("eval"), 0);
    /// ```
    pub fn calls(&self, name: &str) -> u64 {
        self.0.get(name).map_or(0, |c| c.calls)
    }

    /// Reads the server's counters now.
    pub async fn read(con: &mut MultiplexedConnection) -> Result<Self> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(con)
            .await?;
        Ok(Self::parse(&info))
    }

    /// What changed from `before` to `self`.
    pub fn since(&self, before: &CommandStats) -> Delta {
        let calls = self
            .0
            .iter()
            .filter(|(name, _)| !HARNESS.contains(&name.as_str()))
            .map(|(name, now)| {
                let old = before.0.get(name).copied().unwrap_or_default();
                let delta = Calls {
                    calls: now.calls.saturating_sub(old.calls),
                    usec: now.usec.saturating_sub(old.usec),
                };
                (name.clone(), delta)
            })
            .filter(|(_, d)| d.calls > 0)
            .collect();
        Delta(calls)
    }
}

/// Commands executed between two snapshots (harness commands left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta(pub BTreeMap<String, Calls>);

impl Delta {
    /// Every command Redis executed, script internals included.
    pub fn executed(&self) -> u64 {
        self.0.values().map(|c| c.calls).sum()
    }

    /// Calls of one command.
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).map_or(0, |c| c.calls)
    }

    /// Server time spent in one command (scripts: including their calls), µs.
    pub fn usec(&self, name: &str) -> u64 {
        self.0.get(name).map_or(0, |c| c.usec)
    }

    /// Commands clients sent: everything but the names in `inside_scripts`.
    pub fn sent(&self, inside_scripts: &[String]) -> u64 {
        self.0
            .iter()
            .filter(|(name, _)| !inside_scripts.iter().any(|s| s == *name))
            .map(|(_, c)| c.calls)
            .sum()
    }
}

/// Lowercased names of the commands a Lua source calls (`redis.call('x'` or
/// `redis.pcall("x"`).
pub fn commands_in_script(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    for marker in ["redis.call(", "redis.pcall("] {
        for (at, _) in source.match_indices(marker) {
            let rest = source[at + marker.len()..].trim_start();
            let Some(quote) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') else {
                continue;
            };
            let body = &rest[1..];
            if let Some(end) = body.find(quote) {
                let name = body[..end].to_ascii_lowercase();
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_subtracts() {
        let before = CommandStats::parse(
            "# Commandstats\r\ncmdstat_evalsha:calls=3,usec=1\r\ncmdstat_info:calls=1,usec=1\r\n",
        );
        let after = CommandStats::parse(
            "cmdstat_evalsha:calls=10,usec=9\r\ncmdstat_publish:calls=2,usec=1\r\n\
             cmdstat_hset:calls=4,usec=1\r\ncmdstat_info:calls=5,usec=1\r\n",
        );
        let d = after.since(&before);
        assert_eq!(d.get("evalsha"), 7);
        assert_eq!(d.usec("evalsha"), 8);
        assert_eq!(d.get("info"), 0);
        assert_eq!(d.executed(), 13);
        assert_eq!(d.sent(&["hset".to_owned(), "publish".to_owned()]), 7);
    }

    #[test]
    fn finds_script_commands() {
        let names = commands_in_script(
            "if redis.call('EXISTS', KEYS[1]) then redis.call(\"publish\", 'x') end",
        );
        assert_eq!(names, ["exists", "publish"]);
    }
}
