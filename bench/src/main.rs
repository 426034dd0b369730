//! `lock-bench`: runs the benchmark scenarios, or (`--worker ...`) one of
//! the worker processes the scenarios start.
//!
//! The tokio runtime has two worker threads, the size of the machine the
//! figures in BENCHMARKS.md come from; the lock runtime adds its own thread.

use anyhow::Result;
use lock_bench::{worker, Config};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.first().map(String::as_str) == Some("--worker") {
        return runtime.block_on(worker::main(&args[1..]));
    }
    let config = Config::from_args(&args)?;
    let summary = runtime.block_on(lock_bench::run(config))?;
    println!("{}", summary.table);
    println!("results: {}", summary.json_path.display());
    for svg in &summary.svg_paths {
        println!("chart:   {}", svg.display());
    }
    println!("took {:.0} s", summary.seconds);
    Ok(())
}
