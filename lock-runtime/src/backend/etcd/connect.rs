//! Connecting: the client's options (keep-alive, leader required, user,
//! TLS for `https://` endpoints), one answer and the default lease before
//! the runtime is handed out, and the backend's background task started.
//!
//! Owns the building of `Inner`; sends no lock's keys.

use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::lease::Leases;
use super::releaser::spawn_releaser;
use super::{tomb, wait, EtcdBackend, EtcdConfig, Inner};
use crate::backend::place_tasks::PlaceWatches;
use crate::backend::releases::{ReleaseQueue, RetriedOutage};
use crate::backend::{ConnectSettings, Wakeups, Watches};
use crate::error::{BackendError, LockError};

/// TLS for `https://` endpoints: the private CA given to the builder
/// (`tls_root_ca`), else the system's roots, and a client certificate for
/// mutual TLS if one was given. All endpoints speak TLS or none does.
#[cfg(feature = "tls")]
fn with_tls(
    options: ConnectOptions,
    endpoints: &[String],
    settings: &ConnectSettings,
) -> Result<ConnectOptions, LockError> {
    let secure = endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    if secure == 0 {
        if settings.tls_root_ca.is_some() || settings.tls_client.is_some() {
            return Err(LockError::InvalidConfig(
                "a TLS CA or client certificate is set, but no etcd endpoint is https://"
                    .to_owned(),
            ));
        }
        return Ok(options);
    }
    if secure < endpoints.len() {
        return Err(LockError::InvalidConfig(
            "etcd endpoints mix https:// and plain ones: give every member with https://"
                .to_owned(),
        ));
    }
    let mut tls = etcd_client::TlsOptions::new();
    tls = match &settings.tls_root_ca {
        Some(ca) => tls.ca_certificate(etcd_client::Certificate::from_pem(ca)),
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = &settings.tls_client {
        tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
    }
    Ok(options.with_tls(tls))
}

/// Without the `tls` feature, an `https://` endpoint is refused, naming
/// the feature.
#[cfg(not(feature = "tls"))]
fn with_tls(
    options: ConnectOptions,
    endpoints: &[String],
    _: &ConnectSettings,
) -> Result<ConnectOptions, LockError> {
    if endpoints.iter().any(|e| e.starts_with("https://")) {
        return Err(LockError::InvalidConfig(
            "an etcd endpoint is https://, but this build has no TLS: enable the feature `tls` \
             of lock-runtime"
                .to_owned(),
        ));
    }
    Ok(options)
}

/// The client's options: keep-alive, leader required, the user, TLS.
fn options(config: &EtcdConfig, settings: &ConnectSettings) -> Result<ConnectOptions, LockError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(settings.connect_timeout)
        .with_keep_alive(Duration::from_secs(2), settings.response_timeout)
        .with_keep_alive_while_idle(true)
        // A member cut off from the leader refuses requests (and cancels
        // its watches) instead of answering from its stale state.
        .with_require_leader(true);
    if let Some((user, password)) = &config.user {
        options = options.with_user(user.clone(), password.clone());
    }
    with_tls(options, &config.endpoints, settings)
}

/// Connects to etcd (and checks that it answers within the connect
/// timeout), and starts the backend's background releaser.
pub(crate) async fn connect(
    config: EtcdConfig,
    settings: &ConnectSettings,
    wakeups: Weak<dyn Wakeups>,
) -> Result<(EtcdBackend, Arc<dyn Watches>), LockError> {
    if config.endpoints.is_empty() {
        return Err(LockError::InvalidConfig(
            "etcd needs at least one endpoint (host:port)".to_owned(),
        ));
    }
    let endpoints = config.endpoints.join(",");
    let options = options(&config, settings)?;
    let shown = endpoints.clone();
    let unreachable = |error: Option<etcd_client::Error>| {
        let context = format!(
            "cannot reach etcd at {shown} within the connect timeout ({:?})",
            settings.connect_timeout
        );
        LockError::Backend(match error {
            Some(error) => BackendError::new(context, error),
            None => BackendError::msg(context),
        })
    };
    let client = tokio::time::timeout(
        settings.connect_timeout,
        Client::connect(&config.endpoints, Some(options)),
    )
    .await
    .map_err(|_| unreachable(None))?
    .map_err(|e| unreachable(Some(e)))?;
    let (releases, jobs) = ReleaseQueue::new();
    let timeout = settings.response_timeout;
    let inner = Arc::new(Inner {
        leases: Arc::new(Leases::new(
            client.lease_client(),
            timeout,
            wakeups.clone(),
            tokio::runtime::Handle::current(),
        )),
        client,
        endpoints,
        waits: wait::Waits::default(),
        releases,
        wakeups,
        timeout,
        handle: tokio::runtime::Handle::current(),
        healthy: AtomicBool::new(true),
        revision: AtomicI64::new(0),
        ping_key: format!("{}%ping", config.prefix),
        unanswered: tomb::Unanswered::default(),
        downgrading: Mutex::default(),
        release_outage: RetriedOutage::default(),
    });
    let backend = EtcdBackend { inner };
    // One answer before the runtime is handed out: a wrong address fails
    // here, not at the first lock.
    tokio::time::timeout(settings.connect_timeout, backend.ping())
        .await
        .map_err(|_| unreachable(None))?
        .map_err(LockError::Backend)?;
    tokio::time::timeout(
        settings.connect_timeout,
        backend.inner.leases.ahead(config.default_lease),
    )
    .await
    .map_err(|_| unreachable(None))?
    .map_err(LockError::Backend)?;
    spawn_releaser(&backend.inner, jobs);
    let watches = PlaceWatches::of(&backend.inner);
    Ok((backend, watches))
}
