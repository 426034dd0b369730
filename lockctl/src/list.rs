//! `lockctl list`: the locks held now under the prefix. One `SCAN` over
//! the names that may be lock hashes (`<prefix>{*}`), then `inspect` of
//! each: what it prints is what the runtime records.

use lock_runtime::layout;

use crate::connect::Target;
use crate::report;
use crate::{Failure, Outcome};

/// Keys asked of the server per `SCAN` step.
const SCAN_COUNT: usize = 500;

/// Prints up to `limit` held locks, sorted by key; [`Outcome::NotFound`]
/// when there are none.
pub(crate) async fn run(target: &Target, limit: usize, json: bool) -> Result<Outcome, Failure> {
    let runtime = target.runtime().await?;
    let keys = scan_keys(target, limit).await?;
    let mut held = Vec::new();
    for key in &keys {
        // Released between the scan and now: not listed.
        if let Some(info) = target.inspect(&runtime, key).await? {
            held.push(info);
        }
    }
    if json {
        let locks: Vec<_> = held.iter().map(report::info_json).collect();
        println!("{}", serde_json::Value::Array(locks));
    } else if held.is_empty() {
        println!("no locks held under prefix `{}`", target.prefix);
    } else {
        println!(
            "{:<32} {:<12} {:>20} {:>6}  holder",
            "key", "lease left", "fence", "queue"
        );
        for info in &held {
            println!(
                "{:<32} {:<12} {:>20} {:>6}  {}",
                info.key,
                report::lease(info.remaining_lease),
                report::fence(info.fence),
                info.queue.len(),
                info.holder
            );
        }
    }
    Ok(if held.is_empty() {
        Outcome::NotFound
    } else {
        Outcome::Found
    })
}

/// The keys of the lock hashes under the prefix, sorted, at most `limit`.
async fn scan_keys(target: &Target, limit: usize) -> Result<Vec<String>, Failure> {
    let client = target.client()?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| target.failure(&e))?;
    let pattern = layout::scan_pattern(&target.prefix);
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    // Bounded: SCAN ends when the cursor comes back to 0, and we stop at
    // `limit` keys.
    loop {
        let (next, names): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(&mut con)
            .await
            .map_err(|e| target.failure(&e))?;
        keys.extend(
            names
                .iter()
                .filter_map(|n| layout::key_of(&target.prefix, n)),
        );
        cursor = next;
        if cursor == 0 || keys.len() >= limit {
            break;
        }
    }
    keys.sort();
    keys.dedup();
    keys.truncate(limit);
    Ok(keys)
}
