#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report
//! The quick variant of every scenario, so `cargo test --workspace` keeps the
//! harness working. It checks that each scenario completes and that its
//! figures are sane — counter exact, nothing lost, no overlap, finite
//! numbers — not the performance targets, which mean nothing in a debug build.

use std::path::PathBuf;

use lock_bench::report::{Row, Target};
use lock_bench::{Config, Scenario};

fn find<'a>(rows: &'a [Row], scenario: &str, metric: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.scenario == scenario && r.metric.contains(metric))
        .unwrap_or_else(|| panic!("no row {scenario} / {metric}"))
}

#[test]
fn every_scenario_runs_in_its_quick_form() {
    let mut config = Config::new(true).unwrap();
    config.worker_exe = PathBuf::from(env!("CARGO_BIN_EXE_lock-bench"));
    config.out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-quick");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let summary = runtime.block_on(lock_bench::run(config)).unwrap();
    let rows = &summary.rows;
    println!("{}", summary.table);

    for scenario in Scenario::ALL {
        let name = format!("{scenario:?}");
        assert!(
            rows.iter().any(|r| r.scenario == name),
            "{name} produced no row"
        );
    }
    // Correctness figures must hold in any build.
    for row in rows.iter().filter(|r| r.target == Target::Exactly(0.0)) {
        assert_eq!(
            row.met(),
            Some(true),
            "{} {}: {}",
            row.scenario,
            row.metric,
            row.value
        );
    }
    assert_eq!(find(rows, "S2", "commands per nested pair").value, 0.0);
    // Our figures are finite and positive where they measure something (a
    // worker of a short debug run may get no turn: its spread is infinite).
    let finite = |r: &&Row| !r.scenario.contains("peer") && !r.metric.contains("busiest");
    for row in rows.iter().filter(finite) {
        assert!(
            row.value.is_finite(),
            "{} {} = {}",
            row.scenario,
            row.metric,
            row.value
        );
    }
    for (scenario, metric) in [
        ("S1", "acquire+release p50"),
        ("S1b", "locked call p50"),
        ("S3", "handoff p50"),
        ("S3", "acquisitions/s"),
        ("S3 cohort", "acquisitions/s"),
        ("S3 fair+cohort", "acquisitions/s"),
        ("S4", "commands per acquisition"),
        ("S4 cohort", "commands per acquisition"),
        ("S5", "lock ops/s"),
        ("S6", "round trips per tick"),
        ("S7", "per held lock"),
        ("S7", "per waiting task"),
        ("S8", "acquisitions/s"),
        ("S8", "largest process share"),
        ("S9", "acquisitions/s"),
        ("S9", "largest process share"),
        ("S3 limit", "no lock, bodies one at a time"),
        ("S3 shared", "acquisitions/s vs the limit"),
        ("S3 shared limit", "no lock, bodies one at a time"),
        ("S3 shared default", "acquisitions/s vs rslock"),
        ("S3 fair+cohort", "time per acquisition"),
        ("S8", "acquisitions/s vs the limit"),
        ("S8 limit", "no lock, bodies one at a time"),
        ("S8 shared", "acquisitions/s vs the limit"),
        ("S8 shared limit", "no lock, bodies one at a time"),
        ("S9", "acquisitions/s vs the limit"),
        ("S9 limit", "no lock, bodies one at a time"),
        ("S10", "within the window"),
        ("S13", "S1 lock+unlock p50 on ZooKeeper"),
        ("S13", "S3 acquisitions/s on ZooKeeper"),
        ("S13", "S4 requests per acquisition on ZooKeeper"),
        ("S13", "S5 lock ops/s on ZooKeeper"),
        ("S13 peer", "Curator S1 p50"),
        ("S14", "read-write, plain"),
        ("S14", "read-write, default builder"),
        ("S14 rw plain", "acquisitions/s, 90 % reads"),
        ("S14 rw default", "acquisitions/s, 90 % reads"),
        ("S14 exclusive", "acquisitions/s, 90 % reads"),
        ("S14 limit", "acquisitions/s, 90 % reads"),
        ("S15", "multi-key lock: transfers/s"),
        ("S15 multi", "transfers/s"),
        ("S15 global", "transfers/s"),
        ("S15 nested-sorted", "transfers/s"),
        ("S15 multi", "lock commands per transfer"),
        ("S16", "permits = 8: units sold/s"),
        ("S16 N=1", "units sold/s"),
        ("S16 N=8", "units sold/s"),
        ("S16 N=8", "lock commands per sale"),
        ("S16 unlocked", "units sold/s"),
    ] {
        let row = find(rows, scenario, metric);
        assert!(row.value > 0.0, "{scenario} {metric} = {}", row.value);
    }
    assert!(find(rows, "S4", "commands per acquisition").value >= 2.0);
    assert!(summary.json_path.exists());
    assert_eq!(
        summary.svg_paths.len(),
        4,
        "S3 ran: two charts, and the limit chart; S14 its own"
    );
    for path in &summary.svg_paths[..2] {
        let svg = std::fs::read_to_string(path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    }
    let read_write = std::fs::read_to_string(&summary.svg_paths[3]).unwrap();
    assert!(read_write.starts_with("<svg") && read_write.contains("polyline"));
    let limits = std::fs::read_to_string(&summary.svg_paths[2]).unwrap();
    for scenario in ["S3", "S3 shared", "S8", "S8 shared", "S9"] {
        // plotters writes each text on a line of its own.
        assert!(limits.contains(&format!("\n{scenario}\n")), "{scenario}");
    }
    assert!(
        summary.seconds < 120.0,
        "quick run took {} s",
        summary.seconds
    );
}
