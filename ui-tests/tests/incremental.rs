//! Compile errors as an incremental build reports them. trybuild compiles its cases with
//! `CARGO_INCREMENTAL=0`, and rustc does not always report the same errors both ways: a fn
//! whose error type has no `From<LockError>` was one error in `cases/` but two in the
//! incremental `cargo check` that users (and their editors) run, the second pointing into
//! `__private`. This test checks such a case in a project of its own, incrementally.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::{env, fs};

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
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = here.parent().expect("workspace");
    let project = Path::new(env!("CARGO_TARGET_TMPDIR")).join("incremental");
    fs::create_dir_all(project.join("src")).expect("project directory");
    let manifest = format!(
        "[package]\nname = \"incremental-case\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n[dependencies]\nlock-runtime = {{ path = {:?} }}\n\n[workspace]\n",
        workspace.join("lock-runtime")
    );
    fs::write(project.join("Cargo.toml"), manifest).expect("manifest");
    // The workspace's lock file: the same dependency versions, and no registry lookup.
    fs::copy(workspace.join("Cargo.lock"), project.join("Cargo.lock")).expect("lock file");
    let source = fs::read_to_string(here.join("cases").join(format!("{case}.rs"))).expect("case");
    fs::write(project.join("src/main.rs"), source).expect("main");
    let output = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .current_dir(&project)
        .args([
            "check",
            "--offline",
            "--quiet",
            "--color=never",
            "--target-dir",
        ])
        .arg(project.join("target"))
        .env("CARGO_INCREMENTAL", "1")
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo check");
    assert!(!output.status.success(), "the case compiled");
    String::from_utf8_lossy(&output.stderr).into_owned()
}
