//! A queued place's turn: each place of this process in a lock's queue
//! (its key, waiting behind older keys) watches one key before it, never
//! the whole directory, so a release wakes one process, not every waiter.
//! A writer's key watches the key just before it in create-revision order
//! (of any kind: readers too); a reader's key watches the last writer key
//! before it (`readers.rs`).
//!
//! When that key changes (deleted: released, or its lease ran out; or
//! given the value `r`: downgraded), the place reads again, in one
//! transaction, its own key and the key it now waits for: that one is
//! watched in turn; none means the lock is the place's, and the waiters
//! are told it was handed over (a writer's) or freed (a reader's: the
//! first waiter claims it with an attempt). A handoff is of the key as
//! read here: it stays a writer, since no attempt changes a key's mode
//! (`modes.rs`). This read is the
//! check the Jepsen analysis of etcd 3.4 asked for: the lock is only
//! claimed after the server confirmed, after the predecessor's delete, that
//! the place's own key still stands (etcd's own Lock RPC could grant a lock
//! whose lease had expired, etcd#11456). A place whose key is gone (its
//! lease lost, a force-unlock) tells its waiters the key was released: the
//! next attempt queues it again.
//!
//! Owns the wait task of each queued place; puts and deletes no key (a place
//! given back is `release.rs`'s).

use std::sync::Weak;

use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::readers::{self, read_node, Scan};
use super::txn::gets;
use super::{dir, node, Inner};
use crate::backend::place_tasks::{read_until_answered, Backoff};

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
    /// No key keeps ours out: the lock is ours (`reader`: a read key).
    First {
        /// Our key is a reader.
        reader: bool,
    },
    /// Our key (name, mod revision) waits for this key (key, create
    /// revision, mod revision); the read was at revision `read_at`.
    Behind {
        before: (Vec<u8>, i64, i64),
        ours: (String, i64),
        read_at: i64,
    },
}

/// Waits for the turn of `holder`'s key in `lock`, created at revision
/// `mine`; tells the waiters when it comes, or when the key is gone.
async fn wait_turn(inner: Weak<Inner>, lock: String, holder: String, mine: i64, renewed: bool) {
    let mut backoff = Backoff::new();
    let (lock_name, holder_id) = (lock.as_str(), holder.as_str());
    loop {
        let look = read_until_answered(&inner, &mut backoff, |backend| async move {
            read(&backend, lock_name, holder_id, mine).await
        });
        let Some((backend, found)) = look.await else {
            return;
        };
        let (before, ours, read_at) = match found {
            Found::Gone => {
                backend.waits.ended(&lock, &holder);
                if let Some(wakeups) = backend.wakeups.upgrade() {
                    wakeups.released(&lock);
                }
                return;
            }
            Found::First { reader } => {
                backend.waits.ended(&lock, &holder);
                if let Some(wakeups) = backend.wakeups.upgrade() {
                    let fence = u64::try_from(mine).unwrap_or(0);
                    if renewed && !reader {
                        wakeups.handed_over(&lock, &holder, fence, fence);
                    } else {
                        wakeups.released(&lock);
                    }
                }
                return;
            }
            Found::Behind {
                before,
                ours,
                read_at,
            } => (before, ours, read_at),
        };
        let (before, created, modded) = before;
        let ours = (ours.0.as_str(), mine, ours.1);
        match changed(&backend, (&before, created, modded), ours, read_at).await {
            Ok(()) => backoff.reset(),
            Err(()) => {
                drop(backend);
                backoff.pause().await;
            }
        }
    }
}

/// Reads, in one transaction, both keys of the holder (ours is the one
/// created at `mine`) and the keys it may wait for: the key just before
/// it, and the last writer keys before it.
async fn read(backend: &Inner, lock: &str, holder: &str, mine: i64) -> Result<Found, ()> {
    let names = [node(lock, holder), read_node(lock, holder)];
    let before = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(mine - 1)
        .with_limit(1);
    let mut ops = vec![
        TxnOp::get(names[0].as_str(), None),
        TxnOp::get(names[1].as_str(), None),
        TxnOp::get(dir(lock), Some(before)),
    ];
    ops.extend(readers::last_writers(lock, mine - 1));
    let answer = backend.txn(Txn::new().and_then(ops)).await.map_err(drop)?;
    let read_at = answer.header().map_or(0, |h| h.revision());
    let reads = gets(&answer);
    let [write, read, older, pages @ ..] = reads.as_slice() else {
        return Err(());
    };
    let own = names
        .into_iter()
        .zip([write, read])
        .find_map(|(name, get)| {
            get.kvs()
                .first()
                .filter(|kv| kv.create_revision() == mine)
                .map(|kv| (name, kv))
        });
    let Some((name, kv)) = own else {
        return Ok(Found::Gone);
    };
    let ours = (name, kv.mod_revision());
    let writer = if readers::is_reader(lock, kv.key(), kv.value()) {
        match readers::last_writer(lock, pages) {
            Scan::Writer(key, created, modded) => Some((key, created, modded)),
            Scan::None => None,
            Scan::Below(upto) => readers::last_writer_upto(backend, lock, upto)
                .await
                .map_err(drop)?,
        }
    } else {
        older
            .kvs()
            .first()
            .map(|kv| (kv.key().to_vec(), kv.create_revision(), kv.mod_revision()))
    };
    Ok(match writer {
        None => Found::First {
            reader: readers::is_reader(lock, kv.key(), kv.value()),
        },
        Some(before) => Found::Behind {
            before,
            ours,
            read_at,
        },
    })
}

/// Resolves when the key `before` (created and last changed at the given
/// revisions) or our key (`ours`: name, created at `mine`, changed at the
/// last) changes (deleted, or put: a downgrade, a move to another lease),
/// at once if either changed already, or with `Err` when the watch failed.
/// Both stood so in the read at revision `read_at`.
///
/// The watch starts "now", at the revision its creation reports; if the
/// store moved on since `read_at`, the two keys are read again once the
/// watch is in place: a change before that read shows in the read, one
/// after it in the watch.
/// (A watch from a past revision would do with one round trip less, but
/// etcd serves such a watch only from its next catch-up pass, up to 100 ms
/// later, and under contention the revision has always moved on.)
async fn changed(
    backend: &Inner,
    before: (&[u8], i64, i64),
    ours: (&str, i64, i64),
    read_at: i64,
) -> Result<(), ()> {
    let mut client = backend.client.watch_client();
    let opened = tokio::time::timeout(backend.timeout, async {
        let mut stream = client.watch(before.0.to_vec(), None).await?;
        stream.watch(ours.0.to_owned(), None).await?;
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
    if from > read_at && !still_stand(backend, before, ours).await? {
        return Ok(());
    }
    loop {
        let message = stream.message().await.map_err(|e| backend.failed(&e))?;
        let Some(answer) = message else {
            return Err(());
        };
        if answer.canceled() || !answer.events().is_empty() {
            return Ok(());
        }
    }
}

/// Whether both keys still stand as they were read: the same create and
/// mod revisions (one read).
async fn still_stand(
    backend: &Inner,
    (before, theirs, their_change): (&[u8], i64, i64),
    (ours, mine, our_change): (&str, i64, i64),
) -> Result<bool, ()> {
    let txn = Txn::new().and_then([TxnOp::get(before.to_vec(), None), TxnOp::get(ours, None)]);
    let answer = backend.txn(txn).await.map_err(drop)?;
    let stands = |get: Option<&etcd_client::GetResponse>, created: i64, changed: i64| {
        get.and_then(|g| g.kvs().first())
            .is_some_and(|kv| kv.create_revision() == created && kv.mod_revision() == changed)
    };
    let reads = gets(&answer);
    Ok(stands(reads.first(), theirs, their_change) && stands(reads.get(1), mine, our_change))
}
