//! The Redis family's configuration: one server, a Cluster, Redlock's
//! masters, a Sentinel service (how its data nodes are reached, and the
//! replicas a hold waits for); and what `build` refuses of them.
//!
//! Sets the builder's fields only; connects nothing (`backend/`).

use std::time::Duration;

use super::{Choice, LockRuntimeBuilder, TIMEOUT_RANGE};
use crate::error::LockError;

impl LockRuntimeBuilder {
    /// Use the Redis server at `url` (`redis://[user[:password]@]host[:port][/db]`,
    /// or `rediss://` for TLS). Needs Redis 6 or later (RESP3).
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.choice = Choice::Redis(url.into());
        self
    }

    /// Use a Redis Cluster, given the URLs of some of its nodes
    /// (`redis://[user[:password]@]host:port`, or `rediss://` for TLS; one
    /// reachable node is enough, the client learns the others and the
    /// slots from it). Needs Redis 7 or later (sharded pub/sub). Every name
    /// of one lock shares a hash tag, so each lock lives on one node; see
    /// `docs/deploying.md`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder()
    ///     .redis_cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .build()
    ///     .await?;
    /// # drop(runtime); Ok(()) }
    /// ```
    pub fn redis_cluster<U: Into<String>>(mut self, urls: impl IntoIterator<Item = U>) -> Self {
        self.choice = Choice::RedisCluster(urls.into_iter().map(Into::into).collect());
        self
    }

    /// Use Redlock over these independent Redis masters (each
    /// `redis://…` or `rediss://…`, at least three; an odd count is best, as
    /// N and N+1 masters tolerate the same number of failures): a lock is
    /// held while a majority (N/2+1) of them hold it, so it survives the loss
    /// of a minority. Fair mode is not available on it: `build` refuses a
    /// builder whose `fair` is on (also by `LOCK_FAIR=1`). `docs/deploying.md`
    /// says what it guarantees.
    ///
    /// ```
    /// # async fn demo() {
    /// let built = lock_runtime::LockRuntime::builder()
    ///     .redlock(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])
    ///     .fair(false)
    ///     .build()
    ///     .await;
    /// assert!(built.unwrap_err().to_string().contains("at least 3 masters"));
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo());
    /// ```
    pub fn redlock<I>(mut self, urls: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.choice = Choice::Redlock(urls.into_iter().map(Into::into).collect());
        self
    }

    /// Use the primary of a Redis Sentinel service, and follow it across
    /// failovers: `sentinels` are the sentinels' addresses
    /// (`redis://[user:password@]host:port`, or `host:port`; a password in
    /// one authenticates to that sentinel), `service` the name they monitor
    /// (`sentinel monitor <service> …`). The primary and replicas are
    /// reached with [`sentinel_auth`](Self::sentinel_auth) and
    /// [`sentinel_db`](Self::sentinel_db). See `docs/deploying.md`, "Redis Sentinel".
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// let runtime = lock_runtime::LockRuntime::builder()
    ///     .redis_sentinel(["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"], "mymaster")
    ///     .sentinel_auth(None, "data-node-password")
    ///     .sync_replicas(1, Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// println!("{}", runtime.describe()); // redis sentinel service mymaster, primary at …
    /// # Ok(()) }
    /// ```
    pub fn redis_sentinel(
        mut self,
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        service: impl Into<String>,
    ) -> Self {
        let sentinels = sentinels.into_iter().map(Into::into).collect();
        self.choice = Choice::Sentinel(sentinels, service.into());
        self
    }

    /// Sentinel: the user (`None`: the default user) and password of the
    /// primary and replicas (not of the sentinels: put theirs in their URLs).
    pub fn sentinel_auth(mut self, username: Option<String>, password: impl Into<String>) -> Self {
        self.node_auth.username = username;
        self.node_auth.password = Some(password.into());
        self
    }

    /// Sentinel: the database number on the primary (default 0).
    pub fn sentinel_db(mut self, db: u16) -> Self {
        self.node_auth.db = db;
        self
    }

    /// Sentinel: after each first acquisition, `WAIT` until `replicas`
    /// replicas have the lock, at most `timeout` (1 ms to 1 h), so that a
    /// failover right after the acquire does not lose it. When fewer
    /// acknowledge it, the lock is released and the acquire fails with a
    /// [`LockError::Backend`] saying "replication sync failed" (a bounded
    /// wait retries until its deadline first). Costs a replication round
    /// trip per acquire; keep `timeout` below
    /// [`try_timeout`](Self::try_timeout), which bounds a try-once.
    pub fn sync_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.sync_replicas = Some((replicas, timeout));
        self
    }

    /// `sync_replicas` is for Sentinel only, with at least one replica.
    pub(super) fn check_sync_replicas(&self) -> Result<(), LockError> {
        let Some((replicas, timeout)) = self.sync_replicas else {
            return Ok(());
        };
        if !matches!(self.choice, Choice::Sentinel(..)) {
            return Err(LockError::InvalidConfig(
                "sync_replicas needs the Sentinel backend (redis_sentinel)".to_owned(),
            ));
        }
        if replicas == 0 || !TIMEOUT_RANGE.contains(&timeout) {
            return Err(LockError::InvalidConfig(format!(
                "sync_replicas({replicas}, {timeout:?}) is out of range: use at least one \
                 replica and 1ms to 1h"
            )));
        }
        Ok(())
    }
}

/// What `build` refuses of a Redlock configuration: fewer than three
/// masters (with one or two, one failure stops every lock: use
/// `.redis(url)` for one server), and fair mode. An even count is allowed,
/// with a warning.
pub(super) fn check_redlock(masters: usize, fair: bool) -> Result<(), LockError> {
    use crate::backend::redlock::{FAIR_UNSUPPORTED, MIN_MASTERS};
    if masters < MIN_MASTERS {
        return Err(LockError::InvalidConfig(format!(
            "Redlock needs at least {MIN_MASTERS} masters, got {masters} (with fewer, one \
             failure stops every lock; use .redis(url) for a single server)"
        )));
    }
    if fair {
        return Err(LockError::InvalidConfig(FAIR_UNSUPPORTED.to_owned()));
    }
    if masters.is_multiple_of(2) {
        tracing::warn!(
            masters,
            "Redlock over an even number of masters tolerates no more failures than \
             one master fewer"
        );
    }
    Ok(())
}
