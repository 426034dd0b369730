//! `lockctl release KEY --force`: frees a lock whoever holds it, after
//! showing the holder and asking (unless `--yes`). The holder learns at its
//! next renewal that the lock is lost. Through the runtime's
//! `force_unlock`, so on a Cluster it reaches the node that owns the key
//! (following `MOVED`), and on Redlock every master; a Redlock master that
//! does not answer keeps its copy until its lease ends (a minority: nobody
//! can take the lock with it), and the exit code says the answer is partial.

use std::io::BufRead;

use crate::connect::Target;
use crate::masters::Masters;
use crate::output::out;
use crate::report;
use crate::{Failure, Outcome};

/// Frees `key`; [`Outcome::NotFound`] when it was free or the operator
/// said no.
pub(crate) async fn run(
    target: &Target,
    key: &str,
    force: bool,
    yes: bool,
    json: bool,
) -> Result<Outcome, Failure> {
    if !force {
        // Repeat what was given, so the suggestion runs as written: with
        // `--yes` it must not ask again.
        let yes = if yes { " --yes" } else { "" };
        return Err(Failure(format!(
            "`release` takes the lock from whoever holds it: write `lockctl release {key} \
             --force{yes}`"
        )));
    }
    let runtime = target.runtime().await?;
    // Redlock: a master that is down is noted (the answer is partial).
    let _masters = Masters::open(target).await;
    let info = target.inspect(&runtime, key).await?;
    let Some(info) = info else {
        match json {
            false => out!("{key}: free, nothing to release"),
            true => out!(
                "{}",
                serde_json::json!({ "key": key, "released": false, "held": false })
            ),
        }
        return Ok(target.outcome(false));
    };
    if !yes && !confirm(&info, target.client_of(&runtime, &info.holder).await) {
        match json {
            false => out!("{key}: not released"),
            true => out!(
                "{}",
                serde_json::json!({ "key": key, "released": false, "held": true })
            ),
        }
        return Ok(Outcome::NotFound);
    }
    let released = runtime
        .force_unlock(key)
        .await
        .map_err(|e| target.lock_failure(&e))?;
    match (json, released) {
        (false, true) if info.mode.is_read() => out!(
            "{key}: released, freeing {} (was held by {})",
            readers(&info),
            info.readers
                .iter()
                .map(|r| r.holder.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (false, true) => out!(
            "{key}: released (was held by {}, fence {})",
            info.holder,
            report::fence(info.fence)
        ),
        (false, false) => out!("{key}: was freed meanwhile, nothing released"),
        (true, _) => out!(
            "{}",
            serde_json::json!({
                "key": key,
                "released": released,
                "holder": info.holder,
                "fence": info.fence,
                "mode": info.mode.as_str(),
                "readers": info.readers.iter().map(|r| &r.holder).collect::<Vec<_>>(),
            })
        ),
    }
    Ok(target.outcome(released))
}

/// Shows the holder (and its process, when it published one) on stderr and
/// reads `y`/`yes` from stdin (anything else, or the end of input, is no).
fn confirm(info: &lock_runtime::LockInfo, who: Option<lock_runtime::ClientInfo>) -> bool {
    let who = who.map_or(String::new(), |c| format!(" ({})", report::client(&c)));
    if info.mode.is_read() {
        eprint!(
            "release {} read by {} (the reader whose lease ends last: {}{who})? [y/N] ",
            info.key,
            readers(info),
            info.holder
        );
        return said_yes();
    }
    eprint!(
        "release {} held by {}{who} (fence {}, lease left {})? [y/N] ",
        info.key,
        info.holder,
        report::fence(info.fence),
        report::lease_of(info)
    );
    said_yes()
}

/// `3 readers`, `1 reader`.
fn readers(info: &lock_runtime::LockInfo) -> String {
    match info.readers.len() {
        1 => "1 reader".to_owned(),
        n => format!("{n} readers"),
    }
}

/// Reads `y`/`yes` from stdin (anything else, or the end of input, is no).
fn said_yes() -> bool {
    let mut answer = String::new();
    match std::io::stdin().lock().read_line(&mut answer) {
        Ok(_) => matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"),
        Err(_) => false,
    }
}
