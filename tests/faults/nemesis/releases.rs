//! A key's release channel, watched from outside: the moment a release
//! goes out, and whom a fair release hands the lock to. The nemesis times
//! a restart by it (between a release and the next holder's entry).
//!
//! A thread with a blocking connection straight to the server (not through
//! a proxy), so no fault of a worker's network hides a release from it; it
//! ends on its own after [`LIFE`], when its receiver is dropped, or when the
//! server goes away.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

/// Longest a watch lives.
const LIFE: Duration = Duration::from_secs(5);

/// The messages of one release channel, as they come.
pub(super) struct ReleaseWatch {
    messages: mpsc::UnboundedReceiver<String>,
}

impl ReleaseWatch {
    /// Subscribes to `channel` on the server at `port`; `None` when the
    /// subscription is not confirmed within a second (the server is
    /// restarting, say).
    pub(super) async fn start(port: u16, channel: String) -> Option<ReleaseWatch> {
        let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
        let (tx, messages) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("nemesis-release-watch".to_owned())
            .spawn(move || watch(port, &channel, subscribed_tx, &tx))
            .expect("start a release watch");
        match tokio::time::timeout(Duration::from_secs(1), subscribed).await {
            Ok(Ok(())) => Some(ReleaseWatch { messages }),
            _ => None,
        }
    }

    /// The next message for which `wanted` says yes, until `limit`.
    pub(super) async fn next(
        &mut self,
        limit: Instant,
        wanted: impl Fn(&str) -> bool,
    ) -> Option<String> {
        // Bounded by `limit`, and by the watch's life (the channel closes).
        loop {
            let message = tokio::time::timeout_at(limit, self.messages.recv())
                .await
                .ok()??;
            if wanted(&message) {
                return Some(message);
            }
        }
    }
}

fn watch(
    port: u16,
    channel: &str,
    subscribed: tokio::sync::oneshot::Sender<()>,
    messages: &mpsc::UnboundedSender<String>,
) {
    let started = std::time::Instant::now();
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
        return;
    };
    let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
        return;
    };
    if con
        .set_read_timeout(Some(Duration::from_millis(500)))
        .is_err()
    {
        return;
    }
    let mut pubsub = con.as_pubsub();
    // Short reads from here on, so the thread notices its end in time.
    if pubsub.subscribe(channel).is_err()
        || pubsub
            .set_read_timeout(Some(Duration::from_millis(50)))
            .is_err()
    {
        return;
    }
    let _ = subscribed.send(());
    // Bounded by `LIFE`.
    while started.elapsed() < LIFE && !messages.is_closed() {
        match pubsub.get_message() {
            Ok(message) => {
                let payload: String = message.get_payload().unwrap_or_default();
                if messages.send(payload).is_err() {
                    return;
                }
            }
            Err(e) if e.is_timeout() => {}
            Err(_) => return,
        }
    }
}
