//! Redlock's per-master view. The runtime's `inspect` on Redlock answers
//! with the quorum view (the holder a majority records); an operator also
//! needs each master's own record, to see a hold left on a minority or a
//! master that is down. Each master is asked through a single-server
//! runtime of its own (the masters store locks as one server does), never
//! by lockctl's idea of the layout.

use lock_runtime::{LockInfo, LockRuntime};

use crate::connect::Target;
use crate::topology::Topology;

/// What one master records of a lock.
pub(crate) enum View {
    Held(LockInfo),
    Free,
    /// It did not answer (the reason, without secrets).
    Unreachable(String),
}

/// A runtime on each Redlock master (none on other topologies).
pub(crate) struct Masters(Vec<(String, Result<LockRuntime, String>)>);

impl Masters {
    /// Opens a runtime on every master; a master that cannot be reached is
    /// noted as a gap (the answer is partial) and shown as unreachable.
    pub(crate) async fn open(target: &Target) -> Masters {
        let Topology::Redlock(urls) = &target.topology else {
            return Masters(Vec::new());
        };
        let mut masters = Vec::new();
        for url in urls {
            let name = crate::secret::mask(url);
            let runtime = target.master_runtime(url).await.map_err(|failure| {
                target.unreachable(&format!("Redlock master {name}"), &failure.0);
                failure.0
            });
            masters.push((name, runtime));
        }
        Masters(masters)
    }

    /// How many masters there are (0: not Redlock).
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Each master's record of `key`, in the order the masters were given.
    pub(crate) async fn views(&self, target: &Target, key: &str) -> Vec<(String, View)> {
        let mut views = Vec::new();
        for (name, runtime) in &self.0 {
            let view = match runtime {
                Err(reason) => View::Unreachable(reason.clone()),
                Ok(runtime) => match target.inspect(runtime, key).await {
                    Ok(Some(info)) => View::Held(info),
                    Ok(None) => View::Free,
                    Err(failure) => {
                        target.unreachable(&format!("Redlock master {name}"), &failure.0);
                        View::Unreachable(failure.0)
                    }
                },
            };
            views.push((name.clone(), view));
        }
        views
    }
}

/// How many of `views` record a hold of `key` by `holder`.
pub(crate) fn holding(views: &[(String, View)], holder: &str) -> usize {
    views
        .iter()
        .filter(|(_, v)| matches!(v, View::Held(info) if info.holder == holder))
        .count()
}
