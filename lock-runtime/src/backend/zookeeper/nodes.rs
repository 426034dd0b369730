//! A holder's nodes: the children of a lock listed (as the leader has
//! them, when it matters), many nodes read in one call, a node created in Curator's protected mode
//! (found again by its uuid after a create whose answer was lost, which
//! keeps the holder unsettled until its release), and twins of such a
//! create deleted.
//!
//! Owns the creates and the record of unsettled holders; decides no turn
//! (`path.rs`) and deletes no holder's own node (`release.rs`).

use std::sync::Arc;

use zookeeper_client::{Acls, Client, CreateMode, MultiReadResult};

use super::sessions::Session;
use super::{path, Inner, Place};
use crate::error::BackendError;
use crate::mode::LockMode;

impl Inner {
    /// The children of `lock` (none when it does not exist).
    pub(super) async fn list(
        &self,
        client: &Client,
        lock: &str,
    ) -> Result<Vec<String>, BackendError> {
        match self.within(client.list_children(lock)).await {
            Ok(children) => Ok(children),
            Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
            Err(error) => Err(self.failed("listing a lock's contenders failed", error)),
        }
    }

    /// One multi-read on `client`, bounded by the response timeout: of each
    /// path of `paths`, its data, or its children where `children`. The
    /// answers come in the order of `paths`.
    pub(super) async fn read_each(
        &self,
        client: &Client,
        paths: impl IntoIterator<Item = String>,
        children: bool,
    ) -> Result<Vec<MultiReadResult>, zookeeper_client::Error> {
        let mut reader = client.new_multi_reader();
        for path in paths {
            if children {
                reader.add_get_children(&path)?;
            } else {
                reader.add_get_data(&path)?;
            }
        }
        self.within(reader.commit()).await
    }

    /// The children of `lock` as the leader has them: a `sync` first,
    /// pipelined with the listing (one round trip). A follower's plain
    /// read may not show a delete another session just made (ZooKeeper
    /// orders reads per session, not across them); that never lets two in,
    /// but an attempt right after a release would find the lock still busy.
    pub(super) async fn list_latest(
        &self,
        client: &Client,
        lock: &str,
    ) -> Result<Vec<String>, BackendError> {
        let syncing = self.within(client.sync(lock));
        let listing = self.list(client, lock);
        let (synced, listed) = tokio::join!(syncing, listing);
        match synced {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => listed,
            Err(error) => Err(self.failed("sync before listing a lock's contenders failed", error)),
        }
    }

    /// Creates `holder`'s node in `lock` on `session` (and the lock path,
    /// as container nodes, when missing); the node and the children seen
    /// right after.
    ///
    /// A create that fails without an answer may still be applied later
    /// (a follower holds it for a leader that does not answer now; a leader
    /// killed after it logged the create applies it once it is back), also
    /// after the holder found no node and created another: the session it
    /// went out on is kept for `holder`'s release, which must find every
    /// such node (see [`Inner::delete`]).
    pub(super) async fn create(
        &self,
        session: &Arc<Session>,
        lock: &str,
        holder: &str,
        mode: LockMode,
    ) -> Result<(Place, Vec<String>), BackendError> {
        let key = (lock.to_owned(), holder.to_owned());
        // Before the create goes out: a release that runs meanwhile (the
        // caller gone) lists on its session, after it.
        self.unsettled().insert(key.clone(), session.clone());
        let mut lost = false;
        let created = self.create_on(session, lock, holder, mode, &mut lost).await;
        if created.is_err() || lost {
            // (Again: a release that ran meanwhile may have settled it.)
            self.unsettled().insert(key, session.clone());
        } else {
            self.unsettled().remove(&key);
        }
        created
    }

    /// [`create`](Self::create)'s round trips; `lost` is set when a
    /// create's answer was lost.
    async fn create_on(
        &self,
        session: &Arc<Session>,
        lock: &str,
        holder: &str,
        mode: LockMode,
        lost: &mut bool,
    ) -> Result<(Place, Vec<String>), BackendError> {
        let client = session.client();
        let prefix = path::node_prefix(holder, mode);
        let full = path::child(lock, &prefix);
        let data = path::node_data(holder, session.timeout.as_millis());
        let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let mut last = None;
        for _attempt in 0..4 {
            // One round trip: the server answers a session's requests in
            // order, so the listing sees the node just created.
            let creating = self.within(client.create(&full, &data, &ephemeral));
            let listing = self.within(client.list_children(lock));
            let (created, listed) = tokio::join!(creating, listing);
            match created {
                Ok((stat, sequence)) => {
                    let place = Place {
                        name: format!("{prefix}{sequence}"),
                        czxid: stat.czxid,
                        fence: stat.czxid,
                        owner: client.session_id().0,
                        session: session.clone(),
                    };
                    self.remember(lock, holder, place.clone());
                    tracing::debug!(
                        lock, node = %place.name, czxid = place.czxid, session = place.owner,
                        "ZooKeeper lock node created"
                    );
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => self.list(&client, lock).await?,
                    };
                    return Ok((place, children));
                }
                Err(zookeeper_client::Error::NoNode) => {
                    let parents = CreateMode::Container.with_acls(Acls::anyone_all());
                    if let Err(error) = self.within(client.mkdir(lock, &parents)).await {
                        let what = format!("creating the lock path {lock} failed");
                        return Err(self.failed(&what, error));
                    }
                }
                Err(
                    error @ (zookeeper_client::Error::ConnectionLoss
                    | zookeeper_client::Error::Timeout),
                ) => {
                    // Protected mode: the create may have gone through
                    // without its answer; our uuid finds it.
                    *lost = true;
                    if let Some(found) = self.find(session, lock, holder).await? {
                        return Ok(found);
                    }
                    last = Some(error);
                }
                Err(error) => {
                    let what = format!("creating a lock node under {lock} failed");
                    return Err(self.failed(&what, error));
                }
            }
        }
        Err(match last {
            Some(error) => self.failed(&format!("creating a lock node under {lock} failed"), error),
            None => BackendError::msg(format!(
                "creating a lock node under {lock} failed on ZooKeeper at {}: \
                 the lock path kept vanishing",
                self.sessions.shown()
            )),
        })
    }

    /// `holder`'s node in `lock` made by `session`, if there is one (after
    /// a create whose answer was lost).
    async fn find(
        &self,
        session: &Arc<Session>,
        lock: &str,
        holder: &str,
    ) -> Result<Option<(Place, Vec<String>)>, BackendError> {
        let client = session.client();
        let children = self.list(&client, lock).await?;
        let Some(name) = children.iter().find(|c| path::is_holders(c, holder)) else {
            return Ok(None);
        };
        let stat = match self.within(client.get_data(&path::child(lock, name))).await {
            Ok((_, stat)) => stat,
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(error) => return Err(self.failed("reading a lock node failed", error)),
        };
        if stat.ephemeral_owner != client.session_id().0 {
            return Ok(None);
        }
        let place = Place {
            name: name.clone(),
            czxid: stat.czxid,
            fence: stat.czxid,
            owner: stat.ephemeral_owner,
            session: session.clone(),
        };
        self.remember(lock, holder, place.clone());
        tracing::debug!(
            lock, node = %place.name, czxid = place.czxid, session = place.owner,
            "ZooKeeper lock node found again after a lost create answer"
        );
        Ok(Some((place, children)))
    }

    /// Deletes the nodes of `holder` among `children` of `lock` other than
    /// `keep` (the one it knows): twins from a create whose answer was lost
    /// and that was applied after the holder made another, which would
    /// otherwise stand before or behind it for as long as our session.
    /// Whether there were any.
    pub(super) async fn drop_twins(
        &self,
        client: &Client,
        lock: &str,
        holder: &str,
        keep: &str,
        children: &[String],
    ) -> Result<bool, BackendError> {
        let twins: Vec<&String> = children
            .iter()
            .filter(|c| c.as_str() != keep && path::is_holders(c, holder))
            .collect();
        for twin in &twins {
            tracing::debug!(lock, node = %twin, "ZooKeeper twin node deleted");
            match self
                .within(client.delete(&path::child(lock, twin), None))
                .await
            {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                Err(error) => {
                    return Err(self.failed("deleting a lost create's node failed", error))
                }
            }
        }
        Ok(!twins.is_empty())
    }
}
