#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Entering on an acquire's own answer: the answer is news from the moment
//! the server gave it, and a caller may claim it much later (its executor
//! was busy, its process stopped). Between the two the server can restart
//! empty and give the key to another process. The caller enters only on
//! evidence still true when it enters: an answer from before a lost
//! connection is confirmed by one round trip (a renewal) first, and an
//! answer the renewal does not find in place is given back, the caller
//! asking the server anew (see the entry gate, `gate.rs`). Every form of
//! entry: `acquire()`, `try_acquire()`, a locked call, a read against a
//! writer, fair and plain.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{with_lock, LockError, LockRuntime};
use lock_testkit::RedisServer;
use lock_tests::{unique, until_exists, wait_until, StallableExecutor};

/// How the stalled process asks for the key.
#[derive(Clone, Copy, Debug)]
enum Form {
    Acquire,
    TryAcquire,
    LockedCall,
    /// A read, while the other process takes the key for a write.
    Read,
}

const FORMS: [Form; 4] = [
    Form::Acquire,
    Form::TryAcquire,
    Form::LockedCall,
    Form::Read,
];

/// What the stalled process entered with: its token, and whether its hold
/// was lost by then (set at entry, whatever its release says after).
type Entered = Arc<Mutex<Option<(u64, bool)>>>;

/// The stalled process's request for `k`, in `form`; records its entry in
/// `entered`. A try-once that finds the key busy records nothing.
fn ask(
    runtime: LockRuntime,
    form: Form,
    entered: Entered,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let wait = Duration::from_secs(30);
    let enter = move |fence: u64, lost: bool| *entered.lock().unwrap() = Some((fence, lost));
    Box::pin(async move {
        let request = runtime.lock("k").wait(wait);
        let guard = match form {
            Form::Acquire => request.acquire().await,
            Form::TryAcquire => match runtime.lock("k").try_acquire().await {
                Ok(Some(guard)) => Ok(guard),
                Ok(None) => return,
                Err(error) => Err(error),
            },
            Form::Read => request.read().acquire().await,
            Form::LockedCall => {
                let _ = with_lock(request, async {
                    enter(lock_runtime::fence().unwrap_or(0), false);
                    Ok::<_, LockError>(())
                })
                .await;
                return;
            }
        };
        let guard = guard.expect("the request ends with the key");
        enter(guard.fence(), guard.is_lost());
        let _ = guard.release().await;
    })
}

/// One round: process B's executor polls B's request once (its script goes
/// out and is answered on B's runtime thread), then stalls; the server
/// restarts empty; C takes the key from the fresh server (for a write, when
/// B reads). When B's executor runs again it must not enter while C holds
/// the key: it asks anew (a try-once finds the key busy), and enters after
/// C with a larger token.
async fn round(server: &mut RedisServer, fair: bool, form: Form) -> Result<(), String> {
    let prefix = unique("entry-answer");
    let build = |server: &RedisServer| {
        LockRuntime::builder()
            .redis(server.url())
            .key_prefix(&prefix)
            .fair(fair)
            .default_lease(Duration::from_secs(30))
            .build()
    };
    let b = build(server).await.unwrap();
    let c = build(server).await.unwrap();
    let hash = b.backend_key("k");
    let executor = StallableExecutor::start();
    let entered = Entered::default();
    let asking = ask(b.clone(), form, entered.clone());
    // The server waits while B's executor polls the request once: its
    // script goes out then, and is answered only once B's executor stalls.
    let mut con = server.connection().await;
    server.freeze();
    let (resume, asked) = executor.poll_once_then_stall(asking).await;
    server.thaw();
    // B's script took the key; one more round trip on another connection,
    // and its answer has been written to B's socket.
    until_exists(&mut con, &hash).await;
    let _: () = redis::cmd("PING").query_async(&mut con).await.unwrap();
    server.restart().await;
    wait_until("B's runtime saw its connection go", || {
        b.stats().connections_lost > 0
    })
    .await;
    let taker = c.lock("k").wait(Duration::from_secs(10));
    let taker = if matches!(form, Form::Read) {
        taker.write()
    } else {
        taker
    };
    let other = taker.acquire().await.unwrap();
    let token = other.fence();
    resume.send(()).unwrap();
    let mut asked = asked;
    let stale = |how: &str| {
        let got = *entered.lock().unwrap();
        got.map(|got| format!("{form:?} (fair {fair}): {how}: {got:?}, C's token {token}"))
    };
    if let Form::TryAcquire = form {
        (&mut asked).await.unwrap();
        if let Some(how) = stale("a try entered beside C") {
            return Err(how);
        }
    } else {
        // B must find its answer gone (one renewal) and wait for C.
        tokio::select! {
            _ = &mut asked => {}
            () = wait_until("B waits for C", || b.stats().waiting == 1) => {}
        }
        if let Some(how) = stale("entered on an answer from before the restart beside C") {
            return Err(how);
        }
        other.release().await.unwrap();
        asked.await.unwrap();
        let (fence, lost) = entered.lock().unwrap().expect("B entered");
        assert!(
            fence > token,
            "{form:?} (fair {fair}): tokens went back: {fence} after {token}"
        );
        assert!(!lost, "{form:?} (fair {fair}): entered a lost hold");
    }
    drop(executor);
    Ok(())
}

/// An answer from before an empty restart is never entered, in any form of
/// entry, fair or plain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_from_before_a_server_restart_is_not_entered() {
    let mut server = RedisServer::start();
    let mut entered = Vec::new();
    for fair in [true, false] {
        for form in FORMS {
            if let Err(how) = round(&mut server, fair, form).await {
                entered.push(how);
            }
        }
    }
    assert!(
        entered.is_empty(),
        "stale answers entered:\n{}",
        entered.join("\n")
    );
}
