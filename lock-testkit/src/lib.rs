//! The kit the integration tests (`lock-tests`) and the benchmark
//! (`lock-bench`) share, so both measure and break the same things the same
//! way.
//!
//! Both need a `redis-server` of their own: on a free loopback port, with
//! nothing on disk, gone when the process that started it ends, however it
//! ends. The fault tests also restart it (empty, or from a snapshot), freeze
//! it (SIGSTOP/SIGCONT) and kill it; both read its `INFO commandstats`, their
//! own resident memory and CPU time, and drive child processes by lines.
//!
//! ```no_run
//! let server = lock_testkit::RedisServer::start();
//! let url = server.url(); // redis://127.0.0.1:<port>
//! # drop(url);
//! ```
//!
//! Each fallible step comes in two forms: `try_…` returns the error, for the
//! benchmark; the plain name panics with it, which is how a test fails. A
//! missing `redis-server` is such an error, and it names the install command.

pub mod binary;
pub mod child;
pub mod commandstats;
pub mod pipes;
pub mod port;
pub mod process;
pub mod server;
pub mod signal;
pub mod usage;

pub use binary::INSTALL_HINT;
pub use child::LineChild;
pub use commandstats::{CommandStats, Delta};
pub use port::free_port;
pub use server::RedisServer;
pub use signal::Signal;
