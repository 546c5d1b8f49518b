//! Everything the command prints goes through here: `print!`, `println!`, `eprint!` and
//! `eprintln!` are redefined below (exported: a binary's `#[macro_use] extern crate
//! vrange_print;` puts them before std's in every module) to call [`stdout`] and [`stderr`], so
//! that no subcommand can panic on a closed pipe. std's macros panic ("failed printing to stdout: Broken pipe", exit status 101)
//! because the Rust runtime ignores SIGPIPE; `vrange top | head` must end as `yes | head` does
//! instead: quietly, killed by SIGPIPE.
//!
//! Why not restore SIGPIPE's default action at start-up: the daemon's metrics server and
//! coordinator write to sockets whose readers may go away, and those must see EPIPE, not die.
//! Here only the command's own standard output and error end it.
//!
//! vrange-bench prints the same way.

#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::print::stdout(format_args!($($arg)*)) };
}
#[macro_export]
macro_rules! println {
    () => { $crate::print::stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::print::stdout(format_args!("{}\n", format_args!($($arg)*))) };
}
#[macro_export]
macro_rules! eprint {
    ($($arg:tt)*) => { $crate::print::stderr(format_args!($($arg)*)) };
}
#[macro_export]
macro_rules! eprintln {
    () => { $crate::print::stderr(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::print::stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

use std::io::{ErrorKind, Write};

/// Writes to standard output and flushes, so that a closed pipe is seen at once. A broken
/// pipe ends the process as SIGPIPE would; any other error is said in one line on stderr and
/// ends it with status 1 (as `printf` does on a full disk).
pub fn stdout(args: std::fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        drop(out);
        if e.kind() == ErrorKind::BrokenPipe {
            die_of_sigpipe();
        }
        stderr(format_args!(
            "{}: cannot write to standard output: {e}\n",
            program()
        ));
        std::process::exit(1);
    }
}

/// This program's name, as it was started (for messages).
fn program() -> String {
    std::env::args_os()
        .next()
        .as_deref()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .map_or_else(|| "vrange".into(), |n| n.to_string_lossy().into_owned())
}

/// Writes to standard error. A broken pipe ends the process as SIGPIPE would; other errors are
/// ignored (there is nowhere left to report them).
pub fn stderr(args: std::fmt::Arguments) {
    let mut err = std::io::stderr().lock();
    if let Err(e) = err.write_fmt(args) {
        drop(err);
        if e.kind() == ErrorKind::BrokenPipe {
            die_of_sigpipe();
        }
    }
}

/// Ends the process with SIGPIPE's default action, so that a shell sees what it sees of any
/// Unix tool whose reader went away (status 141 under `set -o pipefail`), and nothing is
/// printed.
fn die_of_sigpipe() -> ! {
    // SAFETY: restoring a signal's default action and raising it on this process; no memory
    // is touched. The runtime set SIGPIPE to SIG_IGN at start-up, so nothing else relies on it.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    // Only if SIGPIPE is blocked: end quietly all the same.
    std::process::exit(141)
}
