//! What `lockctl --version` says: its own version, the lock-runtime it was
//! built with (whose layout it reads and writes, so an operator can match
//! it to the services'), the backends compiled in, and the features left
//! out (`cargo install --path lockctl --features etcd,zookeeper,tls`).

/// The lock-runtime version this lockctl is built with. The workspace
/// releases both at one version and lockctl's manifest requires exactly
/// that one (`=x.y.z`, checked by the test below), so its own version is
/// lock-runtime's.
const RUNTIME_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The backends this build reaches, and the features it was built without.
fn backends() -> (Vec<&'static str>, Vec<&'static str>) {
    let mut built = vec!["redis", "redis-cluster", "sentinel", "redlock"];
    let mut missing = Vec::new();
    for (feature, on, shown) in [
        ("etcd", cfg!(feature = "etcd"), "etcd"),
        ("zookeeper", cfg!(feature = "zookeeper"), "zookeeper"),
        ("tls", cfg!(feature = "tls"), "tls (rediss://, https://)"),
    ] {
        if on {
            built.push(shown);
        } else {
            missing.push(feature);
        }
    }
    (built, missing)
}

/// The text after `lockctl ` on `--version`: one line, for scripts to grep.
pub(crate) fn line() -> String {
    let (built, missing) = backends();
    let mut line = format!(
        "{} (lock-runtime {RUNTIME_VERSION}; backends: {})",
        env!("CARGO_PKG_VERSION"),
        built.join(", ")
    );
    if !missing.is_empty() {
        line.push_str(&format!(
            "; without the cargo features {}",
            missing.join(", ")
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_names_lock_runtime_and_exactly_the_backends_built_in() {
        let line = line();
        assert!(line.starts_with(env!("CARGO_PKG_VERSION")), "{line}");
        assert!(
            line.contains(&format!("lock-runtime {RUNTIME_VERSION};")),
            "{line}"
        );
        let backends = line
            .split("backends: ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .unwrap_or_default();
        assert!(backends.starts_with("redis, redis-cluster, sentinel, redlock"));
        for (name, on) in [
            ("etcd", cfg!(feature = "etcd")),
            ("zookeeper", cfg!(feature = "zookeeper")),
            ("tls", cfg!(feature = "tls")),
        ] {
            let named = backends.split(", ").any(|b| b.starts_with(name));
            assert_eq!(named, on, "{name} named iff built in: {line}");
        }
        assert_eq!(
            line.contains("without the cargo features"),
            !cfg!(all(
                feature = "etcd",
                feature = "zookeeper",
                feature = "tls"
            )),
            "{line}"
        );
    }

    /// `RUNTIME_VERSION` is lockctl's own version only while lockctl
    /// requires exactly that lock-runtime (the workspace's dependency line).
    #[test]
    fn lockctl_requires_exactly_the_lock_runtime_of_its_own_version() {
        let workspace = include_str!("../../Cargo.toml");
        let wanted = format!("version = \"={RUNTIME_VERSION}\"");
        let line = workspace
            .lines()
            .find(|l| l.starts_with("lock-runtime = "))
            .unwrap_or_default();
        assert!(line.contains(&wanted), "{line:?} lacks {wanted}");
    }
}
