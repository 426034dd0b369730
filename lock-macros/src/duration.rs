//! Durations written as strings in the attribute (`lease = "30s"`, `wait = "1m30s"`).
//!
//! They are parsed here, at compile time, into a number of milliseconds, so a typo is a
//! compile error at the literal and the expansion carries a plain
//! `Duration::from_millis(N)`: nothing is parsed at run time.
//!
//! Grammar: one or more `<digits><unit>` components, units `h`, `m`, `s`, `ms`, each used at
//! most once and from the largest to the smallest (`"1h30m"`, `"1m30s"`, `"1s500ms"`).
//! Spaces between components are allowed (`"1m 30s"`).

/// The units, largest first, with their length in milliseconds.
const UNITS: [(&str, u64); 4] = [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)];

/// What to tell the user about the accepted syntax, appended to every parse error.
pub(crate) const ACCEPTED: &str =
    "accepted units are `ms`, `s`, `m`, `h`, combined largest first: \"250ms\", \"30s\", \"1m30s\", \"2h\"";

/// Parses `text` into milliseconds, or returns a message saying what is wrong with it.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let bad = |why: &str| format!("invalid duration \"{text}\": {why}; {ACCEPTED}");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad("it is empty"));
    }
    let mut total: u64 = 0;
    // Index in UNITS of the last unit used; the next must be strictly smaller.
    let mut last_unit: Option<usize> = None;
    while !rest.is_empty() {
        let digits_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits_len == 0 {
            return Err(bad("expected a number before each unit"));
        }
        let (digits, after) = rest.split_at(digits_len);
        if after.starts_with('.') {
            return Err(bad(
                "fractions are not accepted, write \"1s500ms\" for 1.5s",
            ));
        }
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(bad(&format!("`{digits}` has no unit")));
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return Err(bad(&format!("unknown unit `{unit}`")));
        };
        if last_unit.is_some_and(|last| index <= last) {
            return Err(bad(
                "units must go from the largest to the smallest, each at most once",
            ));
        }
        last_unit = Some(index);
        let too_long = || bad("it is too long");
        let count: u64 = digits.parse().map_err(|_| too_long())?;
        let millis = count.checked_mul(UNITS[index].1).ok_or_else(too_long)?;
        total = total.checked_add(millis).ok_or_else(too_long)?;
        rest = after.trim_start();
    }
    Ok(total)
}

/// Writes a number of milliseconds back in the attribute's syntax, for messages.
pub(crate) fn display_millis(mut millis: u64) -> String {
    if millis == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (name, size) in UNITS {
        if millis >= size {
            out.push_str(&format!("{}{name}", millis / size));
            millis %= size;
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn single_units_scale_to_milliseconds() {
        assert_eq!(parse_millis("250ms").unwrap(), 250);
        assert_eq!(parse_millis("30s").unwrap(), 30_000);
        assert_eq!(parse_millis("2m").unwrap(), 120_000);
        assert_eq!(parse_millis("1h").unwrap(), 3_600_000);
        assert_eq!(parse_millis("0s").unwrap(), 0);
    }

    #[test]
    fn components_add_up_largest_first() {
        assert_eq!(parse_millis("1m30s").unwrap(), 90_000);
        assert_eq!(parse_millis("1h2m3s4ms").unwrap(), 3_723_004);
        assert_eq!(parse_millis(" 1m 30s ").unwrap(), 90_000);
        assert_eq!(parse_millis("1s500ms").unwrap(), 1_500);
    }

    #[test]
    fn mistakes_are_named_and_list_the_units() {
        let cases = [
            ("", "it is empty"),
            ("30", "`30` has no unit"),
            ("30sec", "unknown unit `sec`"),
            ("5d", "unknown unit `d`"),
            ("s", "expected a number"),
            ("1.5s", "fractions are not accepted"),
            ("-1s", "expected a number"),
            ("30s1m", "largest to the smallest"),
            ("1s1s", "largest to the smallest"),
            ("99999999999999999999s", "too long"),
            ("9999999999999999h", "too long"),
        ];
        for (text, why) in cases {
            let message = parse_millis(text).unwrap_err();
            assert!(message.contains(why), "{text:?}: {message}");
            assert!(
                message.contains("accepted units are"),
                "{text:?}: {message}"
            );
        }
    }

    #[test]
    fn display_round_trips() {
        for text in ["0s", "250ms", "30s", "1m30s", "25h", "1h2m3s4ms"] {
            assert_eq!(display_millis(parse_millis(text).unwrap()), text);
        }
    }
}
