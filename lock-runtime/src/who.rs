//! Who a runtime is, for an operator: a holder id (`<process-uuid>:<n>`)
//! means nothing to a person paged at night, "billing-worker on host web-3,
//! pid 4121, up since 09:12" does. Every runtime on a server backend
//! publishes this in one small string key, `<prefix>client:<process-uuid>`
//! (no braces, so it is no lock's name; `layout::client_identity`), one
//! `field=value` a line, written with its TTL in one `SET … PX` (atomic, and
//! within an ACL that allows the lock commands on `<prefix>*`). Its watchdog
//! writes it again every [`REFRESH`], with a TTL of [`TTL`]: it is there while
//! the process lives, and gone soon after it dies. `lockctl show` and `list` print it
//! ([`LockRuntime::client_of`](crate::LockRuntime::client_of)). A leaf: it
//! imports nothing of this crate.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a published identity lives without a refresh.
pub(crate) const TTL: Duration = Duration::from_secs(30);

/// How often the watchdog publishes it again (a third of [`TTL`], so two
/// refreshes may fail before it runs out).
pub(crate) const REFRESH: Duration = Duration::from_secs(10);

/// The process that holds a lock, as its runtime published it: see
/// [`LockRuntime::client_of`](crate::LockRuntime::client_of).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientInfo {
    /// The host name of the machine (or container) it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: u32,
    /// The name given to its runtime
    /// ([`client_name`](crate::LockRuntimeBuilder::client_name) or
    /// `LOCK_CLIENT_NAME`), if any.
    pub name: Option<String>,
    /// When its runtime was built.
    pub started: SystemTime,
}

/// This runtime's identity: the key and its value.
#[derive(Clone, Debug)]
pub(crate) struct Identity {
    pub(crate) key: String,
    pub(crate) value: String,
}

impl Identity {
    /// This process's identity, published under `key`.
    pub(crate) fn of_this_process(key: String, name: Option<&str>) -> Identity {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let mut fields = vec![
            ("host", hostname()),
            ("pid", std::process::id().to_string()),
            ("started_ms", started.to_string()),
        ];
        if let Some(name) = name {
            fields.push(("name", name.to_owned()));
        }
        // One field a line: a line break inside a value would start a
        // field of its own, so none is kept.
        let value = fields
            .iter()
            .map(|(field, value)| format!("{field}={}", value.replace(['\n', '\r'], " ")))
            .collect::<Vec<_>>()
            .join("\n");
        Identity { key, value }
    }
}

impl ClientInfo {
    /// Reads a published value (`None`: not an identity).
    pub(crate) fn parse(value: &str) -> Option<ClientInfo> {
        let fields: HashMap<&str, &str> = value.lines().filter_map(|l| l.split_once('=')).collect();
        let started: u64 = fields.get("started_ms")?.parse().ok()?;
        Some(ClientInfo {
            host: (*fields.get("host")?).to_owned(),
            pid: fields.get("pid")?.parse().ok()?,
            name: fields.get("name").map(|n| (*n).to_owned()),
            started: UNIX_EPOCH + Duration::from_millis(started),
        })
    }
}

/// The host's name: the kernel's (Linux), else `HOSTNAME`/`COMPUTERNAME`,
/// else `unknown` (std has no portable call, and it is not worth a
/// dependency).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::{ClientInfo, Identity};

    #[test]
    fn a_published_identity_reads_back_as_the_same_process() {
        let identity = Identity::of_this_process("p:client:x".to_owned(), Some("a\nhost=x"));
        let info = ClientInfo::parse(&identity.value);
        let info = info.as_ref();
        assert_eq!(info.map(|i| i.pid), Some(std::process::id()));
        assert_eq!(info.and_then(|i| i.name.as_deref()), Some("a host=x"));
        assert!(info.is_some_and(|i| !i.host.is_empty() && i.host != "x"));
        assert_eq!(ClientInfo::parse("something else"), None);
    }
}
