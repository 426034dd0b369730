//! What a lock leaves in Redis, read (and forged, and cut off) behind the
//! runtime's back: a test that checks what is stored, waits for a queue to
//! fill, queues a place no live process owns, or drops the runtime's
//! connections, does it here, with plain commands on its own connection.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

use crate::poll_until;

/// Length of the fair queue of the lock `hash` (a backend name) in Redis,
/// and the number of its entries.
pub async fn queue_len(con: &mut MultiplexedConnection, hash: &str) -> (usize, usize) {
    let list: usize = con.llen(format!("{hash}:queue")).await.unwrap();
    let entries: usize = con.hlen(format!("{hash}:queued")).await.unwrap();
    (list, entries)
}

/// Polls Redis (bounded: 3 s) until the fair queue of `hash` holds `want`
/// places, in its list and in its entries: a queue in Redis sends no event
/// to await.
pub async fn until_queued(con: &mut MultiplexedConnection, hash: &str, want: usize) {
    let what = format!("the queue of {hash} holds {want} places");
    let limit = Duration::from_secs(3);
    poll_until(&what, limit, async || {
        queue_len(con, hash).await == (want, want)
    })
    .await;
}

/// Polls Redis (bounded by `limit`) until the fair queue's list of `hash`
/// (its order, not its entries) holds `want` places.
pub async fn until_listed(
    con: &mut MultiplexedConnection,
    hash: &str,
    want: usize,
    limit: Duration,
) {
    let what = format!("the queue of {hash} lists {want} places");
    let list = format!("{hash}:queue");
    poll_until(&what, limit, async || {
        con.llen::<_, usize>(&list).await.unwrap() == want
    })
    .await;
}

/// Polls Redis (bounded: 3 s) until the lock hash `hash` exists.
pub async fn until_exists(con: &mut MultiplexedConnection, hash: &str) {
    let what = format!("{hash} is taken");
    let limit = Duration::from_secs(3);
    poll_until(&what, limit, async || {
        con.exists::<_, bool>(hash).await.unwrap()
    })
    .await;
}

/// Deletes the fair queue of `hash` (its list and its entries).
pub async fn clear_queue(con: &mut MultiplexedConnection, hash: &str) {
    let _: () = con.del(format!("{hash}:queue")).await.unwrap();
    let _: () = con.del(format!("{hash}:queued")).await.unwrap();
}

/// The server's clock in milliseconds (queue entries carry server time).
pub async fn server_ms(con: &mut MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(con).await.unwrap();
    secs * 1000 + micros / 1000
}

/// Queues `holder` in the key's fair queue as a process that went quiet
/// would have left it: entry `entry` (`{expiry}` is replaced by server time
/// + `life_ms`, which may be negative: an entry that ran out).
pub async fn queue_ghost(
    con: &mut MultiplexedConnection,
    hash: &str,
    holder: &str,
    entry: &str,
    life_ms: i64,
) {
    let expiry = server_ms(con).await as i64 + life_ms;
    let entry = entry.replace("{expiry}", &expiry.to_string());
    let _: () = con.rpush(format!("{hash}:queue"), holder).await.unwrap();
    let _: () = con
        .hset(format!("{hash}:queued"), holder, entry)
        .await
        .unwrap();
    for key in [format!("{hash}:queue"), format!("{hash}:queued")] {
        let _: () = con.pexpire(key, 30_000).await.unwrap();
    }
}

/// Kills the server's client connections of each of `types` (`normal`,
/// `pubsub`, `replica`) but the caller's (the server keeps its data), and
/// returns how many went.
pub async fn kill_clients(con: &mut MultiplexedConnection, types: &[&str]) -> u64 {
    let mut killed = 0;
    for kind in types {
        let reply: redis::RedisResult<u64> = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg(*kind)
            .arg("SKIPME")
            .arg("yes")
            .query_async(con)
            .await;
        killed += reply.unwrap_or(0);
    }
    killed
}
/// Every name under `prefix` on the server of `con`, with its PTTL in ms
/// (-1: no TTL), but for Redlock's boot marker (one per master and prefix,
/// permanent by design: README, "Redis layout") and the identities the
/// runtimes publish while they live (`layout::client_identity`). `SCAN`
/// also drops the expired names it meets, as a read would.
pub async fn names_left(con: &mut MultiplexedConnection, prefix: &str) -> Vec<(String, i64)> {
    let marker = lock_runtime::layout::redlock_boot_marker(prefix);
    let mut names = Vec::new();
    let mut cursor = 0u64;
    // Bounded: a full scan of a test server is far below this many steps.
    for _ in 0..100_000 {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await
            .unwrap();
        let ours = |name: &String| {
            *name != marker && !lock_runtime::layout::is_client_identity(prefix, name)
        };
        for name in batch.into_iter().filter(ours) {
            let ttl: i64 = con.pttl(&name).await.unwrap();
            if ttl != -2 {
                names.push((name, ttl));
            }
        }
        cursor = next;
        if cursor == 0 {
            return names;
        }
    }
    panic!("SCAN did not finish");
}

/// Polls (bounded by `limit`) until nothing is left under `prefix` on the
/// server of `con`: expiry sends no event to await.
pub async fn until_nothing_left(con: &mut MultiplexedConnection, prefix: &str, limit: Duration) {
    let started = tokio::time::Instant::now();
    loop {
        let left = names_left(con, prefix).await;
        if left.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "{} names still there after {limit:?}, e.g. {:?}",
            left.len(),
            &left[..left.len().min(3)]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
