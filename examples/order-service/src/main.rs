//! `order-service`: the service, or with `--load` the load run against
//! several processes of it.
//!
//! ```text
//! order-service [--addr 127.0.0.1:8080] [--grace 5s]
//! order-service --load [--processes 3] [--orders 5] [--requests 20] [--work-ms 20] [--url http://…]…
//! ```
//!
//! Configured from the environment at startup: `REDIS_URL` (or
//! `LOCK_REDIS_URL`) for Redis, the embedded backend when unset (debug
//! builds), `LOCK_PREFIX` for the lock names (the orders are stored under
//! `<prefix>orders:` next to them).

use std::process::ExitCode;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use order_service::load::{self, Plan};
use order_service::routes::{self, AppState};
use order_service::store::Store;

/// Bucket bounds of the lock histograms, in seconds: from a re-entry
/// (microseconds) to a wait that ran out (the default wait is 30 s).
const LOCK_BUCKETS: &[f64] = &[0.0001, 0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 30.0];

/// What the command line asks for.
struct Args {
    addr: String,
    grace: Duration,
    load: Option<Plan>,
}

fn usage() -> String {
    "usage: order-service [--addr HOST:PORT] [--grace-ms N]\n       order-service --load \
     [--processes N] [--orders N] [--requests N] [--work-ms N] [--url http://HOST:PORT]..."
        .to_owned()
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        addr: "127.0.0.1:8080".to_owned(),
        grace: Duration::from_secs(5),
        load: None,
    };
    let mut plan = Plan {
        processes: 3,
        orders: 5,
        requests: 20,
        work: Duration::from_millis(20),
        urls: Vec::new(),
    };
    let mut load = false;
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = |name: &str| {
            words
                .next()
                .ok_or(format!("{name} needs a value\n{}", usage()))
        };
        let number = |text: String| {
            text.parse::<u64>()
                .map_err(|_| format!("not a number: {text}"))
        };
        match word.as_str() {
            "--addr" => args.addr = value("--addr")?,
            "--grace-ms" => args.grace = Duration::from_millis(number(value("--grace-ms")?)?),
            "--load" => load = true,
            "--processes" => plan.processes = number(value("--processes")?)? as usize,
            "--orders" => plan.orders = number(value("--orders")?)?,
            "--requests" => plan.requests = number(value("--requests")?)?,
            "--work-ms" => plan.work = Duration::from_millis(number(value("--work-ms")?)?),
            "--url" => plan.urls.push(value("--url")?),
            "--help" | "-h" => return Err(usage()),
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
    }
    if load {
        args.load = Some(plan);
    }
    Ok(args)
}

fn redis_url() -> Option<String> {
    ["LOCK_REDIS_URL", "REDIS_URL"]
        .into_iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let result = match args.load {
        Some(plan) => run_load(plan).await,
        None => serve(&args.addr, args.grace).await,
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("order-service: {message}");
            ExitCode::from(2)
        }
    }
}

/// Serves until SIGTERM or ctrl-c, then stops taking requests, gives those
/// in flight `grace` to finish, and gives back every lock still held.
async fn serve(addr: &str, grace: Duration) -> Result<ExitCode, String> {
    // The recorder first: the runtime reports from its first acquire on.
    // Lock waits and holds as Prometheus histograms (buckets add up across
    // the service's processes, quantiles would not).
    let metrics = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix("lock_".to_owned()), LOCK_BUCKETS)
        .map_err(|e| format!("metrics buckets: {e}"))?
        .install_recorder()
        .map_err(|e| format!("metrics recorder: {e}"))?;
    lock_runtime::describe_metrics();
    let runtime = lock_runtime::init_from_env()
        .await
        .map_err(|e| format!("lock runtime: {e}"))?;
    let store = match redis_url() {
        Some(url) => {
            let prefix = std::env::var("LOCK_PREFIX").unwrap_or_else(|_| "lock:".to_owned());
            Store::redis(&url, format!("{prefix}orders:"))
                .await
                .map_err(|e| format!("order store: {e}"))?
        }
        None => Store::memory(),
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("listen on {addr}: {e}"))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("listen on {addr}: {e}"))?;
    // The first line is for whoever started us (the load mode, the tests).
    println!("listening on http://{local}");
    let app = routes::router(AppState {
        store,
        runtime,
        metrics,
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    tokio::select! {
        () = signalled() => {}
        finished = &mut server => return Err(format!("the server stopped: {finished:?}")),
    }
    println!(
        "stopping: no new requests, {} ms for those in flight",
        grace.as_millis()
    );
    let _ = stop.send(());
    let finished = tokio::time::timeout(grace, &mut server).await.is_ok();
    // Gives back every lock still held; bodies still running are told
    // their lock is lost and answer 503, so the server can finish.
    let released = lock_runtime::shutdown()
        .await
        .map_err(|e| format!("lock shutdown: {e}"))?;
    if !finished {
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    }
    println!("stopped: released {released} lock(s)");
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM (how orchestrators stop a service) or ctrl-c.
async fn signalled() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The load mode: fires, checks, reports; exit 1 when an order was charged
/// twice (or a payment failed, or an order was never charged).
async fn run_load(mut plan: Plan) -> Result<ExitCode, String> {
    if plan.urls.is_empty() && redis_url().is_none() && plan.processes > 1 {
        println!(
            "load: no REDIS_URL: one process on the embedded backend (set REDIS_URL to share \
             the locks and the orders between several processes)"
        );
        plan.processes = 1;
    }
    let drivers = if plan.urls.is_empty() {
        format!("{} process(es)", plan.processes)
    } else {
        format!("{} running service(s)", plan.urls.len())
    };
    println!(
        "load: {drivers}, {} orders x {} concurrent payments = {} requests",
        plan.orders,
        plan.requests,
        plan.orders * plan.requests
    );
    let report = load::run(&plan).await?;
    println!(
        "load: {} charged, {} already paid, {} failed",
        report.charged, report.already_paid, report.errors
    );
    println!("--- /metrics of the first process after the load (lock_ and orders_ series) ---");
    for line in report.metrics.lines() {
        if line.starts_with("lock_") || line.starts_with("orders_") {
            println!("{line}");
        }
    }
    let double = report.double_charged();
    for (id, charges) in &double {
        println!("load: DOUBLE-CHARGED: order {id} was charged {charges} times");
    }
    let never = report.never_charged();
    if !never.is_empty() {
        println!("load: orders never charged: {never:?}");
    }
    match (double.is_empty(), never.is_empty()) {
        (true, true) => println!(
            "load: no order was double-charged: each of the {} orders was charged exactly once",
            report.charges.len()
        ),
        (true, false) => println!(
            "load: no order was double-charged, but {} were never charged",
            never.len()
        ),
        (false, _) => {}
    }
    Ok(
        if double.is_empty() && never.is_empty() && report.errors == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}
