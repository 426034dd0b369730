//! Latency charts: cumulative distributions, ours against the peer, on a
//! logarithmic time axis.
//!
//! Hand-written SVG (a few lines, no plotting crate): the two distributions
//! are orders of magnitude apart, so a log-x CDF shows both whole — the body
//! of each curve and its tail — with reference lines (the round-trip limit,
//! targets) drawn in.

use std::fmt::Write as _;

use crate::stats::Samples;

/// One curve: label, colour, samples in microseconds.
pub struct Series<'a> {
    /// Legend text.
    pub label: String,
    /// CSS colour.
    pub colour: &'a str,
    /// The samples.
    pub samples: &'a Samples,
}

const W: f64 = 760.0;
const H: f64 = 450.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 86.0;
const BOTTOM: f64 = 60.0;
/// Points drawn per curve (quantile steps).
const POINTS: usize = 400;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn label_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{} ms", us / 1e3)
    } else {
        format!("{us} µs")
    }
}

/// A CDF chart of `series`, with vertical markers at `(label, µs)`;
/// `x_label` names the measured time.
pub fn cdf_chart(
    title: &str,
    x_label: &str,
    series: &[Series<'_>],
    markers: &[(String, f64)],
) -> String {
    let all_max = series
        .iter()
        .map(|s| s.samples.max())
        .chain(markers.iter().map(|m| m.1))
        .filter(|v| v.is_finite())
        .fold(100.0_f64, f64::max);
    let all_min = series
        .iter()
        .map(|s| s.samples.quantile(0.0))
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    // From the decade of the fastest sample (1 µs at least) to the slowest's.
    let lo_decade = if all_min.is_finite() {
        all_min.log10().floor().max(0.0)
    } else {
        1.0
    };
    let hi_decade = all_max.log10().ceil().max(lo_decade + 1.0);
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let x_of = |us: f64| {
        let d = us.max(1.0).log10().clamp(lo_decade, hi_decade);
        LEFT + (d - lo_decade) / (hi_decade - lo_decade) * plot_w
    };
    let y_of = |q: f64| TOP + (1.0 - q) * plot_h;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    // Grid and axes.
    let mut decade = lo_decade;
    while decade <= hi_decade + 1e-9 {
        let x = x_of(10f64.powf(decade));
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0,
            label_us(10f64.powf(decade))
        );
        decade += 1.0;
    }
    for step in 0..=4 {
        let q = f64::from(step) / 4.0;
        let y = y_of(q);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}%</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            q * 100.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{} (log scale)</text>"#,
        LEFT + plot_w / 2.0,
        H - 16.0,
        esc(x_label)
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">share of samples at or below</text>"#,
        TOP + plot_h / 2.0
    );
    for (i, (label, us)) in markers.iter().enumerate() {
        let x = x_of(*us);
        let ty = TOP + 14.0 + 14.0 * i as f64;
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#888" stroke-dasharray="4 3"/><text x="{:.1}" y="{ty:.1}" fill="#555" font-size="11">{}</text>"##,
            TOP + plot_h,
            x + 4.0,
            esc(label)
        );
    }
    // Curves.
    for s in series {
        let sorted = s.samples.sorted();
        if sorted.is_empty() {
            continue;
        }
        let n = sorted.len();
        let mut points = String::new();
        for k in 0..=POINTS {
            let idx = (k * (n - 1)) / POINTS;
            let q = (idx + 1) as f64 / n as f64;
            let _ = write!(points, "{:.1},{:.1} ", x_of(sorted[idx]), y_of(q));
        }
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            s.colour,
            points.trim_end()
        );
    }
    // Legend, between the title and the plot.
    for (i, s) in series.iter().enumerate() {
        let y = 46.0 + 18.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            LEFT + 22.0,
            s.colour,
            LEFT + 28.0,
            y + 4.0,
            esc(&s.label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_is_well_formed() {
        let ours = Samples::new(vec![100.0, 150.0, 200.0]);
        let peer = Samples::new(vec![1e5, 2e5]);
        let svg = cdf_chart(
            "t",
            "x",
            &[
                Series {
                    label: "ours".into(),
                    colour: "blue",
                    samples: &ours,
                },
                Series {
                    label: "peer <x>".into(),
                    colour: "red",
                    samples: &peer,
                },
            ],
            &[("PING p50".into(), 50.0)],
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("peer &lt;x&gt;"));
    }
}
