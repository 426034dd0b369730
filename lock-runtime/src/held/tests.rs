//! The held table's rules, hold by hold and frame by frame.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::{LockError, LockRuntime};

/// Every warning, as its fields written out.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == Level::WARN {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// One loss is told once (warning and `lock_lost_total`), whichever
/// notices it first: a renewal's verdict or the release behind a
/// locked call, which may be answered in the same moment.
#[tokio::test(flavor = "current_thread")]
async fn a_loss_found_by_renewal_and_release_at_once_is_told_once() {
    let warnings = Warnings::default();
    let _default = crate::captured::on_this_thread(warnings.clone());
    let runtime = LockRuntime::builder().memory().build().await.unwrap();
    let renewal_first = runtime.lock("a").acquire().await.unwrap();
    renewal_first.held().mark_lost();
    assert!(
        !renewal_first.held().lost_at_release(),
        "the release counted a loss the renewal had counted"
    );
    let release_first = runtime.lock("b").acquire().await.unwrap();
    assert!(release_first.held().lost_at_release());
    assert!(release_first.is_lost());
    release_first.held().mark_lost();
    let told: Vec<String> = warnings
        .all()
        .into_iter()
        .filter(|w| w.contains("lock lost while held"))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
}

/// The likely mistake, a wait for a guard the same task took (here the
/// future of a `block_on`, told by its waker), is named in a warning when
/// the wait starts, with the way out; the wait itself ends in `Timeout`.
#[tokio::test(flavor = "current_thread")]
async fn a_wait_for_a_guard_this_task_took_is_warned_and_times_out() {
    let warnings = Warnings::default();
    let _default = crate::captured::on_this_thread(warnings.clone());
    let runtime = LockRuntime::builder().memory().build().await.unwrap();
    let _guard = runtime.lock("order:7").acquire().await.unwrap();
    let waited = runtime
        .lock("order:7")
        .wait(Duration::from_millis(50))
        .acquire()
        .await
        .map(drop);
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    let warned = warnings.all();
    assert!(
        warned
            .iter()
            .any(|w| w.contains("key=order:7") && w.contains("guard.scope")),
        "{warned:?}"
    );
}

/// A task that did not take the guard (a spawned task, waiting for the
/// guard of the `block_on` that spawned it) is not warned.
#[tokio::test(flavor = "current_thread")]
async fn a_wait_for_a_guard_another_task_took_is_not_warned() {
    let warnings = Warnings::default();
    let _default = crate::captured::on_this_thread(warnings.clone());
    let runtime = LockRuntime::builder().memory().build().await.unwrap();
    let _guard = runtime.lock("order:7").acquire().await.unwrap();
    let rt = runtime.clone();
    let waited = tokio::spawn(async move {
        rt.lock("order:7")
            .wait(Duration::from_millis(50))
            .acquire()
            .await
            .map(drop)
    })
    .await
    .unwrap();
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    assert_eq!(warnings.all(), Vec::<String>::new());
}

/// A read joins another task's read hold only when that hold is a
/// renewed read hold on the same terms, fit to enter now (confirmed in
/// the current connection epoch, not lost), and within the cohort
/// limits.
#[test]
fn a_read_joins_only_a_confirmed_live_read_hold_on_its_terms_within_the_limits() {
    use super::{HeldLock, HeldTable, Hold};
    use crate::cohort::{Cohort, Terms};
    use crate::mode::LockMode;
    use crate::owner::Node;

    let lease = Duration::from_secs(30);
    let hold = |mode| {
        HeldLock::new(Hold {
            key: "k".to_owned(),
            lock_key: "lock:{k}".to_owned(),
            holder: format!("p:{mode:?}"),
            owner: 1,
            fence: 7,
            upto: 7,
            since: tokio::time::Instant::now(),
            epoch: 3,
            lease,
            renew: true,
            fair: true,
            mode,
        })
    };
    let terms = Terms {
        lease,
        fair: true,
        read: true,
    };
    let limits = Cohort {
        handoffs: 2,
        budget: Duration::from_secs(60),
    };
    let table = HeldTable::default();
    let read = hold(LockMode::Read);
    table.insert(read.clone(), &Node::root(), true);
    let join = |terms, epoch| table.join("lock:{k}", &Node::root(), (terms, limits), epoch);
    // A connection was lost since the hold was last confirmed (epoch 3).
    assert!(join(terms, 4).is_none());
    // Other terms.
    let longer = Terms {
        lease: lease * 2,
        ..terms
    };
    assert!(join(longer, 3).is_none());
    let write = Terms {
        read: false,
        ..terms
    };
    assert!(join(write, 3).is_none());
    // Twice, then the limit.
    let (held, _) = join(terms, 3).unwrap();
    assert_eq!(held.fence(), 7);
    assert!(join(terms, 3).is_some());
    assert!(join(terms, 3).is_none(), "past the cohort limit");
    // A lost hold is never joined.
    let other = HeldTable::default();
    let lost = hold(LockMode::Read);
    other.insert(lost.clone(), &Node::root(), true);
    lost.mark_lost();
    assert!(other
        .join("lock:{k}", &Node::root(), (terms, limits), 3)
        .is_none());
    // Nor a write hold.
    let writes = HeldTable::default();
    writes.insert(hold(LockMode::Write), &Node::root(), true);
    assert!(writes
        .join("lock:{k}", &Node::root(), (terms, limits), 3)
        .is_none());
}
