//! A queued place's turn: each place of this process in a lock's queue
//! (its key, waiting behind older keys) watches the key just before it in
//! create-revision order, never the whole directory, so a release wakes
//! one process, not every waiter.
//!
//! When that key is deleted (released, or its lease ran out), the place
//! reads again, in one transaction, its own key and the key now before it:
//! a new predecessor is watched in turn; none means the lock is the
//! place's, and the waiters are told it was handed over. This read is the
//! check the Jepsen analysis of etcd 3.4 asked for: the lock is only
//! claimed after the server confirmed, after the predecessor's delete, that
//! the place's own key still stands (etcd's own Lock RPC could grant a lock
//! whose lease had expired, etcd#11456). A place whose key is gone (its
//! lease lost, a force-unlock) tells its waiters the key was released: the
//! next attempt queues it again.

use std::sync::Weak;
use std::time::Duration;

use etcd_client::{EventType, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};

use super::{dir, node, Inner};

/// Pause after a failed read or watch (doubling up to [`BACKOFF_MAX`]).
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The places being waited for, by (lock, holder id).
pub(super) use crate::backend::place_tasks::PlaceTasks as Waits;

/// Starts watching for the turn of `holder`'s key in `lock` (created at
/// revision `mine`), unless that is watched already.
///
/// A place of a fixed-lease hold (`renewed` false) is not handed the lock
/// from here: its waiter is woken to claim it with an attempt, which moves
/// the key onto a lease of its own.
pub(super) fn start(
    inner: &std::sync::Arc<Inner>,
    lock: &str,
    holder: &str,
    mine: i64,
    renewed: bool,
) {
    inner.waits.start(&inner.handle, lock, holder, || {
        let (lock, holder) = (lock.to_owned(), holder.to_owned());
        wait_turn(
            std::sync::Arc::downgrade(inner),
            lock,
            holder,
            mine,
            renewed,
        )
    });
}

/// What the read after a change found.
enum Found {
    /// Our key is gone (or was made again since: another place's now).
    Gone,
    /// No older key: the lock is ours.
    First,
    /// This key, created at this revision, is just before ours; the read
    /// was at the second revision.
    Behind(Vec<u8>, i64, i64),
}

/// Waits for the turn of `holder`'s key in `lock`, created at revision
/// `mine`; tells the waiters when it comes, or when the key is gone.
async fn wait_turn(inner: Weak<Inner>, lock: String, holder: String, mine: i64, renewed: bool) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let Some(backend) = inner.upgrade() else {
            return;
        };
        let found = match read(&backend, &lock, &holder, mine).await {
            Ok(found) => found,
            Err(()) => {
                drop(backend);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let ((before, created), read_at) = match found {
            Found::Gone => {
                backend.waits.ended(&lock, &holder);
                if let Some(wakeups) = backend.wakeups.upgrade() {
                    wakeups.released(&lock);
                }
                return;
            }
            Found::First => {
                backend.waits.ended(&lock, &holder);
                if let Some(wakeups) = backend.wakeups.upgrade() {
                    let fence = u64::try_from(mine).unwrap_or(0);
                    if renewed {
                        wakeups.handed_over(&lock, &holder, fence, fence);
                    } else {
                        wakeups.released(&lock);
                    }
                }
                return;
            }
            Found::Behind(before, created, read_at) => ((before, created), read_at),
        };
        let ours = node(&lock, &holder);
        match deleted(&backend, (&before, created), (&ours, mine), read_at).await {
            Ok(()) => backoff = BACKOFF_MIN,
            Err(()) => {
                drop(backend);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// Reads our key and the key just before it, in one transaction.
async fn read(backend: &Inner, lock: &str, holder: &str, mine: i64) -> Result<Found, ()> {
    let ours = node(lock, holder);
    let before = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(mine - 1)
        .with_limit(1);
    let txn = Txn::new().and_then([
        TxnOp::get(ours.clone(), None),
        TxnOp::get(dir(lock), Some(before)),
    ]);
    let answer = backend.txn(txn).await.map_err(|_| ())?;
    let read_at = answer.header().map_or(0, |h| h.revision());
    let mut gets = answer.op_responses().into_iter().filter_map(|r| match r {
        TxnOpResponse::Get(get) => Some(get),
        _ => None,
    });
    let (Some(own), Some(older)) = (gets.next(), gets.next()) else {
        return Err(());
    };
    let still = own
        .kvs()
        .first()
        .is_some_and(|kv| kv.create_revision() == mine);
    if !still {
        return Ok(Found::Gone);
    }
    Ok(match older.kvs().first() {
        None => Found::First,
        Some(kv) => Found::Behind(kv.key().to_vec(), kv.create_revision(), read_at),
    })
}

/// Resolves when the key `before` (created at the given revision) or our
/// key (created at `mine`) is deleted, at once if either is gone or made
/// again already, or with `Err` when the watch failed. Both stood in the
/// read at revision `read_at`.
///
/// The watch starts "now", at the revision its creation reports; if the
/// store moved on since `read_at`, the two keys are read again once the
/// watch is in place: a delete before that read shows in the read, one
/// after it in the watch.
/// (A watch from a past revision would do with one round trip less, but
/// etcd serves such a watch only from its next catch-up pass, up to 100 ms
/// later, and under contention the revision has always moved on.)
async fn deleted(
    backend: &Inner,
    before: (&[u8], i64),
    ours: (&str, i64),
    read_at: i64,
) -> Result<(), ()> {
    let ((before, theirs), (ours, mine)) = (before, ours);
    let mut client = backend.client.watch_client();
    let opened = tokio::time::timeout(backend.timeout, async {
        let mut stream = client.watch(before.to_vec(), None).await?;
        stream.watch(ours.to_owned(), None).await?;
        let (mut created, mut from) = (0, 0);
        while created < 2 {
            let Some(answer) = stream.message().await? else {
                return Ok(None);
            };
            if answer.canceled() || !answer.events().is_empty() {
                return Ok(None);
            }
            created += usize::from(answer.created());
            from = from.max(answer.header().map_or(i64::MAX, |h| h.revision()));
        }
        Ok::<_, etcd_client::Error>(Some((stream, from)))
    });
    let (mut stream, from) = match opened.await {
        Ok(Ok(Some(opened))) => opened,
        // A change (or a refusal) while the watch was set up: read again.
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(error)) => {
            backend.failed(&error);
            return Err(());
        }
        Err(_) => return Err(()),
    };
    if from > read_at && !still_stand(backend, (before, theirs), (ours, mine)).await? {
        return Ok(());
    }
    loop {
        let message = stream.message().await.map_err(|e| backend.failed(&e))?;
        let Some(answer) = message else {
            return Err(());
        };
        if answer.canceled()
            || answer
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
        {
            return Ok(());
        }
    }
}

/// Whether both keys still stand with their create revisions (one read).
async fn still_stand(
    backend: &Inner,
    (before, theirs): (&[u8], i64),
    (ours, mine): (&str, i64),
) -> Result<bool, ()> {
    let txn = Txn::new().and_then([TxnOp::get(before.to_vec(), None), TxnOp::get(ours, None)]);
    let answer = backend.txn(txn).await.map_err(drop)?;
    let stands = |get: Option<&etcd_client::GetResponse>, created: i64| {
        get.and_then(|g| g.kvs().first())
            .is_some_and(|kv| kv.create_revision() == created)
    };
    let reads: Vec<etcd_client::GetResponse> = answer
        .op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect();
    Ok(stands(reads.first(), theirs) && stands(reads.get(1), mine))
}
