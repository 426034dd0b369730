//! What a command works on: the servers ([`Topology`]) and the key prefix
//! from the flags or the environment, a lock runtime on them (for `inspect`
//! and `force_unlock`), plain connections to single Redis servers for what a
//! runtime does not do (`SCAN`, a subscription of one's own; etcd's and
//! ZooKeeper's are in `etcd.rs` and `zookeeper.rs`), and the record of the
//! servers that did not answer (a partial answer). Errors say which
//! servers, with every password masked.

use std::cell::RefCell;
use std::time::Duration;

use lock_runtime::{layout, LockError, LockInfo, LockRuntime};
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use crate::secret;
use crate::topology::{Flags, Topology};
use crate::{Failure, Outcome};

/// How long to wait for a server (to connect, and for each answer) before
/// reporting it unreachable.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(3);

/// The servers and prefix a command works on.
pub(crate) struct Target {
    pub(crate) topology: Topology,
    pub(crate) prefix: String,
    secrets: Vec<String>,
    /// Servers (or parts of the key space) that did not answer: what was
    /// printed may be incomplete.
    gaps: RefCell<Vec<String>>,
}

impl Target {
    /// From the flags, else the variables the runtime's `init_from_env`
    /// reads (see [`Topology::choose`]; `LOCK_PREFIX` for the prefix).
    pub(crate) fn from_args(flags: Flags<'_>, prefix: Option<&str>) -> Result<Target, Failure> {
        let env = |name: &str| std::env::var(name).ok();
        let topology = Topology::choose(flags, env)?;
        if let Some(refused) = topology.unsupported() {
            return Err(refused);
        }
        let prefix = prefix
            .map(str::to_owned)
            .or_else(|| env("LOCK_PREFIX").filter(|p| !p.is_empty()))
            .unwrap_or_else(|| layout::DEFAULT_PREFIX.to_owned());
        Ok(Target {
            secrets: topology.secrets(),
            topology,
            prefix,
            gaps: RefCell::new(Vec::new()),
        })
    }

    /// A lock runtime on the servers (it connects and loads its scripts).
    pub(crate) async fn runtime(&self) -> Result<LockRuntime, Failure> {
        self.build(self.topology.builder()?).await
    }

    /// A runtime on one Redlock master alone (its own view of a lock).
    pub(crate) async fn master_runtime(&self, url: &str) -> Result<LockRuntime, Failure> {
        self.build(LockRuntime::builder().redis(url)).await
    }

    async fn build(
        &self,
        builder: lock_runtime::LockRuntimeBuilder,
    ) -> Result<LockRuntime, Failure> {
        // lockctl takes no lock: it has no identity to publish, and `show`
        // or `list` write nothing.
        builder
            .publish_identity(false)
            .key_prefix(self.prefix.clone())
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .await
            .map_err(|error| self.failure(&error))
    }

    /// A plain connection to one server, bounded by [`TIMEOUT`].
    pub(crate) async fn connect(
        &self,
        client: &redis::Client,
    ) -> redis::RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// The error of a command on these servers, told with the masked URLs.
    pub(crate) fn failure(&self, error: &dyn std::fmt::Display) -> Failure {
        let text = error.to_string();
        let kind = self.topology.server_kind();
        let what = if text.contains("invalid Redis URL") || text.contains("expected redis://") {
            "bad Redis URL".to_owned()
        } else if text.contains("connect") || text.contains("reach") {
            format!("cannot reach {kind} at")
        } else {
            format!("{kind} at")
        };
        let text = with_tls_advice(text);
        Failure(self.scrub(&format!("{what} {}: {text}", self.topology.describe())))
    }

    /// The error of a lock operation (a lost connection is a failure too).
    pub(crate) fn lock_failure(&self, error: &LockError) -> Failure {
        self.failure(error)
    }

    /// `text` without any secret of the configuration.
    pub(crate) fn scrub(&self, text: &str) -> String {
        secret::scrub(text, &self.secrets)
    }

    /// Notes that `what` (a server) did not answer: warns on stderr, and the
    /// command's outcome becomes [`Outcome::Partial`].
    pub(crate) fn unreachable(&self, what: &str, error: &dyn std::fmt::Display) {
        let line = self.scrub(&format!("{what}: {error}"));
        eprintln!("lockctl: warning: {line} (the answer may be incomplete)");
        self.gaps.borrow_mut().push(line);
    }

    /// The outcome of a command that found something (or not), unless a
    /// server did not answer: then [`Outcome::Partial`].
    pub(crate) fn outcome(&self, found: bool) -> Outcome {
        match (self.gaps.borrow().is_empty(), found) {
            (false, _) => Outcome::Partial,
            (true, true) => Outcome::Found,
            (true, false) => Outcome::NotFound,
        }
    }

    /// The process behind `holder`, as its runtime published it (`None`:
    /// nothing published, or the question failed: it only adds a name to
    /// an answer that is complete without it).
    pub(crate) async fn client_of(
        &self,
        runtime: &LockRuntime,
        holder: &str,
    ) -> Option<lock_runtime::ClientInfo> {
        runtime.client_of(holder).await.ok().flatten()
    }

    /// What `runtime` records of the lock `key` now (`None`: free).
    pub(crate) async fn inspect(
        &self,
        runtime: &LockRuntime,
        key: &str,
    ) -> Result<Option<LockInfo>, Failure> {
        runtime
            .inspect(key)
            .await
            .map_err(|e| self.lock_failure(&e))
    }
}

/// What refuses a TLS URL in a build without TLS: lock-runtime's two
/// refusals (`rediss://`, etcd's `https://`) and redis's own.
const NO_TLS: [&str; 3] = [
    "`tls` feature of lock-runtime",
    "feature `tls` of lock-runtime",
    "can't connect with TLS, the feature is not enabled",
];

/// `text`, and when it is a refusal of TLS, the way to a lockctl with TLS:
/// lock-runtime's message names its own cargo feature, which a user of
/// lockctl does not set (lockctl's `tls` feature turns it on).
fn with_tls_advice(text: String) -> String {
    if NO_TLS.iter().any(|refusal| text.contains(refusal)) {
        format!(
            "{text} (this lockctl was built without TLS: install it with \
             `cargo install --path lockctl --features tls`)"
        )
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::with_tls_advice;

    #[test]
    fn a_refused_tls_url_points_to_lockctls_own_tls_feature() {
        for refusal in [
            "invalid lock configuration: rediss:// (TLS) needs the `tls` feature of \
             lock-runtime: lock-runtime = { version = \"…\", features = [\"tls\"] }",
            "an etcd endpoint is https://, but this build has no TLS: enable the feature \
             `tls` of lock-runtime",
            "can't connect with TLS, the feature is not enabled",
        ] {
            let text = with_tls_advice(refusal.to_owned());
            assert!(
                text.contains("`cargo install --path lockctl --features tls`"),
                "{text}"
            );
        }
        let other = "cannot connect to Redis at db:6379: Connection refused";
        assert_eq!(with_tls_advice(other.to_owned()), other);
    }
}
