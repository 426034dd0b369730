//! Apache Curator, the peer on ZooKeeper (S13): the Java loop of
//! `bench/java/CuratorLoop.java`, compiled by `javac` on first use and run
//! as child processes driven by lines, as the Rust workers are.
//!
//! It is compiled when the bench runs, not checked in as classes, as the
//! interop test compiles `tests/interop/CuratorHolder.java`: the source is
//! what a reader checks, and the jars are whatever Curator the machine has
//! (Debian's `libcurator-recipes-java`, whose manifest names the framework,
//! client, ZooKeeper and Guava jars).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use lock_testkit::LineChild;

use crate::config::Shape;
use crate::keys::KeyChoice;

/// The Curator jar (its manifest names the rest).
const CURATOR_JAR: &str = "/usr/share/java/curator-recipes.jar";

/// slf4j's no-op logger: Curator and ZooKeeper's client log through slf4j.
const LOGGER_JAR: &str = "/usr/share/java/slf4j-nop.jar";

/// What to install when Curator or a JDK is missing.
const INSTALL_HINT: &str = "apt-get install -y libcurator-recipes-java libcurator-framework-java \
     libcurator-client-java libslf4j-java default-jdk-headless";

/// Longest wait for `ready`: a JVM start, a connection and a warm-up of a
/// few hundred pairs, on a busy machine.
const STARTUP_LIMIT: Duration = Duration::from_secs(120);

/// Longest silence within one uncontended block (it prints at its end: a
/// hundred pairs of a few ms each).
const BLOCK_LIMIT: Duration = Duration::from_secs(60);

/// Most lines read from one uncontended block.
const MAX_LINES: usize = 100_000;

/// `CuratorLoop.java` compiled into `<out_dir>/curator-classes` (once per
/// bench process); the directory of its classes.
fn classes(out_dir: &Path) -> Result<PathBuf> {
    static CLASSES: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(done) = CLASSES.get() {
        return Ok(done.clone());
    }
    if !Path::new(CURATOR_JAR).exists() {
        bail!("Curator not found ({CURATOR_JAR}): {INSTALL_HINT}");
    }
    let java = lock_testkit::zookeeper::java()?;
    // `javac` beside the `java` the servers run (JAVA_HOME), else on PATH.
    let javac = match Path::new(&java).parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join("javac"),
        _ => PathBuf::from("javac"),
    };
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("java/CuratorLoop.java");
    let out = out_dir.join("curator-classes");
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let status = Command::new(&javac)
        .arg("-d")
        .arg(&out)
        .args(["-cp", CURATOR_JAR])
        .arg(&source)
        .status()
        .with_context(|| format!("run {} ({INSTALL_HINT})", javac.display()))?;
    if !status.success() {
        bail!("javac {} failed: {status}", source.display());
    }
    Ok(CLASSES.get_or_init(|| out).clone())
}

/// `java CuratorLoop <args>`, driven by lines.
fn start(out_dir: &Path, args: &[String]) -> Result<LineChild> {
    let classes = classes(out_dir)?;
    let classpath = format!("{}:{CURATOR_JAR}:{LOGGER_JAR}", classes.display());
    let mut command = Command::new(lock_testkit::zookeeper::java()?);
    command.args(["-cp", &classpath, "CuratorLoop"]).args(args);
    let name = format!("CuratorLoop {}", args.first().map_or("", String::as_str));
    LineChild::spawn(&mut command, &name)
}

/// Curator's S1 on one lock path, in blocks the caller interleaves with
/// its own (the JVM is started and warmed up once, before the first).
pub struct Uncontended {
    child: LineChild,
}

impl Uncontended {
    /// Starts the loop on `path`: `warmup` unmeasured pairs, then blocks of
    /// `per_block` on demand ([`block`](Self::block)).
    pub async fn start(
        out_dir: &Path,
        connect: &str,
        path: &str,
        warmup: usize,
        per_block: usize,
    ) -> Result<Uncontended> {
        let args = [
            "uncontended".to_owned(),
            connect.to_owned(),
            path.to_owned(),
            warmup.to_string(),
            per_block.to_string(),
        ];
        let mut child = start(out_dir, &args)?;
        child.expect("ready", STARTUP_LIMIT).await?;
        Ok(Uncontended { child })
    }

    /// One block: the acquire + release pairs and the pairs of
    /// `checkExists` of `/` on the same client (two of its own round
    /// trips), µs each.
    pub async fn block(&mut self) -> Result<(Vec<f64>, Vec<f64>)> {
        self.child.send("block")?;
        let (mut locks, mut exists) = (Vec::new(), Vec::new());
        for line in self
            .child
            .collect_until_done(BLOCK_LIMIT, MAX_LINES)
            .await?
        {
            let bad = || format!("CuratorLoop said {line:?}");
            let (kind, us) = line.split_once(' ').with_context(bad)?;
            let us: f64 = us.parse().with_context(bad)?;
            match kind {
                "lock" => locks.push(us),
                "exists2" => exists.push(us),
                _ => bail!("{}", bad()),
            }
        }
        Ok((locks, exists))
    }
}

/// One process of Curator's contention run (S3 on ZooKeeper): `shape.tasks`
/// threads, workers `first_id..`, on the lock path of `prefix`'s one key,
/// the body on the counter of `prefix` on the Redis at `data_addr`
/// (`host:port`). It prints `ready`, waits for `go`, and answers as
/// `lock-bench --worker contend` does.
pub fn contend(
    out_dir: &Path,
    connect: &str,
    prefix: &str,
    data_addr: &str,
    shape: Shape,
    first_id: u32,
) -> Result<LineChild> {
    if shape.keys != KeyChoice::One {
        bail!("the Curator loop contends for one key only");
    }
    let path = format!(
        "{}{}",
        crate::worker::Library::zookeeper_prefix(prefix),
        shape.keys.key(0)
    );
    let args = [
        "contend".to_owned(),
        connect.to_owned(),
        path,
        data_addr.to_owned(),
        shape.keys.counter(prefix, 0),
        shape.tasks.to_string(),
        first_id.to_string(),
        shape.duration.as_millis().to_string(),
    ];
    start(out_dir, &args)
}

/// Curator's S5: `threads` threads taking pseudo-random locks of `keys`
/// paths under `prefix` (a ZooKeeper path ending in `/`) with an empty
/// body for `duration`. Acquire + release pairs per second, and the
/// acquires that failed.
pub async fn many(
    out_dir: &Path,
    connect: &str,
    prefix: &str,
    (threads, keys): (u64, u64),
    duration: Duration,
) -> Result<(f64, u64)> {
    let args = [
        "many".to_owned(),
        connect.to_owned(),
        prefix.to_owned(),
        threads.to_string(),
        keys.to_string(),
        duration.as_millis().to_string(),
    ];
    let mut child = start(out_dir, &args)?;
    child.expect("ready", STARTUP_LIMIT).await?;
    child.send("go")?;
    let limit = duration + Duration::from_secs(60);
    let (mut ops, mut seconds, mut errors) = (None, None, None);
    for line in child.collect_until_done(limit, 10).await? {
        let bad = || format!("CuratorLoop said {line:?}");
        match line.split_once(' ') {
            Some(("ops", n)) => ops = Some(n.parse::<u64>().with_context(bad)?),
            Some(("seconds", s)) => seconds = Some(s.parse::<f64>().with_context(bad)?),
            Some(("errors", n)) => errors = Some(n.parse::<u64>().with_context(bad)?),
            _ => bail!("{}", bad()),
        }
    }
    match (ops, seconds, errors) {
        (Some(ops), Some(seconds), Some(errors)) if seconds > 0.0 => {
            Ok((ops as f64 / seconds, errors))
        }
        _ => bail!("CuratorLoop many ended without its figures"),
    }
}
