//! The worker processes (`nemesis_worker`): started, and their logs read
//! as they come in.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_testkit::pipes;
use tokio::process::{Child, ChildStdin};

use super::{TASKS, TIMEOUT};

pub(super) struct Worker {
    pub(super) child: Child,
    pub(super) stdin: ChildStdin,
    pub(super) lines: tokio::task::JoinHandle<Vec<String>>,
    pub(super) live: Arc<Live>,
}

/// A worker's log as it comes in: the outermost holds open right now, so
/// the nemesis can aim a fault at a process that holds a lock (a fault that
/// hits a process holding nothing tests little).
#[derive(Default)]
pub(super) struct Live {
    pub(super) holding: Mutex<HashSet<u64>>,
}

impl Live {
    pub(super) fn see(&self, line: &str) {
        let words: Vec<&str> = line.split(' ').collect();
        let (Some(&"ev"), Some(call), Some(kind)) = (words.first(), words.get(3), words.get(6))
        else {
            return;
        };
        let Ok(call) = call.parse::<u64>() else {
            return;
        };
        let mut holding = self.holding.lock().expect("live holds");
        match *kind {
            "acquired" if words.contains(&"outer=1") => {
                holding.insert(call);
            }
            "released" | "lost" | "cancelled" | "panicked" | "body_exit" => {
                holding.remove(&call);
            }
            _ => {}
        }
    }

    pub(super) fn holds(&self) -> bool {
        !self.holding.lock().expect("live holds").is_empty()
    }
}

pub(super) async fn spawn_worker(
    url: &str,
    prefix: &str,
    seed: u64,
    secs: u64,
    keys: &str,
) -> Worker {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_nemesis_worker"));
    command.args([
        url,
        prefix,
        &seed.to_string(),
        &secs.to_string(),
        &TASKS.to_string(),
        &TIMEOUT.as_millis().to_string(),
        keys,
    ]);
    let (mut child, mut lines) = pipes::spawn(&mut command).expect("spawn nemesis_worker");
    let stdin = child.stdin.take().expect("worker stdin");
    let ready = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("a worker did not get ready within 20 s")
        .expect("read worker stdout");
    assert_eq!(ready.as_deref(), Some("ready"), "worker start-up");
    let live = Arc::new(Live::default());
    let seen = live.clone();
    let lines = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            seen.see(&line);
            all.push(line);
        }
        all
    });
    Worker {
        child,
        stdin,
        lines,
        live,
    }
}
