//! Result rows, the printed table and the JSON results file.
//!
//! A row is one figure: ours (or the peer's), the baseline measured in the
//! same run on the same connection type, their ratio, the target and whether
//! it was met. Targets are judged on ratios where there is a physical limit to
//! compare with, because absolute times on a shared two-core machine move
//! from run to run while ratios measured side by side do not.

use std::fmt::Write as _;

use lock_testkit::Delta;
use serde_json::{json, Value};

/// What a figure must satisfy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// `figure / baseline <= x`.
    RatioAtMost(f64),
    /// `figure / baseline >= x`.
    RatioAtLeast(f64),
    /// `figure <= x`.
    AtMost(f64),
    /// `figure >= x`.
    AtLeast(f64),
    /// `figure < x`.
    Below(f64),
    /// `figure == x`.
    Exactly(f64),
    /// Reported, not judged.
    Info,
}

impl Target {
    fn describe(self) -> String {
        match self {
            Target::RatioAtMost(x) => format!("<= {}x", trim(x)),
            Target::RatioAtLeast(x) => format!(">= {}x", trim(x)),
            Target::AtMost(x) => format!("<= {}", trim(x)),
            Target::AtLeast(x) => format!(">= {}", trim(x)),
            Target::Below(x) => format!("< {}", trim(x)),
            Target::Exactly(x) => format!("= {}", trim(x)),
            Target::Info => "-".to_owned(),
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug)]
pub struct Row {
    /// `S1` .. `S11`, with the mode or side (`S3 cohort`, `S8 peer`).
    pub scenario: &'static str,
    /// What is measured, unit included.
    pub metric: String,
    /// The figure (ours, or the peer's on peer rows).
    pub value: f64,
    /// What the figure is compared with, and its value.
    pub baseline: Option<(String, f64)>,
    /// The target.
    pub target: Target,
}

impl Row {
    /// A row with no baseline.
    pub fn new(scenario: &'static str, metric: impl Into<String>, value: f64) -> Self {
        Row {
            scenario,
            metric: metric.into(),
            value,
            baseline: None,
            target: Target::Info,
        }
    }

    /// Sets the baseline.
    pub fn vs(mut self, name: impl Into<String>, value: f64) -> Self {
        self.baseline = Some((name.into(), value));
        self
    }

    /// Sets the target.
    pub fn target(mut self, target: Target) -> Self {
        self.target = target;
        self
    }

    /// `value / baseline`.
    pub fn ratio(&self) -> Option<f64> {
        self.baseline
            .as_ref()
            .map(|(_, b)| self.value / b)
            .filter(|r| r.is_finite())
    }

    /// `Some(true)` met, `Some(false)` missed, `None` not judged.
    pub fn met(&self) -> Option<bool> {
        let v = self.value;
        match self.target {
            Target::RatioAtMost(x) => Some(self.ratio().is_some_and(|r| r <= x)),
            Target::RatioAtLeast(x) => Some(self.ratio().is_some_and(|r| r >= x)),
            Target::AtMost(x) => Some(v <= x),
            Target::AtLeast(x) => Some(v >= x),
            Target::Below(x) => Some(v < x),
            Target::Exactly(x) => Some(v == x),
            Target::Info => None,
        }
    }

    fn verdict(&self) -> &'static str {
        match self.met() {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "",
        }
    }

    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "scenario": self.scenario,
            "metric": self.metric,
            "value": finite(self.value),
            "baseline": self.baseline.as_ref().map(|(name, v)| json!({"what": name, "value": finite(*v)})),
            "ratio": self.ratio().map(finite),
            "target": self.target.describe(),
            "met": self.met(),
        })
    }
}

/// JSON has no NaN or infinity: those become `null`.
pub fn finite(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        Value::Null
    }
}

/// A number in few characters: whole numbers as they are, others with
/// about four significant digits (so 4.003 does not print as a passing 4).
pub fn trim(v: f64) -> String {
    if !v.is_finite() {
        return if v.is_nan() { "n/a" } else { "inf" }.to_owned();
    }
    let a = v.abs();
    if v.fract() == 0.0 || a >= 1000.0 {
        return format!("{v:.0}");
    }
    let decimals = if a >= 100.0 {
        1
    } else if a >= 10.0 {
        2
    } else if a >= 0.001 {
        3
    } else {
        6
    };
    format!("{v:.decimals$}")
}

/// The report table, Markdown-compatible (it goes into BENCHMARKS.md as is).
pub fn table(rows: &[Row]) -> String {
    let header = [
        "scenario", "metric", "figure", "baseline", "ratio", "target", "result",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.scenario.to_owned(),
                r.metric.clone(),
                trim(r.value),
                r.baseline
                    .as_ref()
                    .map(|(name, v)| format!("{} ({name})", trim(*v)))
                    .unwrap_or_default(),
                r.ratio()
                    .map(|x| format!("{}x", trim(x)))
                    .unwrap_or_default(),
                r.target.describe(),
                r.verdict().to_owned(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[String]| {
        out.push('|');
        for (c, w) in row.iter().zip(widths) {
            let pad = w - c.chars().count();
            let _ = write!(out, " {c}{} |", " ".repeat(pad));
        }
        out.push('\n');
    };
    line(&mut out, &header.map(str::to_owned));
    line(&mut out, &widths.map(|w| "-".repeat(w)));
    for row in &cells {
        line(&mut out, row);
    }
    out
}

/// A command-count delta as JSON (`{"evalsha": {"calls": 3, "usec": 41}}`),
/// for the results file.
pub fn commands_json(delta: &Delta) -> Value {
    Value::Object(
        delta
            .0
            .iter()
            .map(|(k, c)| (k.clone(), json!({"calls": c.calls, "usec": c.usec})))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_and_formatting() {
        let r = Row::new("S1", "lock+unlock p50 (us)", 110.0)
            .vs("2x PING", 100.0)
            .target(Target::RatioAtMost(1.15));
        assert_eq!(r.met(), Some(true));
        assert_eq!(trim(r.ratio().unwrap_or(0.0)), "1.100");
        let r = Row::new("S5", "ops/s", 50.0)
            .vs("raw", 100.0)
            .target(Target::RatioAtLeast(0.6));
        assert_eq!(r.met(), Some(false));
        assert_eq!(Row::new("S7", "x", 1.0).met(), None);
        assert_eq!(trim(12345.678), "12346");
        assert_eq!(trim(0.0456), "0.046");
        assert_eq!(trim(4.0026), "4.003");
        assert_eq!(trim(4.0), "4");
        assert_eq!(trim(238.0), "238");
        let t = table(&[r]);
        assert!(t.contains("MISSED"));
    }
}
