//! A one-file project that depends on `lock-runtime` as a user's crate does, checked by cargo
//! outside this workspace: for what trybuild cannot vary (it compiles every case in this
//! crate's edition, with `CARGO_INCREMENTAL=0`).
#![allow(clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::{env, fs};

/// How the project is built.
pub struct Project<'a> {
    /// Its directory's name under the test's target directory.
    pub name: &'a str,
    /// The crate's edition.
    pub edition: &'a str,
    /// Its `src/main.rs`, relative to this crate (`cases/x.rs`, `pass/y.rs`).
    pub main: &'a str,
    /// Whether rustc compiles incrementally, as an editor's `cargo check` does.
    pub incremental: bool,
}

impl Project<'_> {
    /// `cargo check` of the project; returns what cargo reported.
    pub fn check(&self) -> Output {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let workspace = here.parent().expect("workspace");
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let project = root.join(self.name);
        fs::create_dir_all(project.join("src")).expect("project directory");
        let manifest = format!(
            "[package]\nname = \"{name}-case\"\nversion = \"0.0.0\"\nedition = \"{edition}\"\n\
             publish = false\n\n[dependencies]\nlock-runtime = {{ path = {runtime:?} }}\n\
             async-trait = \"0.1\"\n\n[workspace]\n",
            name = self.name,
            edition = self.edition,
            runtime = workspace.join("lock-runtime"),
        );
        fs::write(project.join("Cargo.toml"), manifest).expect("manifest");
        // The workspace's lock file: the same dependency versions, and no registry lookup.
        fs::copy(workspace.join("Cargo.lock"), project.join("Cargo.lock")).expect("lock file");
        let source = fs::read_to_string(here.join(self.main)).expect("main");
        fs::write(project.join("src/main.rs"), source).expect("main");
        Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
            .current_dir(&project)
            .args([
                "check",
                "--offline",
                "--quiet",
                "--color=never",
                "--target-dir",
            ])
            // One target directory for every project: the dependencies are checked once.
            .arg(root.join("projects-target"))
            .env(
                "CARGO_INCREMENTAL",
                if self.incremental { "1" } else { "0" },
            )
            .env_remove("RUSTFLAGS")
            .output()
            .expect("cargo check")
    }
}
