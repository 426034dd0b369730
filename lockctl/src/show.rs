//! `lockctl show KEY`: what the runtime's `inspect` records of one lock
//! (on Redlock the quorum view, and each master's own record).

use crate::connect::Target;
use crate::masters::{holding, Masters};
use crate::output::out;
use crate::report;
use crate::{Failure, Outcome};

/// Prints the lock `key`; [`Outcome::NotFound`] when it is free,
/// [`Outcome::Partial`] when a server did not answer.
pub(crate) async fn run(target: &Target, key: &str, json: bool) -> Result<Outcome, Failure> {
    let runtime = target.runtime().await?;
    let masters = Masters::open(target).await;
    let info = target.inspect(&runtime, key).await?;
    let views = masters.views(target, key).await;
    let who = match &info {
        Some(info) => target.client_of(&runtime, &info.holder).await,
        None => None,
    };
    match (&info, json) {
        (Some(info), false) => out!("{}", report::info_text(info, who.as_ref())),
        (None, false) => out!("{key}: free"),
        (Some(info), true) => {
            let mut value = report::info_json(info);
            value["client"] = report::client_json(who.as_ref());
            if masters.len() > 0 {
                value["masters"] = report::masters_json(&views);
                value["masters_holding"] = holding(&views, &info.holder).into();
                value["quorum"] = (views.len() / 2 + 1).into();
            }
            out!("{value}");
        }
        (None, true) => {
            let mut value = report::free_json(key);
            if masters.len() > 0 {
                value["masters"] = report::masters_json(&views);
            }
            out!("{value}");
        }
    }
    if masters.len() > 0 && !json {
        let holder = info.as_ref().map(|i| i.holder.as_str());
        out!("{}", report::masters_text(&views, holder));
    }
    Ok(target.outcome(info.is_some()))
}
