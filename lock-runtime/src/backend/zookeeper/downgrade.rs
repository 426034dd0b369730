//! A downgrade: one transaction on the hold's session creates the read
//! node and deletes the write node (see the module docs of `mod.rs`), run
//! as a task of the runtime and registered until it ends, so that a
//! release of the holder waits for it.
//!
//! Owns the downgrades in flight (`Inner::downgrades`); deletes no node
//! but the write node it replaces (or a read node made for a holder
//! released meanwhile).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use tokio::sync::watch;
use zookeeper_client::{Acls, CreateMode};

use super::{path, Inner, Place, ZookeeperBackend};
use crate::error::BackendError;
use crate::held::HeldLock;

impl Inner {
    pub(super) fn downgrades(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), watch::Receiver<bool>>> {
        self.downgrades
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a downgrade of `holder`'s hold of `lock` in flight, if
    /// any: a release applied before it would leave the read node it
    /// creates standing for as long as our session.
    pub(super) async fn after_downgrade(&self, lock: &str, holder: &str) {
        let waiting = {
            let downgrades = self.downgrades();
            if downgrades.is_empty() {
                return;
            }
            downgrades
                .get(&(lock.to_owned(), holder.to_owned()))
                .cloned()
        };
        if let Some(mut done) = waiting {
            // (An error: the downgrade's task is gone with the runtime.)
            let _ = done.wait_for(|done| *done).await;
        }
    }

    /// Starts the downgrade of `holder`'s hold of `lock` as a task of the
    /// runtime, registered until it ends so that a release of the holder
    /// waits for it; its outcome as [`ZookeeperBackend::downgrade`] says.
    fn start_downgrade(
        self: &Arc<Self>,
        lock: &str,
        holder: &str,
    ) -> tokio::task::JoinHandle<Result<bool, BackendError>> {
        let key = (lock.to_owned(), holder.to_owned());
        let (done, waiting) = watch::channel(false);
        self.downgrades().insert(key.clone(), waiting);
        let inner = self.clone();
        self.handle.spawn(async move {
            let outcome = inner.downgrade_now(&key.0, &key.1).await;
            inner.downgrades().remove(&key);
            done.send_replace(true);
            outcome
        })
    }

    /// The downgrade's round trips: one transaction, on the hold's
    /// session, that creates the read node and deletes the write node,
    /// pipelined with a read of both nodes that tells the outcome even when
    /// the transaction's answer is lost (one session's requests are
    /// applied in order). Tried again while neither answer comes.
    async fn downgrade_now(&self, lock: &str, holder: &str) -> Result<bool, BackendError> {
        let Some(place) = self.place(lock, holder) else {
            return Ok(false); // released meanwhile
        };
        let client = place.session.client();
        if place.owner != client.session_id().0 {
            return Ok(false); // its session expired: the node went with it
        }
        if path::reads(&place.name) {
            return Ok(true);
        }
        let Some(read_name) = path::read_name(&place.name) else {
            return Err(BackendError::msg(format!(
                "downgrade of {lock} on ZooKeeper: {} is no lock node",
                place.name
            )));
        };
        let write = path::child(lock, &place.name);
        let read = path::child(lock, &read_name);
        let data = path::downgraded_data(holder, place.fence, place.session.timeout.as_millis());
        let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
        let mut last = None;
        for _attempt in 0..3 {
            let mut writer = client.new_multi_writer();
            writer
                .add_create(&read, &data, &ephemeral)
                .and_then(|()| writer.add_delete(&write, None))
                .map_err(|e| self.failed("downgrade failed", e))?;
            // Sent in this order (each call sends its request at once).
            let committing = writer.commit();
            let reading = client.get_data(&read);
            let checking = client.check_stat(&write);
            let committing = self.within(async { committing.await.map_err(Into::into) });
            let (committed, read_node, write_node) =
                tokio::join!(committing, self.within(reading), self.within(checking));
            if let Err(error) = committed {
                last = Some(error);
            }
            let read_node = match read_node {
                Ok((_, stat)) => Some(stat),
                Err(zookeeper_client::Error::NoNode) => None,
                Err(error) => {
                    last = Some(error);
                    continue;
                }
            };
            let write_stands = match write_node {
                Ok(stat) => stat.is_some(),
                Err(error) => {
                    last = Some(error);
                    continue;
                }
            };
            return match read_node {
                Some(stat) if stat.ephemeral_owner == place.owner => {
                    if write_stands {
                        // (Not from the transaction, which is atomic; from a
                        // create that went out on its own, were there one.)
                        let _ = self.within(client.delete(&write, None)).await;
                    }
                    Ok(self
                        .moved(lock, holder, &place, read_name, stat.czxid)
                        .await)
                }
                // Not applied: again (a node of that name of another session
                // cannot be: the uuid is this holder's).
                None if write_stands => continue,
                // The write node is gone, and no read node came: the hold is
                // gone (its session expired, a force unlock).
                _ => Ok(false),
            };
        }
        Err(self.downgrade_unknown(lock, holder, &place, last))
    }

    /// A downgrade with no answer: the transaction may yet be applied. The
    /// holder's release then lists its nodes by uuid on this session
    /// (after it), as after a lost create; a renewal meanwhile finds the
    /// write node or not.
    fn downgrade_unknown(
        &self,
        lock: &str,
        holder: &str,
        place: &Place,
        last: Option<zookeeper_client::Error>,
    ) -> BackendError {
        self.unsettled()
            .insert((lock.to_owned(), holder.to_owned()), place.session.clone());
        match last {
            Some(error) => self.failed("downgrade failed", error),
            None => BackendError::msg(format!(
                "downgrade of {lock} on ZooKeeper at {}: no answer",
                self.sessions.shown()
            )),
        }
    }

    /// Records that `holder`'s hold (`place`) moved to its read node
    /// `read_name`, made at `czxid`: renewals check that node from now on,
    /// and the hold keeps its token. If the holder was released while the
    /// downgrade was out (its place forgotten, the write node's name
    /// deleted), the read node is deleted here instead: `false`.
    async fn moved(
        &self,
        lock: &str,
        holder: &str,
        place: &Place,
        read_name: String,
        czxid: i64,
    ) -> bool {
        let key = (lock.to_owned(), holder.to_owned());
        {
            let mut places = self.places();
            if let Some(now) = places.get_mut(&key).filter(|p| p.fence == place.fence) {
                now.name = read_name;
                now.czxid = czxid;
                return true;
            }
        }
        let node = path::child(lock, &read_name);
        let client = place.session.client();
        match self.within(client.delete(&node, None)).await {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
            // The releaser finds it by its uuid.
            Err(_) => {
                self.releases.send(key.0, key.1, true);
            }
        }
        false
    }
}

impl ZookeeperBackend {
    /// Turns `holder`'s write (or exclusive) hold of `lock` into a read
    /// hold (see the module docs); `Ok(false)` when the hold is gone. It
    /// runs as a task of the runtime, so a caller that goes away does not
    /// cut it short between its request and the record of its answer; a
    /// release of the holder waits for it.
    pub(crate) async fn downgrade(&self, lock: &str, holder: &str) -> Result<bool, BackendError> {
        match self.inner.start_downgrade(lock, holder).await {
            Ok(outcome) => outcome,
            Err(_) => Err(BackendError::msg(format!(
                "downgrade of {lock} on ZooKeeper at {}: the runtime stopped",
                self.inner.sessions.shown()
            ))),
        }
    }

    /// [`downgrade`](Self::downgrade) with nobody to await it (a dropped
    /// guard): counted as pending for the key until answered, like a
    /// background release (this process's next acquire of the key, and
    /// shutdown, wait for it), and ahead of any later release of the
    /// holder, which waits for it. `Ok(false)` marks `held` lost; a
    /// failure leaves the write node to the renewals (it stands, more
    /// exclusive than asked, until the release; or it is found gone).
    pub(crate) fn downgrade_in_background(&self, held: &Arc<HeldLock>) {
        let pending = self.inner.releases.pending().clone();
        pending.add(&held.lock_key);
        let downgrading = self.inner.start_downgrade(&held.lock_key, &held.holder);
        let held = held.clone();
        self.inner.handle.spawn(async move {
            match downgrading.await {
                Ok(Ok(true)) | Err(_) => {}
                Ok(Ok(false)) => held.mark_lost(),
                Ok(Err(error)) => tracing::warn!(
                    %error,
                    key = %held.key,
                    "downgrade failed: the hold stays a write hold on ZooKeeper until its release"
                ),
            }
            pending.done([held.lock_key.as_str()]);
        });
    }
}
