//! An attempt's steps: the transaction that puts (or finds) the holder's
//! key and reads what decides it (`acquire_txn`), the decision (a writer
//! holds first of all, a reader with no writer before it: `readers.rs`),
//! the key moved onto the lease the hold counts on, and the place's wait
//! started (`wait.rs`) when it queues.
//!
//! Owns no key's delete (`release.rs`) and no renewal (`renew.rs`); never
//! changes a key's mode (`modes.rs`).

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::readers::{self, read_node};
use super::txn::gets;
use super::{dir, first_of, modes, node, tomb, wait, EtcdBackend};
use crate::backend::Ask;
use crate::backend::{Acquire, Queue};
use crate::error::BackendError;

/// The transaction of one attempt of `holder` at `lock` (see the module
/// docs): its key (`read`: its read key) is put on `lease` if neither of
/// its keys is there yet (`joins`: the attempt waits in the queue), or if
/// nothing keeps it out (trying once: the directory is empty, or for a
/// read, no writer key exists), and never after the holder's tombstone was
/// written (`tomb.rs`); then both keys of the holder (when not just put)
/// and what decides the hold are read: the directory's first key for a
/// write, the first writer keys for a read (`readers.rs`).
pub(super) fn acquire_txn(lock: &str, holder: &str, lease: i64, joins: bool, read: bool) -> Txn {
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

impl EtcdBackend {
    /// One attempt for `holder` (see the module docs); a read (`mode`)
    /// puts its read key and is decided as `readers.rs` says.
    pub(crate) async fn acquire(&self, ask: Ask<'_>) -> Result<Acquire, BackendError> {
        let (lock, holder, lease, renewed) = (ask.lock_key, ask.holder, ask.lease, ask.renewed);
        let (queue, mode) = (ask.queue, ask.mode);
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
    pub(super) async fn reattach(
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
}
