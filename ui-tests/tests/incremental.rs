//! Compile errors as an incremental build reports them. trybuild compiles its cases with
//! `CARGO_INCREMENTAL=0`, and rustc does not always report the same errors both ways: a fn
//! whose error type has no `From<LockError>` was one error in `cases/` but two in the
//! incremental `cargo check` that users (and their editors) run, the second pointing into
//! `__private`. This test checks such a case in a project of its own, incrementally.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod project;

use project::Project;

#[test]
fn error_type_without_from_lock_error_is_one_error_in_an_incremental_build() {
    let stderr = check_incrementally("error_not_from_lock_error");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("error["))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("`AppError` cannot hold a `LockError`"),
        "{stderr}"
    );
}

/// `cargo check` of `cases/<case>.rs` as the main of a project depending on `lock-runtime`,
/// with incremental compilation on; returns what cargo printed.
fn check_incrementally(case: &str) -> String {
    let main = format!("cases/{case}.rs");
    let output = Project {
        name: "incremental",
        edition: "2021",
        main: &main,
        incremental: true,
    }
    .check();
    assert!(!output.status.success(), "the case compiled");
    String::from_utf8_lossy(&output.stderr).into_owned()
}
