//! The etcd backend: etcd's own lock recipe (the `concurrency` package's
//! mutex), reached over gRPC, under the same four operations as Redis.
//!
//! A lock `name` is a directory: every contender puts a key `name/<holder
//! id>` attached to this runtime's etcd lease, and the key with the lowest
//! create revision holds the lock. So the queue is fair by construction
//! (first created, first served), a holder that dies frees the lock when
//! its lease runs out, and the fencing token is the key's create revision:
//! etcd's global revision, which only grows (until a cluster is wiped or
//! restored from an old backup: then it starts again, and this backend
//! says so in a warning). `etcdctl lock name` uses the same layout (its key
//! is `name/<lease id>`), so the two exclude each other.
//!
//! - acquire: one transaction: if our key does not exist, put it (on the
//!   lease) and read the first key of the directory, else read both. Ours
//!   first: held. Otherwise our key waits in the queue and `wait.rs`
//!   watches the key before it.
//! - release: delete our key (the next key's watcher sees it).
//! - renew: a keep-alive of the lease (`lease.rs`) and one transaction of
//!   reads confirming every held key still stands with its revision, in
//!   the hold's mode (`modes.rs`).
//!
//! Read holds (`readers.rs`): a reader's key is `name/read/<holder id>`,
//! which a writer waits for like any older key; a reader holds when no
//! writer key is older than its own, and waits for the last such one.
//! A downgrade gives the holder's write key the value `r` (a reader now,
//! still before the writers queued after it, with its token): the only
//! change of a key's mode. A holder id serves one mode (`modes.rs`): an
//! attempt never turns a place of the other mode. A release deletes both
//! names of the holder: it needs no mode.
//!
//! Every lock is fair here (see `Backend::always_fair`); a try-once
//! acquire puts its key only if the directory is empty (one transaction;
//! a read: if no writer key is there, or only readers are). No token
//! block can be reserved, so holds are not passed between tasks of a
//! process (lock cohorting is off on etcd).

mod lease;
mod modes;
mod readers;
mod tomb;
mod wait;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::releases::{Job, Op, PendingReleases, ReleaseQueue};
use super::{
    Acquire, ConnectSettings, PlaceRefresh, Queue, Recorded, RecordedReader, Refreshed, Release,
    Wakeups, Watched, Watches,
};
use crate::error::{BackendError, LockError};
use crate::held::HeldLock;
use crate::mode::LockMode;
use lease::Leases;
use readers::{read_node, READER};

/// Most operations in one transaction (etcd's default `--max-txn-ops` is
/// 128).
const TXN_OPS: usize = 128;

/// After how many failed tries a background release is logged as a
/// warning (it goes on trying).
const RELEASE_ATTEMPTS: u32 = 5;

/// gRPC's status code `PERMISSION_DENIED`: etcd's answer to a call on a
/// key that no role of the user covers ("etcdserver: permission denied").
const GRPC_PERMISSION_DENIED: i32 = 7;

/// Where the etcd servers are, and who we are to them.
#[derive(Clone, Debug)]
pub(crate) struct EtcdConfig {
    /// `host:port` or `http(s)://host:port`, one per member.
    pub(crate) endpoints: Vec<String>,
    /// User name and password (etcd's own auth), if any.
    pub(crate) user: Option<(String, String)>,
    /// The runtime's key prefix: every key it reads or writes starts with
    /// it (etcd's role-based access may grant a user that range only).
    pub(crate) prefix: String,
    /// The runtime's default lease: its etcd lease is granted at connect,
    /// so that first acquires go out in the order they were made.
    pub(crate) default_lease: Duration,
}

/// The etcd name of the lock `key` under `prefix`: the two joined, with
/// every `/` of the key written `%2F` (and `%` written `%25`). A lock's
/// keys are `name/<holder>`: unescaped, the lock `a`'s directory `a/`
/// would hold the lock `a/b`'s keys too, and `a`'s waiters would queue
/// behind `a/b`'s holders. A key without `/` or `%` is its name as it is,
/// as `etcdctl lock` writes it.
pub(crate) fn lock_name(prefix: &str, key: &str) -> String {
    let mut name = String::with_capacity(prefix.len() + key.len());
    name.push_str(prefix);
    for c in key.chars() {
        match c {
            '/' => name.push_str("%2F"),
            '%' => name.push_str("%25"),
            c => name.push(c),
        }
    }
    name
}

/// The lock `name`'s directory: `name/`.
fn dir(lock: &str) -> String {
    format!("{lock}/")
}

/// The key of `holder` in the lock `name`: `name/<holder>`.
fn node(lock: &str, holder: &str) -> String {
    format!("{lock}/{holder}")
}

/// The read of a directory's first key (the holder).
fn first_of(lock: &str) -> TxnOp {
    let first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    TxnOp::get(dir(lock), Some(first))
}

/// The transaction of one attempt of `holder` at `lock` (see the module
/// docs): its key (`read`: its read key) is put on `lease` if neither of
/// its keys is there yet (`joins`: the attempt waits in the queue), or if
/// nothing keeps it out (trying once: the directory is empty, or for a
/// read, no writer key exists), and never after the holder's tombstone was
/// written (`tomb.rs`); then both keys of the holder (when not just put)
/// and what decides the hold are read: the directory's first key for a
/// write, the first writer keys for a read (`readers.rs`).
fn acquire_txn(lock: &str, holder: &str, lease: i64, joins: bool, read: bool) -> Txn {
    let (ours, other) = if read {
        (read_node(lock, holder), node(lock, holder))
    } else {
        (node(lock, holder), read_node(lock, holder))
    };
    let put = TxnOp::put(ours.clone(), "", Some(PutOptions::new().with_lease(lease)));
    let absent = |key: &str| Compare::create_revision(key, CompareOp::Equal, 0);
    let mut when = vec![
        Compare::create_revision(tomb::key(lock, holder), CompareOp::Equal, 0),
        absent(&ours),
        absent(&other),
    ];
    if !joins {
        if read {
            when.extend(readers::no_writers(lock));
        } else {
            when.push(Compare::create_revision(dir(lock), CompareOp::Equal, 0).with_prefix());
        }
    }
    let decides = if read {
        readers::first_writers(lock).to_vec()
    } else {
        vec![first_of(lock)]
    };
    let mut then = vec![put];
    then.extend(decides.iter().cloned());
    let mut otherwise = vec![TxnOp::get(ours, None), TxnOp::get(other, None)];
    otherwise.extend(decides);
    Txn::new().when(when).and_then(then).or_else(otherwise)
}

/// The key a downgrade turns into a reader: `holder`'s write key, given
/// the value `r` on its own lease, if it still stands with the hold's
/// token (its create revision).
fn downgrade_txn(lock: &str, holder: &str, token: u64) -> Txn {
    let key = node(lock, holder);
    let token = i64::try_from(token).unwrap_or(-1);
    Txn::new()
        .when([Compare::create_revision(
            key.clone(),
            CompareOp::Equal,
            token,
        )])
        .and_then([TxnOp::put(
            key,
            READER,
            Some(PutOptions::new().with_ignore_lease()),
        )])
}

/// Our key, as an attempt found or made it.
struct Own {
    /// Its name: the read key, or the write key (a reader if valued `r`).
    name: String,
    /// Its create revision: the token, and its place in the queue.
    created: i64,
    /// The lease it is on.
    lease: i64,
    /// Its value (`r`: a reader).
    value: Vec<u8>,
    /// Whether it is a reader.
    reader: bool,
    /// Made by this attempt (not a place made before).
    made: bool,
}

impl Own {
    /// A key this attempt put.
    fn made(name: String, created: i64, lease: i64, reader: bool) -> Self {
        Own {
            name,
            created,
            lease,
            value: Vec::new(),
            reader,
            made: true,
        }
    }

    /// A key that stood already.
    fn stands(name: String, kv: &etcd_client::KeyValue, reader: bool) -> Self {
        Own {
            name,
            created: kv.create_revision(),
            lease: kv.lease(),
            value: kv.value().to_vec(),
            reader,
            made: false,
        }
    }
}

/// What one transaction of an attempt found.
enum Step {
    /// Our key, and what decides whether it holds.
    Found(Own, Decide),
    /// Trying once, kept out: nothing put.
    Busy,
}

/// What decides whether our key holds.
enum Decide {
    /// It holds (a try-once read put after readers only).
    Held,
    /// The reads of `acquire_txn`: the first key of the directory (a
    /// writer holds if it is ours), or the first writer keys (a reader
    /// holds if none is older than ours).
    By(Vec<etcd_client::GetResponse>),
}

/// The etcd backend of one runtime.
#[derive(Clone, Debug)]
pub(crate) struct EtcdBackend {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    client: Client,
    /// The endpoints, for messages.
    endpoints: String,
    leases: Arc<Leases>,
    waits: wait::Waits,
    releases: ReleaseQueue<Job>,
    wakeups: Weak<dyn Wakeups>,
    timeout: Duration,
    /// The runtime's tokio runtime (tasks are spawned there, whoever polls).
    handle: tokio::runtime::Handle,
    /// The last request was answered (a failure after an answer tells the
    /// waiters that news may have been lost).
    healthy: AtomicBool,
    /// The highest revision an answer carried: a lower one means the
    /// cluster was wiped or restored.
    revision: AtomicI64,
    /// The key a ping reads: `<prefix>%ping`, inside the runtime's range and
    /// no lock's name (`lock_name` never writes `%p`).
    ping_key: String,
    /// Keys whose put went out unanswered (see `tomb.rs`).
    unanswered: tomb::Unanswered,
    /// Holders whose background downgrade is queued and not superseded
    /// by a release of theirs, as (lock, holder).
    downgrading: Mutex<HashSet<(String, String)>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.waits.stop_all();
    }
}

impl Inner {
    /// A request failed: the first failure after an answer counts as a lost
    /// connection (a watch event may have been missed meanwhile).
    fn failed(&self, error: &etcd_client::Error) {
        tracing::debug!(%error, endpoints = %self.endpoints, "etcd request failed");
        if self.healthy.swap(false, Ordering::AcqRel) {
            if let Some(wakeups) = self.wakeups.upgrade() {
                wakeups.connection_lost();
            }
        }
    }

    /// A request sent when the highest revision seen was `floor` was
    /// answered at `revision`. Only an answer below what was seen before
    /// the request went out means another history: concurrent answers may
    /// arrive in any order (a read served before a concurrent write).
    fn answered(&self, revision: i64, floor: i64) {
        self.healthy.store(true, Ordering::Release);
        self.revision.fetch_max(revision, Ordering::AcqRel);
        if revision < floor {
            let before = floor;
            // Linearizable reads never go back: this is another history.
            tracing::warn!(
                endpoints = %self.endpoints,
                revision,
                before,
                "etcd's revision went back: the cluster was wiped or restored from a backup; \
                 fencing tokens (create revisions) start again lower"
            );
            self.revision.store(revision, Ordering::Release);
            if let Some(wakeups) = self.wakeups.upgrade() {
                wakeups.connection_lost();
            }
        }
    }

    /// One transaction, bounded by the response timeout.
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, BackendError> {
        let mut kv = self.client.kv_client();
        let floor = self.revision.load(Ordering::Acquire);
        match tokio::time::timeout(self.timeout, kv.txn(txn)).await {
            Ok(Ok(answer)) => {
                self.answered(answer.header().map_or(floor, |h| h.revision()), floor);
                Ok(answer)
            }
            Ok(Err(error)) => {
                self.failed(&error);
                // A user whose roles do not cover a name of the transaction
                // is refused for good.
                let denied = matches!(&error, etcd_client::Error::GRpcStatus(status)
                    if i32::from(status.code()) == GRPC_PERMISSION_DENIED);
                Err(
                    BackendError::new(format!("etcd transaction at {}", self.endpoints), error)
                        .denied_if(denied),
                )
            }
            Err(_) => {
                self.healthy.store(false, Ordering::Release);
                Err(BackendError::msg(format!(
                    "etcd at {}: no answer within {:?}",
                    self.endpoints, self.timeout
                )))
            }
        }
    }
}

impl Inner {
    fn downgrading(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        self.downgrading
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A release of `holder` was sent: its queued downgrade, if any, says
    /// nothing of the hold any more.
    fn superseded(&self, lock: &str, holder: &str) {
        let mut downgrading = self.downgrading();
        if !downgrading.is_empty() {
            downgrading.remove(&(lock.to_owned(), holder.to_owned()));
        }
    }

    /// The answer to a background downgrade of `job`'s holder: the key gone
    /// marks `held` lost, unless a release of the holder was sent since
    /// (it may have deleted the key first). No answer leaves the hold a
    /// write hold on the server until its release: more exclusive.
    fn downgrade_answered(
        &self,
        job: &Job,
        held: &Weak<HeldLock>,
        answer: Result<bool, BackendError>,
    ) {
        let id = (job.lock_key.clone(), job.holder.clone());
        let current = self.downgrading().remove(&id);
        match answer {
            Ok(true) => {}
            Ok(false) => {
                if let Some(held) = held.upgrade().filter(|_| current) {
                    held.mark_lost();
                }
            }
            Err(error) => tracing::debug!(
                %error,
                "a background downgrade was not answered: the hold stays a write hold on \
                 etcd until its release"
            ),
        }
    }

    /// The operations deleting `holder`'s keys of `lock` (its write and
    /// its read key: a release needs no mode): with its tombstone, when a
    /// put of either went out unanswered (see `tomb.rs`) and `tombstone` is
    /// set.
    fn deletes(&self, lock: &str, holder: &str, tombstone: bool) -> Vec<TxnOp> {
        let keys = [node(lock, holder), read_node(lock, holder)];
        let lease = tombstone
            .then(|| keys.iter().find_map(|key| self.unanswered.lease_of(key)))
            .flatten();
        let mut ops: Vec<TxnOp> = keys.map(|key| TxnOp::delete(key, None)).into();
        if let Some(lease) = lease {
            let on = PutOptions::new().with_lease(lease);
            ops.push(TxnOp::put(tomb::key(lock, holder), "", Some(on)));
        }
        ops
    }

    /// Both keys of `holder` in `lock` are deleted (with a tombstone where
    /// needed): no late put of either can write anything any more.
    fn settled(&self, lock: &str, holder: &str) {
        self.unanswered.settled(&node(lock, holder));
        self.unanswered.settled(&read_node(lock, holder));
    }

    /// Deletes these holders' keys, `(lock, holder)`, in one transaction,
    /// with the tombstones they need; `true` if one was there.
    async fn delete_keys(&self, keys: &[(String, String)]) -> Result<bool, BackendError> {
        let ops = keys
            .iter()
            .flat_map(|(lock, holder)| self.deletes(lock, holder, true))
            .collect::<Vec<_>>();
        match self.txn(Txn::new().and_then(ops)).await {
            Ok(answer) => {
                for (lock, holder) in keys {
                    self.settled(lock, holder);
                }
                Ok(deleted(&answer))
            }
            // A tombstone's lease ran out (or was revoked): the late put on
            // it can write nothing now, so that key needs no tombstone. Which
            // one: key by key.
            Err(error) if tomb::lease_gone(&error) => {
                let mut any = false;
                for (lock, holder) in keys {
                    let ops = self.deletes(lock, holder, true);
                    let answer = match self.txn(Txn::new().and_then(ops)).await {
                        Err(error) if tomb::lease_gone(&error) => {
                            let ops = self.deletes(lock, holder, false);
                            self.txn(Txn::new().and_then(ops)).await?
                        }
                        answer => answer?,
                    };
                    self.settled(lock, holder);
                    any |= deleted(&answer);
                }
                Ok(any)
            }
            Err(error) => Err(error),
        }
    }
}

/// Whether a delete of the answer removed a key.
fn deleted(answer: &TxnResponse) -> bool {
    answer.op_responses().into_iter().any(|r| match r {
        TxnOpResponse::Delete(d) => d.deleted() > 0,
        _ => false,
    })
}

/// The reads of a transaction's answer, in order.
fn gets(answer: &TxnResponse) -> Vec<etcd_client::GetResponse> {
    answer
        .op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect()
}

/// The holders among a lock's keys `kvs` (its directory, oldest first):
/// the first key if it is a writer, else every reader before the first
/// writer; and whether they are readers.
fn holders<'a>(
    lock: &str,
    kvs: &'a [etcd_client::KeyValue],
) -> (&'a [etcd_client::KeyValue], bool) {
    let reader = |kv: &etcd_client::KeyValue| readers::is_reader(lock, kv.key(), kv.value());
    match kvs.first() {
        None => (kvs, false),
        Some(first) if !reader(first) => (&kvs[..1], false),
        Some(_) => {
            let count = kvs.iter().take_while(|kv| reader(kv)).count();
            (&kvs[..count], true)
        }
    }
}

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
    options = with_tls(options, &config.endpoints, settings)?;
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
    tokio::spawn(releaser(
        Arc::downgrade(&backend.inner),
        jobs,
        backend.inner.releases.pending().clone(),
    ));
    let watches: Arc<dyn Watches> = Arc::new(EtcdWatches {
        backend: Arc::downgrade(&backend.inner),
    });
    Ok((backend, watches))
}

impl EtcdBackend {
    /// For logs: `etcd at host:port,...`.
    pub(crate) fn describe(&self) -> String {
        format!("etcd at {}", self.inner.endpoints)
    }

    /// One attempt for `holder` (see the module docs); a read (`mode`)
    /// puts its read key and is decided as `readers.rs` says.
    pub(crate) async fn acquire(
        &self,
        lock: &str,
        holder: &str,
        (lease, renewed): (Duration, bool),
        queue: Queue,
        mode: LockMode,
    ) -> Result<Acquire, BackendError> {
        let read = mode.is_read();
        let on = self.inner.leases.ahead(lease).await?;
        // Waiting: our key joins the queue (or stays in it). Trying once:
        // it goes in only if nothing keeps it out.
        let joins = matches!(queue, Queue::Join(_));
        // A fixed lease ends on the server by itself: an etcd lease of its
        // own that nobody keeps alive. A waiting place stays on the kept
        // lease until it holds the lock (then it moves, below).
        let fixed = if renewed || joins {
            None
        } else {
            Some(self.inner.leases.fixed(lease).await?)
        };
        let put_on = fixed.unwrap_or(on.id);
        let (own, decide) = match self.step(lock, holder, put_on, joins, read).await? {
            Step::Found(own, decide) => (own, decide),
            Step::Busy => return Ok(Acquire::Busy { ttl: None }),
        };
        let mine = own.created;
        let held = match decide {
            Decide::Held => true,
            Decide::By(pages) if own.reader => {
                !readers::is_blocked(&self.inner, lock, &pages, mine).await?
            }
            Decide::By(pages) => pages
                .first()
                .and_then(|first| first.kvs().first())
                .is_some_and(|kv| kv.key() == own.name.as_bytes()),
        };
        let fence = u64::try_from(mine).unwrap_or(0);
        if held && !renewed && Some(own.lease) != fixed {
            // A fixed lease's place got the lock: onto a lease of its own.
            let to = self.inner.leases.fixed(lease).await?;
            self.reattach(&own.name, mine, &own.value, to).await?;
        } else if own.lease != put_on {
            // A place made with another lease length: move it onto this
            // lease (its create revision, so its place, stays), so that it
            // lives as long as this hold counts on.
            self.reattach(&own.name, mine, &own.value, put_on).await?;
        }
        if held {
            self.inner.waits.stop(lock, holder);
            return Ok(Acquire::Held {
                fence,
                upto: fence,
                handed: !own.made,
            });
        }
        if joins {
            wait::start(&self.inner, lock, holder, mine, renewed);
        }
        Ok(Acquire::Busy { ttl: None })
    }

    /// One transaction of an attempt (`acquire_txn`), and what it found.
    ///
    /// A holder id serves one mode (`modes.rs`): an attempt that finds its
    /// holder's key of the other mode changes nothing and fails, and the
    /// waiters give that place back (its keys deleted) and queue a new id.
    async fn step(
        &self,
        lock: &str,
        holder: &str,
        put_on: i64,
        joins: bool,
        read: bool,
    ) -> Result<Step, BackendError> {
        let ours = if read {
            read_node(lock, holder)
        } else {
            node(lock, holder)
        };
        let txn = acquire_txn(lock, holder, put_on, joins, read);
        let out = self.inner.unanswered.put_out(&ours, put_on);
        let answer = self.inner.txn(txn).await?;
        out.answered();
        let revision = answer.header().map_or(0, |h| h.revision());
        let mut reads = gets(&answer);
        if answer.succeeded() {
            let own = Own::made(ours, revision, put_on, read);
            return Ok(Step::Found(own, Decide::By(reads)));
        }
        if reads.len() < 2 {
            return Err(BackendError::msg("etcd answered an acquire unexpectedly"));
        }
        let pages = reads.split_off(2);
        let found = |i: usize| reads.get(i).and_then(|r| r.kvs().first());
        match modes::own_key(lock, holder, read, found(0), found(1))? {
            Some(kv) => Ok(Step::Found(Own::stands(ours, kv, read), Decide::By(pages))),
            // Waiting: neither made nor there, so the holder's tombstone
            // stands; its id is not to be used again.
            None if joins => Err(BackendError::msg(format!(
                "etcd: the holder id {holder} of {lock} was given up before; a new \
                 attempt takes a new one"
            ))),
            // A read trying once, with writer keys in the directory: if all
            // are readers (downgraded holds), it may enter after them.
            None if read && readers::blocked(lock, &pages, i64::MAX) == Some(false) => {
                self.read_after_readers(lock, holder, put_on, revision)
                    .await
            }
            // Not ours, and (trying once) something keeps it out.
            None => Ok(Step::Busy),
        }
    }

    /// A try-once read that found only readers among the writer keys (at
    /// revision `read_at`): puts its read key unless a writer key was made
    /// since (then it is busy, as if it had come a moment later).
    async fn read_after_readers(
        &self,
        lock: &str,
        holder: &str,
        put_on: i64,
        read_at: i64,
    ) -> Result<Step, BackendError> {
        let ours = read_node(lock, holder);
        let absent = |key: String| Compare::create_revision(key, CompareOp::Equal, 0);
        let mut when = vec![
            absent(tomb::key(lock, holder)),
            absent(ours.clone()),
            absent(node(lock, holder)),
        ];
        when.extend(readers::no_writers_since(lock, read_at));
        let put = TxnOp::put(
            ours.as_str(),
            "",
            Some(PutOptions::new().with_lease(put_on)),
        );
        let out = self.inner.unanswered.put_out(&ours, put_on);
        let answer = self
            .inner
            .txn(Txn::new().when(when).and_then([put]))
            .await?;
        out.answered();
        if !answer.succeeded() {
            return Ok(Step::Busy);
        }
        let revision = answer.header().map_or(0, |h| h.revision());
        Ok(Step::Found(
            Own::made(ours, revision, put_on, true),
            Decide::Held,
        ))
    }

    /// Puts `key` (created at `mine`, valued `value`) on the lease `lease`,
    /// keeping its create revision and value. Not if its value changed
    /// meanwhile (a downgrade): the next renewal moves it.
    async fn reattach(
        &self,
        key: &str,
        mine: i64,
        value: &[u8],
        lease: i64,
    ) -> Result<(), BackendError> {
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, mine),
                Compare::value(key, CompareOp::Equal, value),
            ])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        // A compare that fails means the key is gone (its lease expired, or
        // it was deleted): the hold it was to carry does not exist.
        if self.inner.txn(txn).await?.succeeded() {
            Ok(())
        } else {
            Err(BackendError::msg(format!(
                "etcd: the key {key} was gone (or changed) when it was moved to its lease"
            )))
        }
    }

    /// Deletes `holder`'s keys of `lock` (write and read: whichever it
    /// has). A background downgrade of the holder still queued is
    /// superseded: its answer no longer says anything of the hold.
    pub(crate) async fn release(
        &self,
        lock: &str,
        holder: &str,
        fair: bool,
    ) -> Result<Release, BackendError> {
        self.inner.waits.stop(lock, holder);
        self.inner.superseded(lock, holder);
        let deleted = match self
            .inner
            .delete_keys(&[(lock.to_owned(), holder.to_owned())])
            .await
        {
            Ok(deleted) => deleted,
            Err(error) => {
                // The key would outlive this failure: the runtime's lease is
                // kept alive. The background releaser tries until etcd
                // answers.
                self.release_in_background(lock.to_owned(), holder.to_owned(), fair);
                return Err(error);
            }
        };
        Ok(if deleted {
            Release::Freed
        } else {
            Release::NotHeld
        })
    }

    /// Turns the write hold `held` into a read hold: its key keeps its
    /// name, lease and create revision (its token and its place before the
    /// writers queued after it) and takes the value `r`, which readers
    /// skip. `false`: the key is gone (the hold is lost).
    pub(crate) async fn downgrade(&self, held: &HeldLock) -> Result<bool, BackendError> {
        let txn = downgrade_txn(&held.lock_key, &held.holder, held.fence());
        Ok(self.inner.txn(txn).await?.succeeded())
    }

    /// Queues [`downgrade`](Self::downgrade) of `held` with the background
    /// releases, ahead of any later release of the holder (see `releaser`).
    pub(crate) fn downgrade_in_background(&self, held: &Arc<HeldLock>) {
        let (lock, holder) = (held.lock_key.clone(), held.holder.clone());
        self.inner
            .downgrading()
            .insert((lock.clone(), holder.clone()));
        let job = Job {
            lock_key: lock.clone(),
            holder,
            op: Op::Downgrade(Arc::downgrade(held)),
        };
        if !self.inner.releases.send_job(&lock, job) {
            tracing::debug!("lock runtime stopped; a downgrade is not sent");
        }
    }

    /// One read of a key.
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let txn = Txn::new().and_then([TxnOp::get(self.inner.ping_key.as_str(), None)]);
        self.inner.txn(txn).await.map(drop)
    }

    /// The holders, their leases' remaining TTLs, and the queue: the first
    /// key if it is a writer, else every reader before the first writer
    /// (`holders`); the other keys are queued.
    pub(crate) async fn inspect(&self, lock: &str) -> Result<Option<Recorded>, BackendError> {
        let all = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let txn = Txn::new().and_then([TxnOp::get(dir(lock), Some(all))]);
        let answer = self.inner.txn(txn).await?;
        let reads = gets(&answer);
        let Some(kvs) = reads.first().map(|r| r.kvs()) else {
            return Ok(None);
        };
        let (holding, reading) = holders(lock, kvs);
        let Some(first) = holding.first() else {
            return Ok(None);
        };
        let skip = dir(lock).len();
        let name = |key: &[u8]| {
            let name = key.get(skip..).unwrap_or(key);
            let name = name.strip_prefix(b"read/".as_slice()).unwrap_or(name);
            String::from_utf8_lossy(name).into_owned()
        };
        let queue = kvs[holding.len()..]
            .iter()
            .map(|kv| name(kv.key()))
            .collect();
        if !reading {
            return Ok(Some(Recorded {
                holder: name(first.key()),
                holds: 1,
                remaining: self.remaining(first.lease()).await,
                fence: u64::try_from(first.create_revision()).ok(),
                queue,
                mode: LockMode::Write,
                readers: Vec::new(),
            }));
        }
        let mut readers = Vec::with_capacity(holding.len());
        let mut ttls: Vec<(i64, Option<Duration>)> = Vec::new();
        for kv in holding {
            let remaining = match ttls.iter().find(|(lease, _)| *lease == kv.lease()) {
                Some((_, remaining)) => *remaining,
                None => {
                    let remaining = self.remaining(kv.lease()).await;
                    ttls.push((kv.lease(), remaining));
                    remaining
                }
            };
            readers.push(RecordedReader {
                holder: name(kv.key()),
                remaining,
                fence: u64::try_from(kv.create_revision()).ok(),
            });
        }
        // The reader a writer waits for: the one whose lease ends last.
        let last = readers
            .iter()
            .max_by_key(|r| r.remaining)
            .cloned()
            .unwrap_or_else(|| readers[0].clone());
        Ok(Some(Recorded {
            holder: last.holder,
            holds: 1,
            remaining: last.remaining,
            fence: last.fence,
            queue,
            mode: LockMode::Read,
            readers,
        }))
    }

    /// The remaining TTL of `lease` (`None`: unknown, or no answer).
    async fn remaining(&self, lease: i64) -> Option<Duration> {
        let mut leases = self.inner.client.lease_client();
        match tokio::time::timeout(self.inner.timeout, leases.time_to_live(lease, None)).await {
            Ok(Ok(ttl)) if ttl.ttl() >= 0 => {
                Some(Duration::from_secs(u64::try_from(ttl.ttl()).unwrap_or(0)))
            }
            _ => None,
        }
    }

    /// Deletes the holders' keys (see `holders`), whoever they are; `true`
    /// when there was one.
    pub(crate) async fn force_unlock(&self, lock: &str) -> Result<bool, BackendError> {
        let all = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let answer = self
            .inner
            .txn(Txn::new().and_then([TxnOp::get(dir(lock), Some(all))]))
            .await?;
        let reads = gets(&answer);
        let Some(kvs) = reads.first().map(|r| r.kvs()) else {
            return Ok(false);
        };
        let (holding, _) = holders(lock, kvs);
        if holding.is_empty() {
            return Ok(false);
        }
        let (when, delete): (Vec<Compare>, Vec<TxnOp>) = holding
            .iter()
            .take(TXN_OPS)
            .map(|kv| {
                let key = kv.key().to_vec();
                (
                    Compare::create_revision(key.clone(), CompareOp::Equal, kv.create_revision()),
                    TxnOp::delete(key, None),
                )
            })
            .unzip();
        Ok(self
            .inner
            .txn(Txn::new().when(when).and_then(delete))
            .await?
            .succeeded())
    }

    /// Queues the deletion of `holder`'s keys of `lock`.
    pub(crate) fn release_in_background(&self, lock: String, holder: String, fair: bool) {
        self.inner.waits.stop(&lock, &holder);
        self.inner.superseded(&lock, &holder);
        let job = Job {
            lock_key: lock.clone(),
            holder,
            op: Op::Release { fair },
        };
        if !self.inner.releases.send_job(&lock, job) {
            tracing::debug!("lock runtime stopped; a lock will be freed by its etcd lease");
        }
    }

    /// The background releases not yet answered.
    pub(crate) fn pending(&self) -> &Arc<PendingReleases> {
        self.inner.releases.pending()
    }

    /// Keeps the leases of `batch` alive and confirms that every key still
    /// stands with its create revision, in the hold's mode (see the module
    /// docs).
    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        let sent = Instant::now();
        let keeping = self.keep_alive_for(batch.iter().map(|l| l.lease));
        let mut outcome = Vec::with_capacity(batch.len());
        let reading = async {
            let mut found = Vec::with_capacity(batch.len());
            // (Both keys of each holder: a hold is its write key, its read
            // key, or a write key made a reader.)
            for chunk in batch.chunks(TXN_OPS / 2) {
                let reads = chunk.iter().flat_map(|l| {
                    [
                        TxnOp::get(node(&l.lock_key, &l.holder), None),
                        TxnOp::get(read_node(&l.lock_key, &l.holder), None),
                    ]
                });
                let answer = self
                    .inner
                    .txn(Txn::new().and_then(reads.collect::<Vec<_>>()))
                    .await?;
                let reads = gets(&answer);
                for (lock, pair) in chunk.iter().zip(reads.chunks(2)) {
                    let fence = i64::try_from(lock.fence()).unwrap_or(-1);
                    // The hold's mode as of the answer (a downgrade turns it
                    // read before it is sent): a write hold stands only on a
                    // key that is still a writer (`modes.rs`).
                    let mode = lock.mode();
                    let (names, kvs) = (
                        [
                            (node(&lock.lock_key, &lock.holder), false),
                            (read_node(&lock.lock_key, &lock.holder), true),
                        ],
                        pair.iter().map(|g| g.kvs().first()),
                    );
                    found.push(names.into_iter().zip(kvs).find_map(|((name, read), kv)| {
                        kv.filter(|kv| {
                            kv.create_revision() == fence && modes::carries(mode, read, kv.value())
                        })
                        .map(|kv| (name, kv.lease(), kv.value().to_vec()))
                    }));
                }
            }
            Ok::<_, BackendError>(found)
        };
        let ((), found) = tokio::join!(keeping, reading);
        let found = found?;
        for (lock, kv) in batch.iter().zip(found) {
            outcome.push(match kv {
                None => Some(false),
                Some((_, lease, _))
                    if self.inner.leases.confirmed_until(lease, sent + lock.lease) =>
                {
                    Some(true)
                }
                // On a lease too short for this hold (a place queued by a
                // sibling with a shorter lease, handed to this one): moved
                // onto the hold's own lease, then confirmed at the next
                // renewal; unknown until then.
                Some((key, _, value)) => {
                    if let Ok(own) = self.inner.leases.ahead(lock.lease).await {
                        let mine = i64::try_from(lock.fence()).unwrap_or(-1);
                        let _ = self.reattach(&key, mine, &value, own.id).await;
                    }
                    None
                }
            });
        }
        Ok(outcome)
    }

    /// One keep-alive of each lease that locks of these lease lengths use
    /// (failures show as leases not confirmed).
    async fn keep_alive_for(&self, leases: impl Iterator<Item = Duration>) {
        let mut ttls: Vec<u64> = leases.map(lease::ttl_secs).collect();
        ttls.sort_unstable();
        ttls.dedup();
        let all = self.inner.leases.all();
        let keeping = all
            .iter()
            .filter(|l| ttls.contains(&l.ttl_secs()))
            .map(|l| self.inner.leases.keep_alive_or_forget(l));
        futures_util::future::join_all(keeping).await;
    }

    /// Confirms fair places: each key still queued (standing, not first)
    /// on a lease confirmed for the place's handoff lease.
    pub(crate) async fn refresh_places(
        &self,
        batch: &[PlaceRefresh],
    ) -> Result<Vec<Option<Refreshed>>, BackendError> {
        let sent = Instant::now();
        let mut outcome = Vec::with_capacity(batch.len());
        // Per place: its two keys, the directory's first key (a writer's
        // turn) and the first writer keys (a reader's).
        for chunk in batch.chunks(TXN_OPS / 5) {
            let reads: Vec<TxnOp> = chunk
                .iter()
                .flat_map(|p| {
                    let [writers, after] = readers::first_writers(&p.lock_key);
                    [
                        TxnOp::get(node(&p.lock_key, &p.holder), None),
                        TxnOp::get(read_node(&p.lock_key, &p.holder), None),
                        first_of(&p.lock_key),
                        writers,
                        after,
                    ]
                })
                .collect();
            let answer = self.inner.txn(Txn::new().and_then(reads)).await?;
            let reads = gets(&answer);
            for (place, five) in chunk.iter().zip(reads.chunks(5)) {
                let [write, read, first, pages @ ..] = five else {
                    outcome.push(None);
                    continue;
                };
                let lock = place.lock_key.as_str();
                let own = write.kvs().first().or_else(|| read.kvs().first());
                let refreshed = match own {
                    None => Some(Refreshed {
                        queued: false,
                        lock_ttl: -2,
                    }),
                    Some(kv)
                        if if readers::is_reader(lock, kv.key(), kv.value()) {
                            readers::blocked(lock, pages, kv.create_revision()) == Some(false)
                        } else {
                            first.kvs().first().is_some_and(|f| f.key() == kv.key())
                        } =>
                    {
                        Some(Refreshed {
                            queued: false,
                            lock_ttl: -1,
                        })
                    }
                    Some(kv) => self
                        .inner
                        .leases
                        .confirmed_until(kv.lease(), sent + place.lease)
                        .then_some(Refreshed {
                            queued: true,
                            lock_ttl: -1,
                        }),
                };
                outcome.push(refreshed);
            }
        }
        Ok(outcome)
    }
}

/// Deletes the keys of dropped guards, cancelled acquires, failed releases
/// and unused places, in transactions of many. Unlike on Redis, a key whose
/// delete fails does not end by itself (the runtime's lease is kept alive
/// for its other keys), so a batch is tried until etcd answers, backing
/// off, for as long as the runtime lives; an outage is logged once per
/// batch, not per try. (A delete refused for lack of a permission is given
/// up: see [`release_batch`].)
///
/// Downgrades of dropped guards come through here too, so that each is
/// sent before any release of its holder queued after it: a batch's
/// downgrades are answered (or time out, once: the hold then stays a
/// write hold, more exclusive) before its releases go out and before the
/// next batch is taken. A downgrade whose holder is released in the same
/// batch is not sent. (A release awaited by its caller does not queue: it
/// may overtake a queued downgrade, which then finds no key and changes
/// nothing, and its answer is ignored, see `Inner::superseded`.)
async fn releaser(
    inner: Weak<Inner>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    pending: Arc<PendingReleases>,
) {
    // (A third of a transaction of holders: each has two keys, and may
    // bring its tombstone.)
    const BATCH: usize = TXN_OPS / 3;
    let mut batch = Vec::with_capacity(BATCH);
    while jobs.recv_many(&mut batch, BATCH).await > 0 {
        let batch = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
        let mut keys: Vec<(String, String)> = batch
            .iter()
            .filter(|job| matches!(job.op, Op::Release { .. }))
            .map(|job| (job.lock_key.clone(), job.holder.clone()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let downgrades: Vec<(&Job, &Weak<HeldLock>)> = batch
            .iter()
            .filter_map(|job| match &job.op {
                Op::Downgrade(held) => Some((job, held)),
                Op::Release { .. } => None,
            })
            .collect();
        if !downgrades.is_empty() {
            if let Some(backend) = inner.upgrade() {
                let sent = downgrades.iter().filter(|(job, _)| {
                    let id = (job.lock_key.clone(), job.holder.clone());
                    keys.binary_search(&id).is_err()
                });
                // (A hold gone here was released: nothing to downgrade.)
                let answered = sent
                    .filter_map(|(job, held)| Some((job, held, held.upgrade()?.fence())))
                    .map(|(job, held, token)| {
                        let backend = &backend;
                        async move {
                            let txn = downgrade_txn(&job.lock_key, &job.holder, token);
                            let answer = backend.txn(txn).await;
                            backend.downgrade_answered(job, held, answer.map(|a| a.succeeded()));
                        }
                    });
                futures_util::future::join_all(answered).await;
            }
            pending.done(downgrades.iter().map(|(job, _)| job.lock_key.as_str()));
        }
        if keys.is_empty() {
            continue;
        }
        // Each holder's keys with the lock names of its jobs (each counted
        // as pending).
        let jobs: Vec<((String, String), Vec<String>)> = keys
            .into_iter()
            .map(|key| {
                let of_key = batch.iter().filter(|job| {
                    matches!(job.op, Op::Release { .. })
                        && job.lock_key == key.0
                        && job.holder == key.1
                });
                let names = of_key.map(|job| job.lock_key.clone()).collect();
                (key, names)
            })
            .collect();
        tokio::spawn(release_batch(inner.clone(), jobs, pending.clone()));
    }
}

/// How a background delete ended.
#[derive(Clone, Copy)]
enum Deleted {
    /// etcd answered (or the runtime is gone, and its lease with it).
    Answered,
    /// Refused for lack of a permission: it would be refused again.
    Refused,
}

/// Deletes the holders of `jobs` in one transaction, then marks their jobs
/// answered. A transaction refused for lack of a permission is tried again
/// holder by holder, so that one refused key does not keep the others: a
/// holder refused alone is given up (its put was most likely refused
/// too; a key it did put stays until this runtime's etcd lease ends).
async fn release_batch(
    inner: Weak<Inner>,
    jobs: Vec<((String, String), Vec<String>)>,
    pending: Arc<PendingReleases>,
) {
    let keys: Vec<(String, String)> = jobs.iter().map(|(key, _)| key.clone()).collect();
    let outcomes = match delete_until_answered(&inner, &keys).await {
        Deleted::Refused if keys.len() > 1 => {
            let alone = keys.chunks(1).map(|key| delete_until_answered(&inner, key));
            futures_util::future::join_all(alone).await
        }
        outcome => vec![outcome; keys.len()],
    };
    for ((_, names), outcome) in jobs.iter().zip(outcomes) {
        let names = names.iter().map(String::as_str);
        match outcome {
            Deleted::Answered => pending.done(names),
            Deleted::Refused => pending.given_up(names),
        }
    }
}

/// Deletes `keys` in one transaction, tried until etcd answers, backing
/// off, for as long as the runtime lives; an outage is logged once, not
/// per try.
async fn delete_until_answered(inner: &Weak<Inner>, keys: &[(String, String)]) -> Deleted {
    let mut backoff = Duration::from_millis(50);
    let mut tries = 0u32;
    loop {
        let Some(backend) = inner.upgrade() else {
            return Deleted::Answered; // the runtime is gone: so is its lease, soon
        };
        match backend.delete_keys(keys).await {
            Ok(_) => return Deleted::Answered,
            Err(error) if error.is_permission_denied() => {
                if let [(lock, _)] = keys {
                    tracing::warn!(
                        %error,
                        lock,
                        "background release refused for lack of a permission: given up"
                    );
                }
                return Deleted::Refused;
            }
            Err(error) => {
                tries += 1;
                if tries == RELEASE_ATTEMPTS {
                    tracing::warn!(
                        %error,
                        locks = keys.len(),
                        "background release failed; retrying until etcd answers"
                    );
                } else {
                    tracing::debug!(%error, "background release failed; retrying");
                }
            }
        }
        drop(backend);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// The waiters' side: the per-place watches start with the acquire that
/// queued the place, so a lock's watch is ready at once; an unused place's
/// key is deleted.
#[derive(Debug)]
struct EtcdWatches {
    backend: Weak<Inner>,
}

impl Watches for EtcdWatches {
    fn watch(&self, _lock: &str, watched: Arc<dyn Watched>) {
        watched.set_ready();
    }

    fn unwatch(&self, _lock: &str) {}

    fn give_back_place(&self, lock: String, holder: String) {
        if let Some(inner) = self.backend.upgrade() {
            EtcdBackend { inner }.release_in_background(lock, holder, true);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use std::sync::Weak;
    use std::time::Duration;

    use super::{acquire_txn, connect, lock_name, node, tomb, ConnectSettings, EtcdBackend};
    use super::{EtcdConfig, Wakeups};

    /// Waiters nobody has: these tests call the backend directly.
    struct Nobody;

    impl Wakeups for Nobody {
        fn released(&self, _: &str) {}
        fn handed_over(&self, _: &str, _: &str, _: u64, _: u64) {}
        fn connection_lost(&self) {}
    }

    const LEASE: Duration = Duration::from_secs(3);

    async fn backend(cluster: &lock_testkit::etcd::EtcdCluster) -> EtcdBackend {
        let settings = ConnectSettings {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(2),
            tls_root_ca: None,
            tls_client: None,
            fence_window: Duration::from_secs(60),
            fence_reserve: 0,
        };
        let config = EtcdConfig {
            endpoints: cluster.endpoints(),
            user: None,
            prefix: "lock:".to_owned(),
            default_lease: LEASE,
        };
        let nobody: Weak<dyn Wakeups> = Weak::<Nobody>::new();
        connect(config, &settings, nobody).await.unwrap().0
    }

    /// What etcd holds under `key` now.
    async fn stands(backend: &EtcdBackend, key: &str) -> bool {
        let mut kv = backend.inner.client.kv_client();
        !kv.get(key, None).await.unwrap().kvs().is_empty()
    }

    /// A put that went out unanswered, given up (its key deleted), and then
    /// applied by etcd after the delete (etcd applies one process's calls
    /// in any order) writes nothing: the key stays gone, not left on a
    /// lease this runtime keeps alive, where it would block the lock for
    /// good. Both for a waiting attempt and for a try-once one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_put_applied_after_the_delete_of_its_key_writes_nothing() {
        let cluster = lock_testkit::etcd::EtcdCluster::start(1);
        let backend = backend(&cluster).await;
        let lease = backend.inner.leases.ahead(LEASE).await.unwrap().id;
        for (holder, joins) in [("waiting", true), ("trying", false)] {
            let lock = format!("late-put-{holder}");
            let key = node(&lock, holder);
            // The attempt's put goes out; its answer never comes.
            drop(backend.inner.unanswered.put_out(&key, lease));
            // Given up: its key is deleted (the put has not arrived yet) ...
            backend.release(&lock, holder, true).await.unwrap();
            // ... and then the put arrives.
            let mut kv = backend.inner.client.kv_client();
            let late = kv
                .txn(acquire_txn(&lock, holder, lease, joins, false))
                .await
                .unwrap();
            assert!(!late.succeeded(), "{holder}: the late put was applied");
            assert!(!stands(&backend, &key).await, "{holder}: {key} stands");
            assert!(backend.inspect(&lock).await.unwrap().is_none());
            // The lock itself is free for everyone else.
            let other = acquire_txn(&lock, "another", lease, joins, false);
            assert!(kv.txn(other).await.unwrap().succeeded());
            backend.release(&lock, "another", true).await.unwrap();
        }
    }

    /// A put that was answered leaves no tombstone behind when its key is
    /// deleted (tombstones are for unanswered puts only: one key per lock
    /// call would pile up on the runtime's lease).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answered_put_leaves_no_tombstone() {
        let cluster = lock_testkit::etcd::EtcdCluster::start(1);
        let backend = backend(&cluster).await;
        let lock = "answered";
        let acquired = backend
            .acquire(
                lock,
                "h",
                (LEASE, true),
                super::Queue::Join(LEASE),
                super::LockMode::Write,
            )
            .await
            .unwrap();
        assert!(matches!(acquired, super::Acquire::Held { .. }));
        backend.release(lock, "h", true).await.unwrap();
        assert!(!stands(&backend, &node(lock, "h")).await);
        assert!(!stands(&backend, &tomb::key(lock, "h")).await);
    }

    /// When the lease an unanswered put named is gone, the put can write
    /// nothing any more (etcd refuses a put on a lease it does not know):
    /// the delete goes through without a tombstone, and the key is no
    /// longer counted as unanswered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_whose_tombstone_lease_is_gone_still_deletes() {
        let cluster = lock_testkit::etcd::EtcdCluster::start(1);
        let backend = backend(&cluster).await;
        let mut leases = backend.inner.client.lease_client();
        let gone = leases.grant(5, None).await.unwrap().id();
        leases.revoke(gone).await.unwrap();
        let (lock, holder) = ("gone-lease", "h");
        let key = node(lock, holder);
        let mut kv = backend.inner.client.kv_client();
        kv.put(key.as_str(), "", None).await.unwrap();
        drop(backend.inner.unanswered.put_out(&key, gone));
        backend.release(lock, holder, true).await.unwrap();
        assert!(!stands(&backend, &key).await);
        assert_eq!(backend.inner.unanswered.lease_of(&key), None);
        let late = kv.txn(acquire_txn(lock, holder, gone, true, false)).await;
        assert!(late.is_err(), "a put on a revoked lease was applied");
        assert!(!stands(&backend, &key).await);
    }

    /// The key `key` as etcd holds it now: (create revision, value).
    async fn key_of(backend: &EtcdBackend, key: &str) -> Option<(i64, Vec<u8>)> {
        let mut kv = backend.inner.client.kv_client();
        let got = kv.get(key, None).await.unwrap();
        got.kvs()
            .first()
            .map(|kv| (kv.create_revision(), kv.value().to_vec()))
    }

    /// A holder id serves one mode: an attempt of the other mode with a
    /// holder id whose key stands is refused and changes nothing (a
    /// writer's key is not made a reader, a reader's key is not deleted),
    /// and the key then holds in its own mode with its own token.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holder_id_never_serves_two_modes() {
        use super::{read_node, Acquire, LockMode, Queue};
        let cluster = lock_testkit::etcd::EtcdCluster::start(1);
        let backend = backend(&cluster).await;
        let (join, renewed) = (Queue::Join(LEASE), (LEASE, true));
        let busy = Acquire::Busy { ttl: None };
        for (lock, mode, other) in [
            ("writer-place", LockMode::Write, LockMode::Read),
            ("reader-place", LockMode::Read, LockMode::Write),
        ] {
            let held = backend.acquire(lock, "w", renewed, join, LockMode::Write);
            assert!(matches!(held.await.unwrap(), Acquire::Held { .. }));
            let place = backend.acquire(lock, "p", renewed, join, mode);
            assert_eq!(place.await.unwrap(), busy, "{lock}");
            let key = match mode {
                LockMode::Read => read_node(lock, "p"),
                _ => node(lock, "p"),
            };
            let before = key_of(&backend, &key).await.unwrap();
            let refused = backend.acquire(lock, "p", renewed, join, other).await;
            assert!(refused.is_err(), "{lock}: {refused:?}");
            assert_eq!(key_of(&backend, &key).await, Some(before.clone()), "{lock}");
            let other_key = match mode {
                LockMode::Read => node(lock, "p"),
                _ => read_node(lock, "p"),
            };
            assert_eq!(key_of(&backend, &other_key).await, None, "{lock}");
            backend.release(lock, "w", true).await.unwrap();
            let token = u64::try_from(before.0).unwrap();
            let held = backend
                .acquire(lock, "p", renewed, join, mode)
                .await
                .unwrap();
            assert!(
                matches!(held, Acquire::Held { fence, .. } if fence == token),
                "{lock}: {held:?}"
            );
            backend.release(lock, "p", true).await.unwrap();
        }
    }

    /// A write hold is renewed only while its key is a writer: a key made
    /// a reader under it (by anything but its own downgrade, which turns
    /// the hold read first) lets readers in, so the hold is reported lost.
    /// A read hold stands on its key either way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_hold_whose_key_turned_reader_is_not_renewed() {
        use super::{downgrade_txn, Acquire, LockMode, Queue};
        use crate::held::{HeldLock, Hold};
        let cluster = lock_testkit::etcd::EtcdCluster::start(1);
        let backend = backend(&cluster).await;
        let lock = "turned";
        let held = backend
            .acquire(
                lock,
                "h",
                (LEASE, true),
                Queue::Join(LEASE),
                LockMode::Write,
            )
            .await
            .unwrap();
        let Acquire::Held { fence, .. } = held else {
            panic!("not held: {held:?}");
        };
        let hold = |mode| {
            HeldLock::new(Hold {
                key: lock.to_owned(),
                lock_key: lock.to_owned(),
                holder: "h".to_owned(),
                owner: 0,
                fence,
                upto: fence,
                since: tokio::time::Instant::now(),
                epoch: 0,
                lease: LEASE,
                renew: true,
                fair: true,
                mode,
            })
        };
        let (write, read) = (hold(LockMode::Write), hold(LockMode::Read));
        let both = [write.clone(), read.clone()];
        let renewed = backend.renew_many(&both).await.unwrap();
        assert_eq!(renewed, [Some(true), Some(true)]);
        let turned = backend.inner.txn(downgrade_txn(lock, "h", fence)).await;
        assert!(turned.unwrap().succeeded());
        let renewed = backend.renew_many(&both).await.unwrap();
        assert_eq!(renewed, [Some(false), Some(true)], "write, read");
        backend.release(lock, "h", true).await.unwrap();
    }

    #[test]
    fn no_lock_name_is_inside_another_locks_directory() {
        assert_eq!(lock_name("", "order:42"), "order:42");
        assert_eq!(lock_name("lock:", "a/b"), "lock:a%2Fb");
        assert_eq!(lock_name("", "100%/x"), "100%25%2Fx");
        let (a, nested) = (lock_name("p/", "a"), lock_name("p/", "a/b"));
        assert!(!nested.starts_with(&format!("{a}/")), "{nested} under {a}/");
        assert_ne!(lock_name("", "a%2Fb"), lock_name("", "a/b"));
    }
}
