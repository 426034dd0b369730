//! Test-only: a subscriber set for one test thread that sees every event
//! of that thread, whatever the tests beside it do.
//!
//! `tracing` caches each callsite's interest once for the whole process. With
//! at most one dispatcher registered, it asks the *registering* thread's
//! default; a sibling test thread without a subscriber then caches `never`
//! and the event is dropped for everyone (a warning test saw none, 3 runs in
//! 15). An anchor dispatcher, always interested and enabled for nothing,
//! stays registered for the process, so interest is combined over every
//! dispatcher and each event asks its own thread's subscriber.

use std::sync::OnceLock;

use tracing::dispatcher::{DefaultGuard, Dispatch};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// Interested in every callsite, enabled for none.
struct Anchor;

impl Subscriber for Anchor {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::always()
    }
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Sets `subscriber` as this thread's default until the guard drops.
pub(crate) fn on_this_thread(subscriber: impl Subscriber + Send + Sync + 'static) -> DefaultGuard {
    static ANCHOR: OnceLock<Dispatch> = OnceLock::new();
    ANCHOR.get_or_init(|| Dispatch::new(Anchor));
    let guard = tracing::dispatcher::set_default(&Dispatch::new(subscriber));
    tracing::callsite::rebuild_interest_cache();
    guard
}
