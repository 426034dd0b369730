//! Standard output that may close early: `lockctl list | head -1` closes
//! the pipe after one line, and `println!` would panic on the next write
//! (Rust ignores SIGPIPE, so the write fails with `BrokenPipe`). Every line
//! goes through [`line`], which ends the process quietly then, as a reader
//! that has seen enough is no error.

use std::io::Write;

/// Writes one line to stdout; on a closed pipe, exits with code 0 at once.
pub(crate) fn line(text: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(text).and_then(|()| out.write_all(b"\n"));
    match written {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(error) => {
            eprintln!("lockctl: error: cannot write to stdout: {error}");
            std::process::exit(crate::EXIT_ERROR.into());
        }
    }
}

/// `println!` through [`line`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use out;
