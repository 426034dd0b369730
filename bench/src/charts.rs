//! The two S3 charts: handoff latency and wait to acquire, ours (plain and
//! fair mode, each with lock cohorting off and on) vs rslock, as cumulative
//! distributions on a logarithmic time axis.
//!
//! Handoff latency is the figure the target is about; the wait chart is
//! there because a polling peer's handoffs are rare (the releaser usually
//! re-grabs the lock), so its cost shows in the waits' tail instead. The two
//! libraries are orders of magnitude apart, so a log-x CDF shows both whole,
//! the body of each curve and its tail, with the reference lines (round-trip
//! limit, targets) drawn in. Drawn with `plotters`' SVG backend.
//!
//! S14's `read_write.svg` is the writers' waits on a read-heavy key, the
//! same kind of CDF, one curve per contender.
//!
//! A third chart, `limits.svg`, puts every contender of S3, S8 and S9 (and
//! their shared-server variants) against its scenario's limit: one bar per
//! contender, its acquisitions/s over the limit's (medians), a dot per
//! repetition, with the limit (1.0) and the default mode's goal drawn in.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;

use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::trim;
use crate::scenarios::limit::GOAL;
use crate::scenarios::{Curves, LimitGroup};
use crate::stats::Samples;
use crate::worker::Library;

/// What S3 hands over for charting.
pub struct S3Charts {
    /// Handoff latencies of each library and mode, µs.
    pub handoffs: Curves,
    /// Waits to acquire of each library and mode, µs.
    pub waits: Curves,
    /// Idle PING p50 on the runtime's connection, µs.
    pub ping_p50: Option<f64>,
}

/// One curve: legend text, colour, samples in microseconds.
struct Series<'a> {
    label: String,
    colour: RGBColor,
    samples: &'a Samples,
}

const OURS: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const FAIR: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
const COHORT: RGBColor = RGBColor(0x94, 0x67, 0xbd);
const FAIR_COHORT: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
const PEER: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const MARKER: RGBColor = RGBColor(0x88, 0x88, 0x88);

/// Size of each chart, pixels.
const SIZE: (u32, u32) = (760, 450);
/// Points drawn per curve (quantile steps).
const POINTS: usize = 400;

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

/// A curve's legend name and colour.
fn style(library: Library) -> (&'static str, RGBColor) {
    match library {
        Library::Ours => ("lock-runtime, plain", OURS),
        Library::OursDefault
        | Library::OursCluster
        | Library::OursEtcd
        | Library::OursZooKeeper => ("lock-runtime", OURS),
        Library::OursFair => ("lock-runtime, fair", FAIR),
        Library::OursCohort => ("lock-runtime, cohort", COHORT),
        Library::OursFairCohort => ("lock-runtime, fair+cohort", FAIR_COHORT),
        Library::Rslock => ("rslock 0.10", PEER),
        Library::Curator => ("Curator InterProcessMutex", PEER),
        Library::Serial => ("no lock (the limit)", MARKER),
    }
}

fn curves<'a>(curves: &'a Curves, what: &str) -> Vec<Series<'a>> {
    curves
        .iter()
        .map(|(library, samples)| {
            let (name, colour) = style(*library);
            Series {
                label: label(name, samples, what),
                colour,
                samples,
            }
        })
        .collect()
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
        &curves(&charts.handoffs, "handoffs"),
        &markers,
    )?;
    let waits = cdf_chart(
        &format!("S3 wait to acquire, 8 workers in 2 processes{suffix}"),
        "asked for the lock → body starts",
        &curves(&charts.waits, "acquisitions"),
        &[
            ("target p99: 5 ms".to_owned(), 5_000.0),
            ("target max: 50 ms".to_owned(), 50_000.0),
        ],
    )?;
    let mut paths = Vec::new();
    for (name, svg) in [("handoff.svg", handoff), ("waits.svg", waits)] {
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("write {}", path.display()))?;
        paths.push(path);
    }
    Ok(paths)
}

/// Writes `limits.svg` (every contender against its scenario's limit)
/// into `dir`; returns its path.
pub fn write_limits(dir: &Path, groups: &[LimitGroup], quick: bool) -> Result<PathBuf> {
    let suffix = if quick { " (quick run)" } else { "" };
    let svg = limits_chart(
        &format!("Acquisitions/s as a fraction of the limit (the body alone, no lock){suffix}"),
        groups,
    )?;
    let path = dir.join("limits.svg");
    std::fs::write(&path, svg).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// S14's chart (`read_write.svg`): the writers' waits to acquire of each
/// contender (`(name, samples in µs)`, all repetitions together), a CDF
/// like S3's wait chart.
pub fn writer_waits(curves: &[(String, Samples)], quick: bool) -> Result<String> {
    const COLOURS: [RGBColor; 4] = [OURS, FAIR, FAIR_COHORT, MARKER];
    let suffix = if quick { " (quick run)" } else { "" };
    let series: Vec<Series<'_>> = curves
        .iter()
        .zip(COLOURS.iter().cycle())
        .map(|((name, samples), colour)| Series {
            label: label(name, samples, "writes"),
            colour: *colour,
            samples,
        })
        .collect();
    cdf_chart(
        &format!("S14 writers' wait, 90 % reads, 8 workers in 2 processes{suffix}"),
        "a writer asked for the lock → its body starts",
        &series,
        &[],
    )
}

/// Share of a group's width its bars take (the rest separates groups).
const BARS_WIDTH: f64 = 0.8;

/// An SVG bar chart: per scenario, one bar per contender at its fraction
/// of the limit, the repetitions as dots, the limit and the goal as lines.
fn limits_chart(title: &str, groups: &[LimitGroup]) -> Result<String> {
    let highest = groups
        .iter()
        .flat_map(|g| &g.bars)
        .flat_map(|b| b.runs.iter().chain([&b.fraction]))
        .copied()
        .filter(|v| v.is_finite())
        .fold(1.0_f64, f64::max);
    let top = (highest * 1.15).max(1.2);
    let width = groups.len().max(1) as f64;
    svg(|root| {
        let mut chart = titled(root, title)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..width, 0.0..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc("acquisitions/s ÷ the limit's (same repetitions)")
            .y_label_formatter(&|v| format!("{v:.1}"))
            .draw()?;
        for (y, text) in [
            (1.0, "the limit: bodies back to back, no lock".to_owned()),
            (GOAL, format!("goal for the default mode: {GOAL}x")),
        ] {
            chart.draw_series(DashedLineSeries::new(
                [(0.0, y), (width, y)],
                4,
                3,
                MARKER.stroke_width(1),
            ))?;
            chart.draw_series(std::iter::once(Text::new(
                text,
                (0.02, y + top * 0.005),
                ("sans-serif", 11)
                    .into_font()
                    .color(&MARKER)
                    .pos(Pos::new(HPos::Left, VPos::Bottom)),
            )))?;
        }
        let legend = draw_bars(&mut chart, root, groups, top)?;
        for library in legend {
            let (name, colour) = style(library);
            chart
                .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
                .label(name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled())
                });
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}

/// The drawing area of one chart.
type Root<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
/// The limits chart: x the scenario groups, y the fraction of the limit.
type BarChart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The limits chart's bars: per group, a bar per contender with its value
/// on top and its repetitions as dots, the group's name below; returns
/// the libraries drawn, in order, for the legend.
fn draw_bars(
    chart: &mut BarChart<'_, '_>,
    root: &Root<'_>,
    groups: &[LimitGroup],
    top: f64,
) -> Result<Vec<Library>> {
    let mut legend: Vec<Library> = Vec::new();
    let label_style = ("sans-serif", 12)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    let value_style = ("sans-serif", 10)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    for (g, group) in groups.iter().enumerate() {
        let n = group.bars.len().max(1) as f64;
        let bar = BARS_WIDTH / n;
        let left = g as f64 + (1.0 - BARS_WIDTH) / 2.0;
        for (i, b) in group.bars.iter().enumerate() {
            let (_, colour) = style(b.library);
            if !legend.contains(&b.library) {
                legend.push(b.library);
            }
            let x0 = left + i as f64 * bar;
            let (x1, mid) = (x0 + bar * 0.9, x0 + bar * 0.45);
            let v = if b.fraction.is_finite() {
                b.fraction
            } else {
                0.0
            };
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x1, v)],
                colour.filled(),
            )))?;
            chart.draw_series(
                b.runs
                    .iter()
                    .filter(|r| r.is_finite())
                    .map(|&r| Circle::new((mid, r), 2, BLACK.filled())),
            )?;
            let above = b.runs.iter().copied().fold(v, f64::max);
            chart.draw_series(std::iter::once(Text::new(
                format!("{v:.2}"),
                (mid, above + top * 0.01),
                value_style.clone(),
            )))?;
        }
        let (px, py) = chart.backend_coord(&(g as f64 + 0.5, 0.0));
        root.draw(&Text::new(
            group.scenario.to_owned(),
            (px, py + 8),
            label_style.clone(),
        ))?;
    }
    Ok(legend)
}

/// The frame every chart here is drawn in: an SVG of [`SIZE`] on white,
/// drawn by `draw`, returned as text.
fn svg(draw: impl FnOnce(&Root<'_>) -> Result<()>) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
    }
    Ok(svg)
}

/// A chart on `root` titled `title`, in the title font and margin every
/// chart here shares.
fn titled<'a, 'b>(root: &'a Root<'b>, title: &str) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder.caption(title, ("sans-serif", 15)).margin(12);
    builder
}

/// Draws the legend box of `chart`'s labelled series at `position`, in the
/// style every chart here shares.
fn draw_legend<'a, 'b: 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, CT>,
    position: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(MARKER)
        .label_font(("sans-serif", 12))
        .draw()?;
    Ok(())
}

/// Whole decades (as powers of ten) from the fastest sample's, 1 µs at the
/// least, to the slowest sample's or marker's, 100 µs at the least.
fn decades(series: &[Series<'_>], markers: &[(String, f64)]) -> (f64, f64) {
    let slowest = series
        .iter()
        .map(|s| s.samples.max())
        .chain(markers.iter().map(|m| m.1))
        .filter(|v| v.is_finite())
        .fold(100.0_f64, f64::max);
    let fastest = series
        .iter()
        .map(|s| s.samples.quantile(0.0))
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let lo = if fastest.is_finite() {
        fastest.log10().floor().max(0.0)
    } else {
        1.0
    };
    let hi = slowest.log10().ceil().max(lo + 1.0);
    (10f64.powf(lo), 10f64.powf(hi))
}

/// An SVG CDF chart of `series`, with dashed vertical markers at
/// `(label, µs)`; `x_label` names the measured time.
fn cdf_chart(
    title: &str,
    x_label: &str,
    series: &[Series<'_>],
    markers: &[(String, f64)],
) -> Result<String> {
    let (lo, hi) = decades(series, markers);
    let clamp = |us: f64| us.clamp(lo, hi);
    svg(|root| {
        let mut chart = titled(root, title)
            // Room for the last tick label (`100 ms`), centred on the edge.
            .margin_right(30)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc(format!("{x_label} (log scale)"))
            .y_desc("share of samples at or below")
            .x_label_formatter(&|us| time(*us))
            .y_label_formatter(&|q| format!("{:.0}%", q * 100.0))
            .draw()?;
        for (i, (text, us)) in markers.iter().enumerate() {
            let x = clamp(*us);
            chart.draw_series(DashedLineSeries::new(
                [(x, 0.0), (x, 1.0)],
                4,
                3,
                MARKER.stroke_width(1),
            ))?;
            // Stacked down from the top, clear of the legend (lower right).
            let y = 0.96 - 0.05 * i as f64;
            chart.draw_series(std::iter::once(Text::new(
                text.clone(),
                (x * 1.05, y),
                ("sans-serif", 11).into_font().color(&MARKER),
            )))?;
        }
        for s in series {
            let sorted = s.samples.sorted();
            if sorted.is_empty() {
                continue;
            }
            let n = sorted.len();
            let points = (0..=POINTS).map(|k| {
                let idx = (k * (n - 1)) / POINTS;
                (clamp(sorted[idx]), (idx + 1) as f64 / n as f64)
            });
            let colour = s.colour;
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
                .label(s.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(3))
                });
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn chart_has_a_curve_per_series_and_escapes_labels() {
        let ours = Samples::new(vec![100.0, 150.0, 200.0]);
        let peer = Samples::new(vec![1e5, 2e5]);
        let svg = cdf_chart(
            "t",
            "x",
            &[
                Series {
                    label: "ours".into(),
                    colour: OURS,
                    samples: &ours,
                },
                Series {
                    label: "peer <x>".into(),
                    colour: PEER,
                    samples: &peer,
                },
            ],
            &[("PING p50".into(), 50.0)],
        )
        .unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("peer &lt;x&gt;"));
        assert!(svg.contains("PING p50"));
    }

    #[test]
    fn limit_chart_has_a_bar_per_contender_and_names_each_scenario() {
        use crate::scenarios::LimitBar;
        let bar = |library, fraction| LimitBar {
            library,
            fraction,
            runs: vec![fraction * 0.9, fraction, fraction * 1.1],
        };
        let groups = [
            LimitGroup {
                scenario: "S3",
                bars: vec![bar(Library::OursFairCohort, 0.8), bar(Library::Rslock, 0.7)],
            },
            LimitGroup {
                scenario: "S8 shared",
                bars: vec![
                    bar(Library::OursFairCohort, 1.4),
                    bar(Library::Rslock, f64::NAN),
                ],
            },
        ];
        let svg = limits_chart("t", &groups).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("S8 shared") && svg.contains("rslock 0.10"));
        assert!(svg.contains("0.80") && svg.contains("1.40"));
        assert!(svg.matches("<rect").count() >= 4, "{svg}");
    }
}
