//! `lockctl show KEY`: what the runtime's `inspect` records of one lock.

use crate::connect::Target;
use crate::report;
use crate::{Failure, Outcome};

/// Prints the lock `key`; [`Outcome::NotFound`] when it is free.
pub(crate) async fn run(target: &Target, key: &str, json: bool) -> Result<Outcome, Failure> {
    let runtime = target.runtime().await?;
    let info = target.inspect(&runtime, key).await?;
    let Some(info) = info else {
        match json {
            false => println!("{key}: free"),
            true => println!("{}", report::free_json(key)),
        }
        return Ok(Outcome::NotFound);
    };
    match json {
        false => println!("{}", report::info_text(&info)),
        true => println!("{}", report::info_json(&info)),
    }
    Ok(Outcome::Found)
}
