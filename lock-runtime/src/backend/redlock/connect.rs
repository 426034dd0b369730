//! Connecting to the masters: each one a single-server backend of its own
//! (`backend::redis::connect`), all at once; a start-up that fails unless a
//! majority answers; masters that were down connected in the background.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, Weak};

use super::boot::BOOT_SCRIPT;
use super::gather::{gather, Call};
use super::read::READ_SCRIPT;
use super::watches::RedlockWatches;
use super::{
    quorum, reason, Connected, Inner, Master, Redlock, FENCE_SCRIPT, MIN_MASTERS, RECONNECT_MAX,
    RECONNECT_MIN,
};
use crate::backend::redis::{connect, RedisBackend};
use crate::backend::{ConnectSettings, Wakeups, Watches};
use crate::error::{BackendError, LockError};

impl Redlock {
    /// Connects to every master at once. Fails when a URL is malformed, or
    /// when fewer than a majority can be reached; a master that is down is
    /// connected in the background later, and counts as not answering until
    /// then.
    /// `marker` is the masters' boot marker (see `boot.rs`): every
    /// connected master's is read, and created where missing, before this
    /// returns.
    pub(crate) async fn start(
        urls: &[String],
        marker: String,
        settings: &ConnectSettings,
        wakeups: Weak<dyn Wakeups>,
    ) -> Result<(Redlock, Arc<dyn Watches>), LockError> {
        if urls.len() < MIN_MASTERS {
            return Err(LockError::InvalidConfig(format!(
                "Redlock needs at least {MIN_MASTERS} masters, got {}",
                urls.len()
            )));
        }
        let quorum = quorum::quorum(urls.len());
        let Reached {
            masters,
            down,
            later,
        } = reach(urls, settings, &wakeups).await?;
        let up = masters.len() - down.len();
        if up < quorum {
            return Err(BackendError::msg(format!(
                "Redlock: only {up} of {} masters could be reached, a quorum is {quorum} ({})",
                urls.len(),
                down.join("; ")
            ))
            .into());
        }
        if !down.is_empty() {
            tracing::warn!(
                up,
                masters = urls.len(),
                "Redlock started without some masters; connecting them in the background: {}",
                down.join("; ")
            );
        }
        let watches = Arc::new(RedlockWatches {
            masters: masters.iter().map(|m| m.slot.clone()).collect(),
            quorum,
        });
        let inner = Inner {
            masters,
            quorum,
            timeout: settings.response_timeout,
            window: settings.fence_window.as_millis().max(1).to_string(),
            fence_script: redis::Script::new(FENCE_SCRIPT),
            read_script: redis::Script::new(READ_SCRIPT),
            boot_script: redis::Script::new(BOOT_SCRIPT),
            worker: tokio::runtime::Handle::current(),
            marker,
            longest: AtomicU64::new(0),
        };
        let redlock = Redlock {
            inner: Arc::new(inner),
        };
        redlock.open_markers().await;
        for (url, slot) in later {
            tokio::spawn(reconnect(
                url,
                settings.clone(),
                wakeups.clone(),
                slot,
                Arc::downgrade(&redlock.inner),
            ));
        }
        Ok((redlock, watches))
    }
}

/// The masters at start-up: the connected ones, the reasons of those that
/// are down, and the down ones to connect in the background.
struct Reached {
    masters: Vec<Master>,
    down: Vec<String>,
    later: Vec<(String, Arc<OnceLock<Connected>>)>,
}

/// Connects every master at once; one that is down is not fatal (the
/// caller counts them), a URL that cannot be a master is.
async fn reach(
    urls: &[String],
    settings: &ConnectSettings,
    wakeups: &Weak<dyn Wakeups>,
) -> Result<Reached, LockError> {
    type Connecting = Result<(RedisBackend, Arc<dyn Watches>), LockError>;
    let attempts: Vec<Call<'_, Connecting>> = urls
        .iter()
        .map(|url| Box::pin(connect(url, settings, wakeups.clone())) as Call<'_, _>)
        .collect();
    let mut masters = Vec::with_capacity(urls.len());
    let mut down = Vec::new();
    // The masters to connect in the background, once the rest is set up.
    let mut later = Vec::new();
    for (i, (url, outcome)) in urls
        .iter()
        .zip(gather(attempts, |_| false).await)
        .enumerate()
    {
        let slot = Arc::new(OnceLock::new());
        match outcome {
            Some(Ok((backend, watches))) => {
                load_scripts(&backend).await;
                let endpoint = backend.endpoint().to_owned();
                let _ = slot.set(Connected { backend, watches });
                masters.push(Master { endpoint, slot });
            }
            Some(Err(LockError::InvalidConfig(problem))) => {
                return Err(LockError::InvalidConfig(format!(
                    "Redlock master {} of {}: {problem}",
                    i + 1,
                    urls.len()
                )))
            }
            other => {
                down.push(match other {
                    Some(Err(error)) => reason(&error),
                    _ => "no answer".to_owned(),
                });
                later.push((url.clone(), slot.clone()));
                masters.push(Master {
                    endpoint: endpoint_of(url).unwrap_or_else(|| format!("master {}", i + 1)),
                    slot,
                });
            }
        }
    }
    Ok(Reached {
        masters,
        down,
        later,
    })
}

/// `host:port` of a URL, without credentials (`None`: unparsable; the
/// connection attempt reports that).
fn endpoint_of(url: &str) -> Option<String> {
    use redis::IntoConnectionInfo;
    url.into_connection_info()
        .ok()
        .map(|info| info.addr().to_string())
}

/// Loads `redlock_fence.lua` and the Redlock read (`read.rs`) into a
/// master's script cache, so that a write-back or a read vote goes by SHA
/// even if the call is dropped before it is answered (`redis::Script` falls
/// back to the source on `NOSCRIPT`, but only while its call is awaited,
/// and a vote still out when the majority decided is dropped). A failure
/// is left to that fallback.
async fn load_scripts(master: &RedisBackend) {
    for script in [FENCE_SCRIPT, READ_SCRIPT] {
        let loaded: redis::RedisResult<String> = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query_async(&mut master.con.clone())
            .await;
        if let Err(error) = loaded {
            tracing::debug!(%error, master = master.endpoint(), "Redlock: loading a script failed");
        }
    }
}

/// Connects, in the background, to a master that was down at start-up,
/// pausing between attempts; ends once connected or when the runtime is
/// gone. The master's boot marker is settled (`boot.rs`) before any lock
/// can use the master.
async fn reconnect(
    url: String,
    settings: ConnectSettings,
    wakeups: Weak<dyn Wakeups>,
    slot: Arc<OnceLock<Connected>>,
    redlock: Weak<Inner>,
) {
    let mut pause = RECONNECT_MIN;
    loop {
        tokio::time::sleep(pause).await;
        if wakeups.strong_count() == 0 {
            return;
        }
        if let Ok((backend, watches)) = connect(&url, &settings, wakeups.clone()).await {
            load_scripts(&backend).await;
            let Some(inner) = redlock.upgrade() else {
                return;
            };
            Redlock { inner }.open_marker(&backend).await;
            tracing::info!(master = backend.endpoint(), "Redlock: master connected");
            let _ = slot.set(Connected { backend, watches });
            return;
        }
        pause = pause.saturating_mul(2).min(RECONNECT_MAX);
    }
}
