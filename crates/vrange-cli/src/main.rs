//! `vrange`: run programs with their free memory volatile, see what a process's memory really
//! is, and reproduce the classic volatile-range experiments side by side with other allocators.

#![deny(unsafe_op_in_unsafe_fn)]

mod bench;
mod demo;
mod man;
mod run;
mod stat;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "vrange",
    version,
    about = "Volatile ranges for Linux userspace"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How vrange-malloc handles free memory (`VRANGE_MALLOC_MODE`).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Mode {
    Lazy,
    Managed,
    Hybrid,
}

/// A size flag in vrange's one grammar (`4096`, `64K`, `64MiB`, `2g`: powers of 1024), so that
/// clap refuses a malformed value with a message and exit status 2.
pub fn size_arg(s: &str) -> Result<u64, vrange::settings::ParseSizeError> {
    vrange::settings::parse_size(s.as_bytes())
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with libvrange_malloc preloaded; pass its exit status through.
    Run {
        /// How free memory is handled.
        #[arg(long, value_enum, default_value = "hybrid")]
        mode: Mode,
        /// Free memory kept resident before the oldest is purged (e.g. 64M, 1GiB).
        #[arg(long, value_name = "SIZE", value_parser = size_arg)]
        budget: Option<u64>,
        /// Print a summary when the program ends.
        #[arg(long)]
        stats: bool,
        /// libvrange_malloc.so to preload (default: next to this executable, or in ../lib).
        #[arg(long)]
        lib: Option<PathBuf>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// A process's memory: RSS, LazyFree, page tables, and its vrange statistics if it has any.
    #[command(
        after_help = "Exit status: 0 when everything was read; 1 when there is no such \
        process; 2 for a usage error; 3 when the process exists but this user may not read its \
        memory (/proc/PID/smaps_rollup needs the same user or root), after printing what could \
        be read.\n\nStatistics are read from /dev/shm/vrange-<uid>, the directory of the \
        process's effective uid (or from VRANGE_STATS_DIR when it is set)."
    )]
    Stat {
        pid: u32,
        /// Print again every interval until the process ends.
        #[arg(long)]
        watch: bool,
        /// Interval for --watch, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
    },
    /// Run a benchmark suite: ebizzy, pressure, lazyfree, pagetable, markcost or all.
    Bench(bench::Args),
    /// A process a benchmark suite starts in a cgroup of its own (internal).
    #[command(hide = true)]
    BenchRole {
        role: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A short tour: mark data volatile, create real pressure, show what was purged and saved.
    Demo,
    /// What this kernel and these privileges allow, and what falls back.
    Features,
    /// Write the manual pages (vrange.1, vrange-run.1, ...) into DIR (for `make install`).
    #[command(hide = true)]
    Man { dir: PathBuf },
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run {
            mode,
            budget,
            stats,
            lib,
            command,
        } => run::main(run::Options {
            mode,
            budget,
            stats,
            lib,
            command,
        }),
        Command::Stat {
            pid,
            watch,
            interval_ms,
        } => stat::main(pid, watch, interval_ms),
        Command::Bench(args) => bench::main(args),
        Command::BenchRole { role, args } => bench::role(&role, &args),
        Command::Demo => demo::main(),
        Command::Features => {
            print!("{}", vrange::features());
            0
        }
        Command::Man { dir } => man::main(Cli::command(), &dir),
    };
    std::process::exit(code);
}
