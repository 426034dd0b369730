//! The load mode: several processes of the service on one Redis, and many
//! concurrent payments of the same few orders spread over all of them.
//! Every order must end with exactly one charge; the report says so, or
//! names the orders charged twice.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::client;

/// What to fire.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Service processes to start (ignored with `urls`).
    pub processes: usize,
    /// Orders to pay.
    pub orders: u64,
    /// Concurrent payments per order.
    pub requests: u64,
    /// How long each payment's provider call takes.
    pub work: Duration,
    /// Running services to drive instead of starting processes.
    pub urls: Vec<String>,
}

/// How the load ended.
#[derive(Debug, Default)]
pub struct Report {
    /// Orders and how many charges each has, by order id.
    pub charges: BTreeMap<u64, u64>,
    /// Payments answered 200 (charged).
    pub charged: u64,
    /// Payments answered 409 (already paid).
    pub already_paid: u64,
    /// Payments that failed otherwise.
    pub errors: u64,
    /// The first process's `/metrics` after the load.
    pub metrics: String,
}

impl Report {
    /// Orders charged more than once.
    pub fn double_charged(&self) -> Vec<(u64, u64)> {
        self.charges
            .iter()
            .filter(|(_, &n)| n > 1)
            .map(|(&id, &n)| (id, n))
            .collect()
    }

    /// Orders nobody charged.
    pub fn never_charged(&self) -> Vec<u64> {
        self.charges
            .iter()
            .filter(|(_, &n)| n == 0)
            .map(|(&id, _)| id)
            .collect()
    }
}

/// A service process started by the load mode.
struct Service {
    child: Child,
    url: String,
}

/// Runs `plan` and reports; errors when a process or request fails to run.
pub async fn run(plan: &Plan) -> Result<Report, String> {
    let mut services = Vec::new();
    let urls = if plan.urls.is_empty() {
        for _ in 0..plan.processes.max(1) {
            services.push(start_service().await?);
        }
        services.iter().map(|s| s.url.clone()).collect()
    } else {
        plan.urls.clone()
    };
    let outcome = fire(plan, &urls).await;
    for service in services {
        stop_service(service).await?;
    }
    outcome
}

async fn fire(plan: &Plan, urls: &[String]) -> Result<Report, String> {
    // Fresh order ids per run, so a Redis kept between runs starts clean.
    let base = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
        * 1000;
    let ids: Vec<u64> = (1..=plan.orders).map(|n| base + n).collect();
    let mut calls = Vec::new();
    for (n, &id) in ids.iter().enumerate() {
        for r in 0..plan.requests {
            let url = urls[(n + r as usize) % urls.len()].clone();
            let path = format!(
                "/orders/{id}/pay?amount=10&work_ms={}",
                plan.work.as_millis()
            );
            calls.push(tokio::spawn(async move {
                client::request(&url, "POST", &path).await
            }));
        }
    }
    let mut report = Report::default();
    for call in calls {
        match call.await {
            Ok(Ok(response)) if response.status == 200 => report.charged += 1,
            Ok(Ok(response)) if response.status == 409 => report.already_paid += 1,
            Ok(Ok(response)) => {
                report.errors += 1;
                eprintln!(
                    "load: payment answered {}: {}",
                    response.status, response.body
                );
            }
            Ok(Err(error)) => {
                report.errors += 1;
                eprintln!("load: payment failed: {error}");
            }
            Err(error) => return Err(format!("a payment task failed: {error}")),
        }
    }
    for &id in &ids {
        let response = client::request(&urls[0], "GET", &format!("/orders/{id}"))
            .await
            .map_err(|e| format!("reading order {id}: {e}"))?;
        let order: serde_json::Value = serde_json::from_str(&response.body)
            .map_err(|e| format!("order {id}: {e}: {}", response.body))?;
        report
            .charges
            .insert(id, order["charges"].as_u64().unwrap_or(0));
    }
    report.metrics = client::request(&urls[0], "GET", "/metrics")
        .await
        .map_err(|e| format!("reading /metrics: {e}"))?
        .body;
    Ok(report)
}

/// Starts this same binary as a service on a free port of its choice and
/// reads the address it prints.
async fn start_service() -> Result<Service, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own binary: {e}"))?;
    let mut child = Command::new(exe)
        .args(["--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start a service process: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout of the service")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| "a service process did not start in 30 s".to_owned())?
        .map_err(|e| format!("reading a service's output: {e}"))?
        .ok_or("a service process exited at start")?;
    let url = first
        .strip_prefix("listening on ")
        .ok_or_else(|| format!("unexpected first line of a service: {first}"))?
        .to_owned();
    // Keep reading its output so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Service { child, url })
}

/// Stops a service as an orchestrator would (SIGTERM) and waits for it.
async fn stop_service(mut service: Service) -> Result<(), String> {
    if let Some(pid) = service.child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    match tokio::time::timeout(Duration::from_secs(20), service.child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(format!("service {} ended with {status}", service.url)),
        Ok(Err(e)) => Err(format!("waiting for service {}: {e}", service.url)),
        Err(_) => Err(format!("service {} did not stop in 20 s", service.url)),
    }
}
