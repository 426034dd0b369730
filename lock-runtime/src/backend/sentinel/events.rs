//! The sentinels' own news of a failover: `+switch-master` on their pub/sub.
//!
//! A dead primary shows itself through failed calls, but a live one that
//! the sentinels replace (`SENTINEL FAILOVER`, a partition that isolates it
//! from the sentinels but not from us) goes on answering, as a primary,
//! until a sentinel demotes it, which can take one of the sentinels' `INFO`
//! rounds (10 s). Writes taken there meanwhile are lost. So one sentinel at
//! a time is subscribed to `+switch-master`
//! (`<service> <old ip> <old port> <new ip> <new port>`), and the address it
//! announces is handed to the monitor at once.

use std::sync::Weak;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use super::resolve::{config, open, Sentinel};
use super::Shared;
use crate::backend::ConnectSettings;

/// Pause before subscribing again after a sentinel was lost (doubling).
const RESUBSCRIBE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// Listens to the sentinels in turn, for as long as the backend lives.
pub(super) async fn listen(shared: Weak<Shared>) {
    let mut pause = RESUBSCRIBE.0;
    for turn in 0usize.. {
        let Some(now) = shared.upgrade() else {
            return;
        };
        let sentinel = now.sentinels[turn % now.sentinels.len()].clone();
        let (settings, service) = (now.settings.clone(), now.service.clone());
        drop(now);
        match subscribe(&sentinel, &settings).await {
            Ok((_con, mut pushes)) => {
                pause = RESUBSCRIBE.0;
                while let Some(push) = pushes.recv().await {
                    if push.kind == PushKind::Disconnection {
                        break;
                    }
                    let Some(shared) = shared.upgrade() else {
                        return;
                    };
                    if let Some(address) = switched_to(&push, &service) {
                        shared.moved(address);
                    }
                }
            }
            Err(error) => {
                tracing::debug!(sentinel = %sentinel.endpoint, %error, "cannot subscribe to sentinel");
            }
        }
        tokio::time::sleep(pause).await;
        pause = pause.saturating_mul(2).min(RESUBSCRIBE.1);
    }
}

/// A RESP3 connection to `sentinel` subscribed to `+switch-master`, and
/// its pushes (keep the connection: dropping it ends the subscription).
async fn subscribe(
    sentinel: &Sentinel,
    settings: &ConnectSettings,
) -> Result<(MultiplexedConnection, mpsc::UnboundedReceiver<PushInfo>), String> {
    let info = sentinel.info.clone();
    let resp3 = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let (tx, pushes) = mpsc::unbounded_channel();
    let config = config(settings).set_push_sender(tx);
    let mut con = open(info.set_redis_settings(resp3), settings, config).await?;
    con.subscribe("+switch-master")
        .await
        .map_err(|e| e.to_string())?;
    Ok((con, pushes))
}

/// The new primary's `host:port` from a `+switch-master` message about
/// `service`.
fn switched_to(push: &PushInfo, service: &str) -> Option<String> {
    if push.kind != PushKind::Message {
        return None;
    }
    let Some(Value::BulkString(bytes)) = push.data.get(1) else {
        return None;
    };
    let text = std::str::from_utf8(bytes).ok()?;
    let words: Vec<&str> = text.split(' ').collect();
    match words.as_slice() {
        [name, _, _, host, port] if *name == service => Some(format!("{host}:{port}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_master_messages_name_the_new_primary_of_their_service() {
        let push = |text: &str| PushInfo {
            kind: PushKind::Message,
            data: vec![
                Value::BulkString(b"+switch-master".to_vec()),
                Value::BulkString(text.as_bytes().to_vec()),
            ],
        };
        let moved = push("mymaster 10.0.0.1 6379 10.0.0.2 6380");
        assert_eq!(
            switched_to(&moved, "mymaster").as_deref(),
            Some("10.0.0.2:6380")
        );
        assert_eq!(switched_to(&moved, "other"), None);
        assert_eq!(switched_to(&push("garbage"), "mymaster"), None);
    }
}
