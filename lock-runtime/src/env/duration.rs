//! `LOCK_LEASE` and `LOCK_WAIT`: the runtime's default lease and wait,
//! written as a lock's own are in the attribute (`"30s"`, `"1m30s"`,
//! `"250ms"`), so an operator sets a default the way the code sets one lock.
//!
//! The attribute's durations are read at compile time by lock-macros, a
//! proc-macro crate, which can export nothing but macros; the runtime reads
//! the same syntax here, into a `Duration`, at the edge (the builder gets a
//! type, never the string). The syntax: one or more `<digits><unit>` parts,
//! units `h`, `m`, `s`, `ms`, each at most once and largest first, blanks
//! between parts allowed.

use std::time::Duration;

use crate::error::LockError;

/// What a mistaken value is told, after what is wrong with it.
const SYNTAX: &str = "write it as a lock's lease is written: 250ms, 30s, 1m30s, 2h (units ms, s, \
                      m, h, largest first)";

/// `LOCK_LEASE`: the default lease of every lock that sets none, in the
/// range a lease may take ([`MIN_LEASE`](crate::MIN_LEASE) to
/// [`MAX_LEASE`](crate::MAX_LEASE)).
pub(super) fn lease_from_env(value: &str) -> Result<Duration, LockError> {
    let lease = parsed("LOCK_LEASE", value)?;
    if !(crate::MIN_LEASE..=crate::MAX_LEASE).contains(&lease) {
        return Err(LockError::InvalidConfig(format!(
            "LOCK_LEASE={value:?} is out of range: a lease is 10ms to 24h"
        )));
    }
    Ok(lease)
}

/// `LOCK_WAIT`: the default wait of every acquire that sets none; `0s`
/// tries once, `forever` waits as long as it takes (`None`).
pub(super) fn wait_from_env(value: &str) -> Result<Option<Duration>, LockError> {
    if value.trim().eq_ignore_ascii_case("forever") {
        return Ok(None);
    }
    parsed("LOCK_WAIT", value)
        .map(Some)
        .map_err(|refused| match refused {
            LockError::InvalidConfig(message) => {
                LockError::InvalidConfig(format!("{message}; or forever, for no bound"))
            }
            other => other,
        })
}

/// `value` of the variable `name` as a duration, or an error naming both.
fn parsed(name: &str, value: &str) -> Result<Duration, LockError> {
    let millis = pairs(value).and_then(|pairs| total_millis(&pairs));
    millis.map(Duration::from_millis).map_err(|why| {
        LockError::InvalidConfig(format!(
            "{name}={value:?} is not a duration ({why}): {SYNTAX}"
        ))
    })
}

/// The rank of a unit (larger units first) and its length in ms.
fn unit(name: &str) -> Option<(u8, u64)> {
    match name {
        "h" => Some((0, 3_600_000)),
        "m" => Some((1, 60_000)),
        "s" => Some((2, 1_000)),
        "ms" => Some((3, 1)),
        _ => None,
    }
}

/// `text` cut into its `(digits, unit)` parts, in order: `"1m 30s"` is
/// `[("1", "m"), ("30", "s")]`. A part's unit may be empty (said later).
fn pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut parts: Vec<(String, String)> = Vec::new();
    // Whether the last part may still grow (no blank since it began).
    let mut open = false;
    for c in text.chars() {
        match parts.last_mut().filter(|_| open) {
            Some((digits, unit)) if c.is_ascii_digit() && unit.is_empty() => digits.push(c),
            Some((_, unit)) if c.is_ascii_alphabetic() => unit.push(c),
            _ if c.is_ascii_digit() => {
                parts.push((c.to_string(), String::new()));
                open = true;
            }
            _ if c.is_whitespace() => open = false,
            _ if c == '.' => return Err("fractions are not accepted: 1s500ms is 1.5s".to_owned()),
            _ if c.is_ascii_alphabetic() => {
                return Err("each unit needs a number before it".to_owned())
            }
            _ => return Err(format!("`{c}` is neither a digit nor a unit")),
        }
    }
    if parts.is_empty() {
        return Err("it is empty".to_owned());
    }
    Ok(parts)
}

/// The parts' sum in milliseconds: each unit known, used once, largest
/// first, and the sum within `u64`.
fn total_millis(parts: &[(String, String)]) -> Result<u64, String> {
    let too_long = || "it is too long".to_owned();
    let mut sum: u64 = 0;
    let mut previous: Option<u8> = None;
    for (digits, name) in parts {
        if name.is_empty() {
            return Err(format!("`{digits}` has no unit"));
        }
        let (rank, millis) = unit(name).ok_or_else(|| format!("`{name}` is not a unit"))?;
        if previous.is_some_and(|p| p >= rank) {
            return Err("the units go largest first, each once".to_owned());
        }
        previous = Some(rank);
        let count: u64 = digits.parse().map_err(|_| too_long())?;
        let part = count.checked_mul(millis).ok_or_else(too_long)?;
        sum = sum.checked_add(part).ok_or_else(too_long)?;
    }
    Ok(sum)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn message(result: Result<impl std::fmt::Debug, LockError>) -> String {
        match result {
            Err(LockError::InvalidConfig(message)) => message,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn durations_read_as_the_attribute_writes_them() {
        let cases = [
            ("250ms", 250),
            ("30s", 30_000),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("1m30s", 90_000),
            (" 1m 30s ", 90_000),
            ("1s500ms", 1_500),
            ("1h2m3s4ms", 3_723_004),
        ];
        for (text, millis) in cases {
            assert_eq!(
                parsed("LOCK_WAIT", text).unwrap(),
                Duration::from_millis(millis),
                "{text:?}"
            );
        }
    }

    #[test]
    fn a_mistake_names_the_variable_its_value_and_what_is_wrong() {
        let cases = [
            ("", "it is empty"),
            ("30", "`30` has no unit"),
            ("30sec", "`sec` is not a unit"),
            ("5d", "`d` is not a unit"),
            ("s", "a number before it"),
            ("1.5s", "fractions are not accepted"),
            ("-1s", "`-` is neither"),
            ("30 s", "a number before it"),
            ("30s1m", "largest first"),
            ("1s1s", "largest first"),
            ("99999999999999999999s", "too long"),
            ("9999999999999999h", "too long"),
        ];
        for (text, why) in cases {
            let said = message(parsed("LOCK_LEASE", text));
            assert!(said.contains(why), "{text:?}: {said}");
            assert!(said.starts_with(&format!("LOCK_LEASE={text:?}")), "{said}");
            assert!(said.contains("1m30s"), "{said}");
        }
    }

    #[test]
    fn the_lease_is_refused_outside_the_range_of_a_lease() {
        assert_eq!(lease_from_env("10ms").unwrap(), crate::MIN_LEASE);
        assert_eq!(lease_from_env("24h").unwrap(), crate::MAX_LEASE);
        for text in ["9ms", "0s", "24h1ms", "25h"] {
            let said = message(lease_from_env(text));
            assert!(said.contains("out of range"), "{text:?}: {said}");
            assert!(said.contains("LOCK_LEASE"), "{said}");
        }
    }

    #[test]
    fn a_wait_of_zero_tries_once_and_forever_has_no_bound() {
        assert_eq!(wait_from_env("0s").unwrap(), Some(Duration::ZERO));
        assert_eq!(wait_from_env("5s").unwrap(), Some(Duration::from_secs(5)));
        assert_eq!(wait_from_env("forever").unwrap(), None);
        assert_eq!(wait_from_env(" Forever ").unwrap(), None);
        let said = message(wait_from_env("never"));
        assert!(said.contains("LOCK_WAIT") && said.ends_with("or forever, for no bound"));
    }
}
