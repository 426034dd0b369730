//! `lockctl release KEY --force`: frees a lock whoever holds it, after
//! showing the holder and asking (unless `--yes`). The holder learns at its
//! next renewal that the lock is lost.

use std::io::BufRead;

use crate::connect::Target;
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
        return Err(Failure(format!(
            "`release` takes the lock from whoever holds it: write `lockctl release {key} --force`"
        )));
    }
    let runtime = target.runtime().await?;
    let info = target.inspect(&runtime, key).await?;
    let Some(info) = info else {
        match json {
            false => println!("{key}: free, nothing to release"),
            true => println!(
                "{}",
                serde_json::json!({ "key": key, "released": false, "held": false })
            ),
        }
        return Ok(Outcome::NotFound);
    };
    if !yes && !confirm(&info) {
        match json {
            false => println!("{key}: not released"),
            true => println!(
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
        (false, true) => println!(
            "{key}: released (was held by {}, fence {})",
            info.holder,
            report::fence(info.fence)
        ),
        (false, false) => println!("{key}: was freed meanwhile, nothing released"),
        (true, _) => println!(
            "{}",
            serde_json::json!({
                "key": key,
                "released": released,
                "holder": info.holder,
                "fence": info.fence,
            })
        ),
    }
    Ok(if released {
        Outcome::Found
    } else {
        Outcome::NotFound
    })
}

/// Shows the holder on stderr and reads `y`/`yes` from stdin (anything
/// else, or the end of input, is no).
fn confirm(info: &lock_runtime::LockInfo) -> bool {
    eprint!(
        "release {} held by {} (fence {}, lease left {})? [y/N] ",
        info.key,
        info.holder,
        report::fence(info.fence),
        report::lease(info.remaining_lease)
    );
    let mut answer = String::new();
    match std::io::stdin().lock().read_line(&mut answer) {
        Ok(_) => matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"),
        Err(_) => false,
    }
}
