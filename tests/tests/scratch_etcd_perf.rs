#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
use std::time::Duration;
use lock_runtime::{LockRuntime};
use lock_tests::{etcd, unique};
use tokio::time::Instant;

async fn rt(prefix: &str) -> LockRuntime {
    LockRuntime::builder().etcd(etcd().endpoints()).key_prefix(prefix).build().await.unwrap()
}

async fn shape(procs: usize, tasks: usize) {
    let prefix = unique("perf");
    let mut rts = Vec::new();
    for _ in 0..procs { rts.push(rt(&prefix).await); }
    let end = Instant::now() + Duration::from_secs(3);
    let mut hs = Vec::new();
    for p in 0..procs { for _ in 0..tasks {
        let r = rts[p].clone();
        hs.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            while Instant::now() < end {
                let s = Instant::now();
                let g = r.lock("k").wait(Duration::from_secs(10)).acquire().await.unwrap();
                waits.push(s.elapsed());
                tokio::task::yield_now().await;
                g.release().await.unwrap();
            }
            waits
        }));
    }}
    let mut all = Vec::new();
    for h in hs { all.extend(h.await.unwrap()); }
    all.sort();
    let n = all.len();
    eprintln!("procs={procs} tasks={tasks}: {n} acq in 3s, p50 {:?} p99 {:?} max {:?}", all[n/2], all[n*99/100], all[n-1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf() {
    shape(1, 1).await;
    shape(1, 4).await;
    shape(2, 1).await;
    shape(2, 4).await;
}
