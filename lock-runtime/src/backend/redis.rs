//! The Redis backend: scripts, one connection, pub/sub wake-ups, background releases.
//!
//! One multiplexed connection (a redis-rs `ConnectionManager`, RESP3) carries
//! everything: script calls, pipelined renewals, and the release channels'
//! messages, which arrive as RESP3 pushes and are handed to the waiters
//! registry. The manager reconnects by itself and re-subscribes the channels;
//! when it reports a disconnection every waiter is woken to retry at once,
//! since a release message may have been lost with the connection.
//!
//! Scripts are loaded at start-up and called by SHA (`EVALSHA`); when the server
//! answers `NOSCRIPT` (it restarted, or its script cache was flushed) the call
//! falls back to `EVAL` with the source, which caches it again. Keys and
//! values always travel as KEYS/ARGV, never spliced into script text.
//!
//! Two small tasks run on the runtime's worker thread: the subscription task
//! (subscribe/unsubscribe in order) and the releaser, which sends the releases
//! queued by dropped guards and cancelled acquires, pipelined.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Cmd, ErrorKind, IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, RedisError,
    RedisResult, Script, ServerErrorKind, Value,
};
use tokio::sync::mpsc;

use super::{Acquire, Queue, Release, Wakeups, Watched, Watches, QUEUE_ENTRY_LIFE};
use crate::backend::releases::{PendingReleases, ReleaseJob, ReleaseQueue};
use crate::error::{BackendError, LockError};
use crate::held::HeldLock;
use crate::names::LockNames;

/// One Lua script: its source and SHA1.
#[derive(Debug)]
struct LuaScript {
    source: &'static str,
    sha: String,
}

impl LuaScript {
    fn new(source: &'static str) -> Self {
        LuaScript {
            source,
            sha: Script::new(source).get_hash().to_owned(),
        }
    }

    /// `EVALSHA sha numkeys KEYS... ARGV...` (by SHA) or `EVAL source ...`.
    fn call(&self, by_sha: bool, keys: &[&str], args: &[&str]) -> Cmd {
        let mut cmd = if by_sha {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&self.sha);
            c
        } else {
            let mut c = redis::cmd("EVAL");
            c.arg(self.source);
            c
        };
        cmd.arg(keys.len()).arg(keys).arg(args);
        cmd
    }
}

/// The lock scripts, compiled into the crate from `scripts/*.lua`.
#[derive(Debug)]
struct Scripts {
    acquire: LuaScript,
    release: LuaScript,
    renew: LuaScript,
    force_unlock: LuaScript,
    /// Fair mode: acquire and release through the key's queue.
    fair: LuaScript,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            acquire: LuaScript::new(include_str!("../scripts/acquire.lua")),
            release: LuaScript::new(include_str!("../scripts/release.lua")),
            renew: LuaScript::new(include_str!("../scripts/renew.lua")),
            force_unlock: LuaScript::new(include_str!("../scripts/force_unlock.lua")),
            fair: LuaScript::new(include_str!("../scripts/fair.lua")),
        }
    }

    /// A call of the fair script (`args[0]` is the operation) on the lock
    /// `hash`: its four keys are the lock, fence, queue and queue entries.
    fn fair(&self, by_sha: bool, hash: &str, args: &[&str]) -> Cmd {
        let keys = [
            hash,
            &LockNames::fence(hash),
            &LockNames::queue(hash),
            &LockNames::queued(hash),
        ];
        self.fair.call(by_sha, &keys, args)
    }

    /// The release of one hold, plain or fair, as a command (`window`: the
    /// fence counter's TTL in ms, for a fair handoff's new token).
    fn release(&self, by_sha: bool, hash: &str, holder: &str, fair: bool, window: &str) -> Cmd {
        let channel = LockNames::channel(hash);
        if fair {
            self.fair(by_sha, hash, &["release", holder, &channel, window])
        } else {
            self.release.call(by_sha, &[hash], &[holder, &channel])
        }
    }
}

/// Connection settings the builder passes in.
#[derive(Clone, Default)]
pub(crate) struct RedisSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    /// PEM of a private CA to trust instead of the system roots (`rediss://`).
    pub(crate) tls_root_ca: Option<Vec<u8>>,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    /// PEM certificate chain and key for mutual TLS.
    pub(crate) tls_client: Option<(Vec<u8>, Vec<u8>)>,
    /// How long a key's last token is kept after it was issued.
    pub(crate) fence_window: Duration,
}

/// Makes the client, with TLS settings when the URL asks for TLS.
fn client_for(
    info: redis::ConnectionInfo,
    settings: &RedisSettings,
) -> Result<redis::Client, LockError> {
    let tls = url_is_tls(&info);
    if !tls {
        return redis::Client::open(info)
            .map_err(|_| LockError::InvalidConfig("invalid Redis URL".to_owned()));
    }
    tls_client(info, settings)
}

fn url_is_tls(info: &redis::ConnectionInfo) -> bool {
    matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. })
}

#[cfg(feature = "tls")]
fn tls_client(
    info: redis::ConnectionInfo,
    settings: &RedisSettings,
) -> Result<redis::Client, LockError> {
    // rustls needs a process-wide crypto provider; another part of the
    // program may have installed one already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if settings.tls_root_ca.is_none() && settings.tls_client.is_none() {
        return redis::Client::open(info)
            .map_err(|_| LockError::InvalidConfig("invalid Redis URL".to_owned()));
    }
    let certificates = redis::TlsCertificates {
        client_tls: settings
            .tls_client
            .clone()
            .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: settings.tls_root_ca.clone(),
    };
    redis::Client::build_with_tls(info, certificates).map_err(|e| {
        LockError::InvalidConfig(format!(
            "unusable TLS certificates (PEM expected): {}",
            e.detail().unwrap_or("could not parse them")
        ))
    })
}

#[cfg(not(feature = "tls"))]
fn tls_client(
    _info: redis::ConnectionInfo,
    _settings: &RedisSettings,
) -> Result<redis::Client, LockError> {
    Err(LockError::InvalidConfig(
        "rediss:// (TLS) needs the `tls` feature of lock-runtime: \
         lock-runtime = { version = \"…\", features = [\"tls\"] }"
            .to_owned(),
    ))
}

/// Handle to the Redis backend of one runtime (cheap to clone).
#[derive(Clone)]
pub(crate) struct RedisBackend {
    con: ConnectionManager,
    scripts: Arc<Scripts>,
    releases: ReleaseQueue,
    endpoint: Arc<str>,
    /// The fence counter's TTL in ms: how long a token is kept after it was
    /// issued (the scripts' ARGV).
    window: Arc<str>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// Checks the URL's shape without echoing it (it may hold a password).
fn parse_url(url: &str) -> Result<redis::ConnectionInfo, LockError> {
    let shape = "expected redis://[user[:password]@]host[:port][/db] or rediss://… \
                 (the URL is not shown: it may hold a password)";
    if let Some(problem) = unsupported_url(url) {
        return Err(LockError::InvalidConfig(problem.to_owned()));
    }
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(LockError::InvalidConfig(format!(
            "invalid Redis URL: {shape}"
        )));
    }
    let info = url
        .into_connection_info()
        .map_err(|_| LockError::InvalidConfig(format!("invalid Redis URL: {shape}")))?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Ok(info.set_redis_settings(settings))
}

/// What is wrong with a URL of a kind this version cannot use, in words a
/// user can act on (never echoing the URL, which may hold a password).
fn unsupported_url(url: &str) -> Option<&'static str> {
    let url = url.trim();
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let scheme = scheme.to_ascii_lowercase();
    if scheme.contains("sentinel") {
        return Some(
            "invalid Redis URL: Redis Sentinel is not supported yet; give the current \
             primary as one redis://host:port URL",
        );
    }
    if scheme.contains("cluster") {
        return Some(
            "invalid Redis URL: Redis Cluster is not supported yet; give one server as \
             redis://host:port",
        );
    }
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    if rest.contains(',') || url.split_whitespace().nth(1).is_some() {
        return Some(
            "invalid Redis URL: a list of servers (Cluster, Sentinel or Redlock) is not \
             supported yet; give one server as redis://host:port",
        );
    }
    if scheme == "rediss" && !cfg!(feature = "tls") {
        return Some(
            "rediss:// (TLS) needs the `tls` feature of lock-runtime: \
             lock-runtime = { version = \"…\", features = [\"tls\"] }",
        );
    }
    None
}

/// Connects, loads the scripts and starts the subscription and release tasks.
/// Must run on the runtime's worker thread (the tasks are spawned there).
/// Releases and handoffs are told to `wakeups`; the waiters reach the
/// subscription task and the releaser through the returned [`Watches`].
pub(crate) async fn connect(
    url: &str,
    settings: &RedisSettings,
    wakeups: Weak<dyn Wakeups>,
) -> Result<(RedisBackend, Arc<dyn Watches>), LockError> {
    let fence_window = settings.fence_window;
    let info = parse_url(url)?;
    let endpoint: Arc<str> = info.addr().to_string().into();
    let client = client_for(info, settings)?;

    let (sub_tx, sub_rx) = mpsc::unbounded_channel();
    let sub_tx_retry = sub_tx.clone();
    let (releases, release_jobs) = ReleaseQueue::new();
    let on_push = push_handler(wakeups);
    let config = ConnectionManagerConfig::new()
        .set_push_sender(on_push)
        .set_automatic_resubscription()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_secs(1));

    let unreachable = |source: RedisError| {
        BackendError::new(format!("cannot connect to Redis at {endpoint}"), source)
    };
    let con = match tokio::time::timeout(
        settings.connect_timeout.saturating_mul(2),
        ConnectionManager::new_with_config(client, config),
    )
    .await
    {
        Ok(Ok(con)) => con,
        Ok(Err(e)) => return Err(unreachable(e).into()),
        Err(_) => {
            return Err(BackendError::msg(format!(
                "cannot connect to Redis at {endpoint}: no answer within {:?}",
                settings.connect_timeout.saturating_mul(2)
            ))
            .into())
        }
    };

    let scripts = Arc::new(Scripts::new());
    load_scripts(&mut con.clone(), &scripts)
        .await
        .map_err(|e| {
            BackendError::new(
                format!("cannot load lock scripts into Redis at {endpoint}"),
                e,
            )
        })?;

    let window: Arc<str> = ms(fence_window).into();
    tokio::spawn(subscriptions(con.clone(), sub_rx, sub_tx_retry));
    tokio::spawn(releaser(
        con.clone(),
        scripts.clone(),
        window.clone(),
        release_jobs,
        releases.pending().clone(),
    ));

    let watches = Arc::new(RedisWatches {
        subscriptions: sub_tx,
        releases: releases.clone(),
    });
    let backend = RedisBackend {
        con,
        scripts,
        releases,
        endpoint,
        window,
    };
    Ok((backend, watches))
}

/// The waiters' way to the subscription task and the releaser.
#[derive(Debug)]
struct RedisWatches {
    subscriptions: mpsc::UnboundedSender<SubscriptionCommand>,
    releases: ReleaseQueue,
}

impl Watches for RedisWatches {
    fn watch(&self, lock: &str, watched: Arc<dyn Watched>) {
        let command = SubscriptionCommand::Subscribe(LockNames::channel(lock), watched);
        if let Err(mpsc::error::SendError(SubscriptionCommand::Subscribe(_, watched))) =
            self.subscriptions.send(command)
        {
            // The runtime is stopping: waiters fall back to the lease.
            watched.set_ready();
        }
    }

    fn unwatch(&self, lock: &str) {
        let channel = LockNames::channel(lock);
        let _ = self
            .subscriptions
            .send(SubscriptionCommand::Unsubscribe(channel));
    }

    fn give_back_place(&self, lock: String, holder: String) {
        self.releases.send(lock, holder, true);
    }
}

/// What the subscription task is asked to do, in order.
#[derive(Debug)]
enum SubscriptionCommand {
    /// Subscribe to a channel, then mark its waiters ready (also when that
    /// fails: the task sends it again later, while they still wait).
    Subscribe(String, Arc<dyn Watched>),
    /// Unsubscribe from a channel nobody waits on any more.
    Unsubscribe(String),
}

/// Routes RESP3 pushes: a release message wakes one waiter of its key, a
/// handoff message ("g <holder> <fence>", fair mode) is delivered to the
/// process it names; a lost connection wakes everyone.
fn push_handler(wakeups: Weak<dyn Wakeups>) -> impl Fn(PushInfo) -> Result<(), ()> + Send + Sync {
    move |push: PushInfo| {
        let Some(wakeups) = wakeups.upgrade() else {
            return Err(());
        };
        match push.kind {
            PushKind::Message => {
                if let Some(channel) = text(push.data.first()) {
                    let lock = LockNames::hash_of_channel(channel);
                    match text(push.data.get(1)).and_then(parse_handoff) {
                        Some((holder, fence)) => wakeups.handed_over(lock, holder, fence),
                        None => wakeups.released(lock),
                    }
                }
            }
            PushKind::Disconnection => wakeups.connection_lost(),
            _ => {}
        }
        Ok(())
    }
}

/// The text of a bulk string in a push.
fn text(value: Option<&Value>) -> Option<&str> {
    match value {
        Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes).ok(),
        _ => None,
    }
}

/// Parses a fair-mode handoff message: `g <holder id> <fence>`.
fn parse_handoff(message: &str) -> Option<(&str, u64)> {
    let rest = message.strip_prefix("g ")?;
    let (holder, fence) = rest.rsplit_once(' ')?;
    Some((holder, fence.parse().ok()?))
}

async fn load_scripts(con: &mut ConnectionManager, scripts: &Scripts) -> RedisResult<()> {
    for script in [
        &scripts.acquire,
        &scripts.release,
        &scripts.renew,
        &scripts.force_unlock,
        &scripts.fair,
    ] {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script.source)
            .query_async(con)
            .await?;
    }
    Ok(())
}

fn is_noscript(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Runs one script call made by `call(by_sha)`: by SHA, falling back to the
/// source on `NOSCRIPT`.
async fn by_sha<T: redis::FromRedisValue>(
    con: &mut ConnectionManager,
    call: impl Fn(bool) -> Cmd,
) -> RedisResult<T> {
    match call(true).query_async(con).await {
        Err(e) if is_noscript(&e) => call(false).query_async(con).await,
        other => other,
    }
}

/// [`by_sha`] for a script with these keys and arguments.
async fn eval<T: redis::FromRedisValue>(
    con: &mut ConnectionManager,
    script: &LuaScript,
    keys: &[&str],
    args: &[&str],
) -> RedisResult<T> {
    by_sha(con, |sha| script.call(sha, keys, args)).await
}

fn ms(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

impl RedisBackend {
    fn failed(&self, what: &str, source: RedisError) -> BackendError {
        BackendError::new(format!("{what} on Redis at {}", self.endpoint), source)
    }

    /// `host:port` of the server (no credentials).
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub(crate) async fn acquire(
        &self,
        hash: &str,
        holder: &str,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquire, BackendError> {
        let fence_key = LockNames::fence(hash);
        let lease = ms(lease);
        let mut con = self.con.clone();
        // (The caller boxes this whole future, so it stays out of the state of
        // every waiting acquire.)
        let reply: RedisResult<(i64, i64)> = if queue == Queue::No {
            eval(
                &mut con,
                &self.scripts.acquire,
                &[hash, &fence_key],
                &[holder, &lease, &self.window],
            )
            .await
        } else {
            self.acquire_fair(&mut con, hash, holder, &lease, queue)
                .await
        };
        let (held, n) = reply.map_err(|e| self.failed("acquire failed", e))?;
        Ok(if held == 1 || held == 2 {
            Acquire::Held {
                fence: u64::try_from(n).unwrap_or(0),
                handed: held == 2,
            }
        } else {
            Acquire::Busy {
                ttl: u64::try_from(n).ok().map(Duration::from_millis),
            }
        })
    }

    /// The fair mode's acquire script (see `scripts/fair.lua`).
    async fn acquire_fair(
        &self,
        con: &mut ConnectionManager,
        hash: &str,
        holder: &str,
        lease: &str,
        queue: Queue,
    ) -> RedisResult<(i64, i64)> {
        let (join, handoff_lease) = match queue {
            Queue::Join(lease) => ("1", ms(lease)),
            _ => ("0", "0".to_owned()),
        };
        let args = [
            "acquire",
            holder,
            lease,
            join,
            &ms(QUEUE_ENTRY_LIFE),
            &LockNames::channel(hash),
            &handoff_lease,
            &self.window,
        ];
        by_sha(con, |sha| self.scripts.fair(sha, hash, &args)).await
    }

    pub(crate) async fn release(
        &self,
        hash: &str,
        holder: &str,
        fair: bool,
    ) -> Result<Release, BackendError> {
        let mut con = self.con.clone();
        let left: i64 = by_sha(&mut con, |sha| {
            self.scripts.release(sha, hash, holder, fair, &self.window)
        })
        .await
        .map_err(|e| self.failed("release failed", e))?;
        Ok(match left {
            0 => Release::Freed,
            n if n > 0 => Release::StillHeld,
            _ => Release::NotHeld,
        })
    }

    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let mut con = self.con.clone();
        let _: String = redis::cmd("PING")
            .query_async(&mut con)
            .await
            .map_err(|e| self.failed("PING failed", e))?;
        Ok(())
    }

    pub(crate) async fn force_unlock(&self, hash: &str) -> Result<bool, BackendError> {
        let channel = LockNames::channel(hash);
        let mut con = self.con.clone();
        let deleted: i64 = eval(&mut con, &self.scripts.force_unlock, &[hash], &[&channel])
            .await
            .map_err(|e| self.failed("force unlock failed", e))?;
        Ok(deleted == 1)
    }

    pub(crate) fn pending(&self) -> &PendingReleases {
        self.releases.pending()
    }

    pub(crate) fn release_in_background(&self, hash: String, holder: String, fair: bool) {
        if !self.releases.send(hash, holder, fair) {
            // The runtime is shutting down; the lease frees the lock.
            tracing::debug!("lock runtime stopped; a lock will be freed by its lease");
        }
    }

    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        let mut con = self.con.clone();
        let mut by_sha = true;
        loop {
            let mut pipe = redis::pipe();
            for lock in batch {
                let lease = ms(lock.lease);
                pipe.add_command(self.scripts.renew.call(
                    by_sha,
                    &[&lock.hash],
                    &[&lock.holder, &lease],
                ));
            }
            let replies: Vec<RedisResult<i64>> = pipe
                .ignore_errors()
                .query_async(&mut con)
                .await
                .map_err(|e| self.failed("renewal failed", e))?;
            if by_sha && replies.iter().any(|r| r.as_ref().is_err_and(is_noscript)) {
                by_sha = false;
                continue;
            }
            return Ok(replies
                .into_iter()
                .map(|r| r.ok().map(|n| n == 1))
                .collect());
        }
    }
}

/// Pause before a failed subscribe is sent again (doubling up to the max).
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(50);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(1);

/// Subscribes and unsubscribes release channels, in the order asked. A
/// subscribe that fails is queued again after a pause, for as long as its
/// key has waiters (the queue keeps it in order with that key's unsubscribe:
/// an entry that closed meanwhile is skipped); when a retry goes through, the
/// key's head waiter is woken, as a release may have gone unheard.
async fn subscriptions(
    mut con: ConnectionManager,
    mut commands: mpsc::UnboundedReceiver<SubscriptionCommand>,
    again: mpsc::UnboundedSender<SubscriptionCommand>,
) {
    let mut backoff: std::collections::HashMap<String, Duration> = Default::default();
    while let Some(command) = commands.recv().await {
        match command {
            SubscriptionCommand::Subscribe(channel, entry) => {
                if entry.is_closed() {
                    backoff.remove(&channel);
                    continue;
                }
                match con.subscribe(&channel).await {
                    Ok(()) => {
                        if backoff.remove(&channel).is_some() {
                            entry.wake_first();
                        }
                        entry.set_ready();
                    }
                    Err(error) => {
                        tracing::debug!(%error, "subscribe failed; trying again");
                        let pause = backoff
                            .get(&channel)
                            .map_or(RESUBSCRIBE_MIN, |p| (*p * 2).min(RESUBSCRIBE_MAX));
                        backoff.insert(channel.clone(), pause);
                        // Waiters fall back to the holder's lease meanwhile.
                        entry.set_ready();
                        let again = again.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(pause).await;
                            let _ = again.send(SubscriptionCommand::Subscribe(channel, entry));
                        });
                    }
                }
            }
            SubscriptionCommand::Unsubscribe(channel) => {
                if let Err(error) = con.unsubscribe(&channel).await {
                    tracing::debug!(%error, "unsubscribe failed");
                }
            }
        }
    }
}

/// Most releases sent in one pipeline.
const RELEASE_BATCH: usize = 512;
/// Attempts per release batch before leaving the locks to their leases.
const RELEASE_ATTEMPTS: u32 = 3;

/// Sends queued releases, pipelined, retrying a failing batch a few times.
async fn releaser(
    mut con: ConnectionManager,
    scripts: Arc<Scripts>,
    window: Arc<str>,
    mut jobs: mpsc::UnboundedReceiver<ReleaseJob>,
    pending: Arc<PendingReleases>,
) {
    let mut batch = Vec::with_capacity(RELEASE_BATCH);
    while jobs.recv_many(&mut batch, RELEASE_BATCH).await > 0 {
        let mut by_sha = true;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut pipe = redis::pipe();
            for (hash, holder, fair) in &batch {
                pipe.add_command(scripts.release(by_sha, hash, holder, *fair, &window));
            }
            let outcome: RedisResult<Vec<RedisResult<i64>>> =
                pipe.ignore_errors().query_async(&mut con).await;
            match outcome {
                Ok(replies)
                    if by_sha && replies.iter().any(|r| r.as_ref().is_err_and(is_noscript)) =>
                {
                    by_sha = false;
                }
                Ok(_) => break,
                Err(error) if attempt < RELEASE_ATTEMPTS => {
                    tracing::debug!(%error, "background release failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                }
                Err(error) => {
                    tracing::warn!(
                        %error,
                        locks = batch.len(),
                        "background release failed; the locks will be freed by their leases"
                    );
                    break;
                }
            }
        }
        pending.done(batch.iter().map(|(hash, _, _)| hash.as_str()));
        batch.clear();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::parse_url;

    fn error(url: &str) -> String {
        parse_url(url).unwrap_err().to_string()
    }

    #[test]
    fn urls_of_unsupported_deployments_say_what_is_supported() {
        for url in [
            "redis+sentinel://:secret@s1:26379,s2:26379/mymaster",
            "redis-sentinel://s1:26379",
            "sentinel://s1:26379",
        ] {
            let text = error(url);
            assert!(
                text.contains("Sentinel is not supported yet"),
                "{url}: {text}"
            );
            assert!(!text.contains("secret"), "{text}");
        }
        for url in ["redis+cluster://n1:7000", "redis-cluster://n1:7000,n2:7001"] {
            assert!(error(url).contains("Cluster is not supported yet"), "{url}");
        }
        for url in [
            "redis://:secret@n1:7000,n2:7001",
            "redis://n1:6379 redis://n2:6379",
        ] {
            let text = error(url);
            assert!(text.contains("a list of servers"), "{url}: {text}");
            assert!(!text.contains("secret"), "{text}");
        }
        assert!(error("http://localhost").contains("expected redis://"));
        assert!(parse_url("redis://127.0.0.1:6379/2").is_ok());
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_tls_url_without_the_tls_feature_names_the_feature() {
        let text = error("rediss://:secret@cache.example:6380");
        assert!(text.contains("the `tls` feature"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
}
