//! A stranger's first hour: a new crate, outside this workspace, depends on
//! lock-runtime the way the README's "Add it to your crate" says (its two
//! TOML blocks, word for word), on the `.crate` files `cargo publish` would
//! upload (`cargo package`, unpacked), and runs the README's 20-line example
//! on the embedded backend and on a `redis-server` of its own.
//!
//! So a file the package leaves out (a Lua script, a module), a dependency
//! that resolves only inside the workspace, or a README example that no
//! longer builds fails here, not for the first user.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lock_testkit::{CommandStats, RedisServer};

const README: &str = include_str!("../../README.md");

/// Where the README's patch block says the packaged crates are.
const README_PACKAGES: &str = "../lock-runtime/target/package/";

/// What the example prints, up to its fencing token.
const CHARGED: &str = "charging 100 to order 42; storage may refuse tokens below ";

/// The longest the built example may run.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// The fenced blocks of `lang` in the README section under `heading`.
fn blocks(heading: &str, lang: &str) -> Vec<String> {
    let section = README
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("the README has no section {heading:?}"));
    let fence = format!("```{lang}");
    let mut found = Vec::new();
    for part in section.split(&fence).skip(1) {
        let body = part.split("\n```").next().unwrap_or_default();
        found.push(body.trim_start_matches('\n').to_owned());
    }
    found
}

/// The workspace's cargo, or `cargo` on the PATH.
fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
}

/// `command`'s output; panics with its stderr when it fails.
fn succeeded(command: &mut Command, what: &str) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A fresh directory under the system's temporary one (outside the
/// workspace), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("lock-runtime-stranger-{}-{nanos}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Packages lock-macros and lock-runtime as `cargo publish` would (without
/// building them: the stranger's build does) and unpacks the `.crate`
/// files into `into`.
fn package_into(into: &Path) {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = into.join("package-target");
    succeeded(
        cargo()
            .current_dir(&workspace)
            .args(["package", "--offline", "--no-verify", "--allow-dirty"])
            .args(["-p", "lock-macros", "-p", "lock-runtime", "--target-dir"])
            .arg(&target),
        "cargo package",
    );
    for name in ["lock-macros", "lock-runtime"] {
        // The workspace's version, which the three crates share.
        let file = format!("{name}-{}.crate", env!("CARGO_PKG_VERSION"));
        let file = target.join("package").join(file);
        succeeded(
            Command::new("tar")
                .arg("xzf")
                .arg(&file)
                .arg("-C")
                .arg(into),
            "tar",
        );
    }
}

/// Writes the stranger's crate in `dir`: the README's dependency and patch
/// blocks (the patch pointing at `packages`), the README's example as
/// `src/main.rs`, and this workspace's lock file, so that it builds offline
/// with the versions the workspace is tested with.
fn write_crate(dir: &Path, packages: &Path) {
    let toml = blocks("Add it to your crate", "toml");
    assert!(toml.len() >= 2, "dependencies and a patch: {toml:?}");
    let patch = toml[1].replace(README_PACKAGES, &format!("{}/", packages.display()));
    assert_ne!(patch, toml[1], "the patch block names {README_PACKAGES}");
    let manifest = format!(
        "[package]\nname = \"stranger\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         {}\n{patch}\n[workspace]\n",
        toml[0]
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let example = blocks("In 20 lines", "rust");
    std::fs::write(dir.join("src/main.rs"), &example[0]).unwrap();
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock");
    std::fs::copy(lock, dir.join("Cargo.lock")).unwrap();
}

/// Builds the crate in `dir` and returns its binary. Its target directory
/// stays in the workspace's (kept between runs: only lock-runtime and the
/// example build again); no debug info, which nothing here reads.
fn build(dir: &Path) -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stranger-target");
    succeeded(
        cargo()
            .current_dir(dir)
            .args(["build", "--offline", "--quiet"])
            .env("CARGO_TARGET_DIR", &target)
            .env("CARGO_PROFILE_DEV_DEBUG", "0"),
        "cargo build of the stranger's crate",
    );
    target.join("debug").join("stranger")
}

/// Runs `binary` with only `vars` set (and `PATH`), at most [`RUN_LIMIT`].
fn run(binary: &Path, vars: &[(&str, &str)]) -> Output {
    let mut child = Command::new(binary)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            panic!("the example ran longer than {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The fencing token the example printed; panics unless it ran to the end.
fn charged(out: &Output) -> u64 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stdout}\n{stderr}", out.status);
    let token = stdout
        .lines()
        .find_map(|l| l.strip_prefix(CHARGED))
        .unwrap_or_else(|| panic!("the example did not charge: {stdout}\n{stderr}"));
    token.trim().parse().unwrap()
}

#[tokio::test]
async fn the_readme_example_runs_in_a_new_crate_on_the_package_on_both_backends() {
    let redis = RedisServer::try_start().unwrap_or_else(|e| panic!("{e:#}"));
    let scratch = Scratch::new();
    let packages = scratch.0.join("packages");
    std::fs::create_dir_all(&packages).unwrap();
    package_into(&packages);
    let dir = scratch.0.join("stranger");
    std::fs::create_dir_all(&dir).unwrap();
    write_crate(&dir, &packages);
    let binary = build(&dir);

    // Nothing set: a debug build says it runs on the embedded backend.
    let embedded = run(&binary, &[]);
    assert!(charged(&embedded) > 0);
    let said = String::from_utf8_lossy(&embedded.stderr);
    assert!(said.contains("using the embedded backend"), "{said}");

    // REDIS_URL: the same lines on Redis, whose scripts took the lock.
    let mut con = redis.connection().await;
    let before = CommandStats::read(&mut con).await.unwrap();
    let url = redis.url();
    let on_redis = run(&binary, &[("REDIS_URL", url.as_str())]);
    assert!(charged(&on_redis) > 0);
    let said = String::from_utf8_lossy(&on_redis.stderr);
    assert!(!said.contains("embedded"), "{said}");
    let after = CommandStats::read(&mut con).await.unwrap();
    let scripts = |s: &CommandStats| s.calls("evalsha") + s.calls("eval");
    assert!(
        scripts(&after) > scripts(&before),
        "the example ran no lock script on Redis"
    );
}
