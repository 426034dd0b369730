//! How a lock is printed: text for people, JSON for scripts (the same
//! fields, lease in milliseconds).

use std::time::Duration;

use lock_runtime::{ClientInfo, LockInfo};
use serde_json::{json, Value};

use crate::masters::{holding, View};

/// A held lock as JSON.
pub(crate) fn info_json(info: &LockInfo) -> Value {
    json!({
        "key": info.key,
        "held": true,
        "holder": info.holder,
        "holds": info.holds,
        "remaining_lease_ms": info.remaining_lease.map(|d| d.as_millis() as u64),
        "remaining_lease_is_bound": info.remaining_lease_is_bound,
        "fence": info.fence,
        "queue": info.queue,
        "mode": info.mode.as_str(),
        "readers": info.readers.iter().map(|r| json!({
            "holder": r.holder,
            "remaining_lease_ms": r.remaining_lease.map(|d| d.as_millis() as u64),
            "fence": r.fence,
        })).collect::<Vec<_>>(),
    })
}

/// The process behind a holder id as JSON (`null`: it published nothing).
pub(crate) fn client_json(client: Option<&ClientInfo>) -> Value {
    client.map_or(Value::Null, |c| {
        json!({
            "name": c.name,
            "host": c.host,
            "pid": c.pid,
            "started_ms": c
                .started
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        })
    })
}

/// The process behind a holder id, for people: `billing-worker on web-3,
/// pid 4121, up 5m 3s`.
pub(crate) fn client(client: &ClientInfo) -> String {
    let name = client
        .name
        .as_ref()
        .map_or(String::new(), |n| format!("{n} on "));
    let up = client.started.elapsed().map_or(String::new(), |d| {
        let s = d.as_secs();
        match s {
            0..60 => format!(", up {s}s"),
            60..3600 => format!(", up {}m {}s", s / 60, s % 60),
            _ => format!(", up {}h {}m", s / 3600, s / 60 % 60),
        }
    });
    format!("{name}{}, pid {}{up}", client.host, client.pid)
}

/// A free lock as JSON.
pub(crate) fn free_json(key: &str) -> Value {
    json!({ "key": key, "held": false })
}

/// A held lock as text, one field a line (`who`: the holder's process).
pub(crate) fn info_text(info: &LockInfo, who: Option<&ClientInfo>) -> String {
    let mut text = format!("{}: held\n", info.key);
    text.push_str(&format!("  mode        {}\n", mode(info)));
    text.push_str(&format!("  holder      {}\n", info.holder));
    if let Some(who) = who {
        text.push_str(&format!("  process     {}\n", client(who)));
    }
    text.push_str(&format!("  holds       {}\n", info.holds));
    text.push_str(&format!("  lease left  {}\n", lease_of(info)));
    text.push_str(&format!("  fence       {}\n", fence(info.fence)));
    for (n, reader) in info.readers.iter().enumerate() {
        text.push_str(&format!(
            "    reader {}. {} (fence {}, lease left {})\n",
            n + 1,
            reader.holder,
            fence(reader.fence),
            lease(reader.remaining_lease)
        ));
    }
    text.push_str(&format!("  queue       {} waiting", info.queue.len()));
    for (n, holder) in info.queue.iter().enumerate() {
        text.push_str(&format!("\n    {}. {holder}", n + 1));
    }
    text
}

/// The hold's mode, for people: `write`, or `read×3` (three readers share
/// it; `holder` is then the one whose lease ends last).
pub(crate) fn mode(info: &LockInfo) -> String {
    if info.mode.is_read() {
        format!("read×{}", info.readers.len())
    } else {
        "write".to_owned()
    }
}

/// A lease left, for people: `29.512s`, or `none` when it does not expire.
pub(crate) fn lease(left: Option<Duration>) -> String {
    left.map_or("none".to_owned(), |d| format!("{:.3}s", d.as_secs_f64()))
}

/// The holder's lease left, for people: as [`lease`], or, where the
/// backend only knows a bound (ZooKeeper's session timeout), `at most …`.
pub(crate) fn lease_of(info: &LockInfo) -> String {
    let left = lease(info.remaining_lease);
    if info.remaining_lease_is_bound {
        format!("at most {left} (the holder's session timeout)")
    } else {
        left
    }
}

/// [`lease_of`] for a table's cell: `≤20.000s` for a bound.
pub(crate) fn lease_cell(info: &LockInfo) -> String {
    let left = lease(info.remaining_lease);
    if info.remaining_lease_is_bound {
        format!("≤{left}")
    } else {
        left
    }
}

/// A fencing token, for people (`-` when not recorded).
pub(crate) fn fence(token: Option<u64>) -> String {
    token.map_or("-".to_owned(), |t| t.to_string())
}

/// Redlock: each master's record as JSON (`master`, and `held` with the
/// holder's fields, or `error`).
pub(crate) fn masters_json(views: &[(String, View)]) -> Value {
    let each = views.iter().map(|(name, view)| match view {
        View::Held(info) => json!({
            "master": name,
            "held": true,
            "holder": info.holder,
            "holds": info.holds,
            "remaining_lease_ms": info.remaining_lease.map(|d| d.as_millis() as u64),
            "fence": info.fence,
        }),
        View::Free => json!({ "master": name, "held": false }),
        View::Unreachable(error) => json!({ "master": name, "error": error }),
    });
    Value::Array(each.collect())
}

/// Redlock: the quorum line and each master's record, as text lines.
pub(crate) fn masters_text(views: &[(String, View)], holder: Option<&str>) -> String {
    let quorum = views.len() / 2 + 1;
    let mut text = match holder {
        Some(holder) => format!(
            "  quorum      held on {} of {} masters ({quorum} needed)\n",
            holding(views, holder),
            views.len()
        ),
        None => format!(
            "  quorum      no holder on {quorum} of {} masters\n",
            views.len()
        ),
    };
    text.push_str("  masters");
    for (name, view) in views {
        let state = match view {
            View::Held(info) => format!(
                "held by {} (fence {}, lease left {})",
                info.holder,
                fence(info.fence),
                lease(info.remaining_lease)
            ),
            View::Free => "free".to_owned(),
            View::Unreachable(error) => format!("unreachable: {error}"),
        };
        text.push_str(&format!("\n    {name}  {state}"));
    }
    text
}
