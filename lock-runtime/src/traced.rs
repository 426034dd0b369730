//! A future polled inside a tracing span that costs one pointer of state
//! when no subscriber wants the span. `tracing::Instrument` keeps a whole
//! `Span` in the future; on an acquire, which is what a busy service holds
//! thousands of while they wait, that is bytes paid without any subscriber.
//! A leaf: it imports nothing of this crate.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tracing::Span;

pin_project_lite::pin_project! {
    /// `inner`, entered into `span` at every poll when there is a span.
    pub(crate) struct Traced<F> {
        // Boxed, and only when enabled: `None` (8 bytes) without a subscriber.
        span: Option<Box<Span>>,
        #[pin]
        inner: F,
    }
}

impl<F> Traced<F> {
    /// `inner` inside `span` (dropped at once when disabled).
    pub(crate) fn new(span: Span, inner: F) -> Self {
        let span = (!span.is_disabled()).then(|| Box::new(span));
        Traced { span, inner }
    }
}

impl<F: Future> Future for Traced<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = this.span.as_ref().map(|span| span.enter());
        this.inner.poll(cx)
    }
}
