//! `vrange`: run programs with their free memory volatile, see what a process's memory really
//! is, and coordinate the purges of a container's processes. (The benchmark suites are
//! `vrange-bench`, a separate, unpublished command: nothing of them ships here.)

// ci: host only: the unit tests are formatting and parsing

#![deny(unsafe_op_in_unsafe_fn)]

// Its printing macros (vrange-print's, whose `print!` ends quietly on a closed pipe) replace
// std's in every module.
#[macro_use]
extern crate vrange_print;

mod out;

mod coord;
mod demo;
mod man;
mod run;
mod stat;

use vrange_print::{clock, table};

use clap::{CommandFactory, Parser, Subcommand};
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

/// How vrange-malloc handles free memory (`VRANGE_MALLOC_MODE`): the policy of its free
/// spans, by the policy's name.
fn policy_arg() -> impl clap::builder::TypedValueParser<Value = vrange::Policy> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(["lazy", "managed", "hybrid"]).map(|name| match name.as_str() {
        "lazy" => vrange::Policy::Lazy,
        "managed" => vrange::Policy::Managed,
        _ => vrange::Policy::Hybrid,
    })
}

/// A size flag in vrange's one grammar (`4096`, `64K`, `64MiB`, `2g`: powers of 1024), so that
/// clap refuses a malformed value with a message and exit status 2.
pub fn size_arg(s: &str) -> Result<u64, vrange_sys::settings::ParseSizeError> {
    vrange_sys::settings::parse_size(s.as_bytes())
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with libvrange_malloc preloaded; pass its exit status through.
    Run {
        /// How free memory is handled [default: $VRANGE_MALLOC_MODE when set, else hybrid].
        #[arg(long, value_parser = policy_arg())]
        mode: Option<vrange::Policy>,
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
        process's effective uid (or from VRANGE_STATS_DIR when it is set).\n\n\
        --watch prints a header, then one line per interval: the local time, the seconds \
        elapsed, RSS, LazyFree, AnonHugePages and VmPTE, and from the published statistics \
        the volatile bytes, those not resident now (purged or never touched) and all purged \
        so far, in MiB (a dash: not published). It ends when the process exits (a last line says \
        so), after --count lines, or on Ctrl-C."
    )]
    Stat {
        pid: u32,
        /// Print one line per interval until the process exits.
        #[arg(long)]
        watch: bool,
        /// Time between --watch lines: whole milliseconds or seconds (500ms, 2s), 100ms or more.
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "1s",
            value_parser = stat::interval_arg,
            requires = "watch"
        )]
        interval: std::time::Duration,
        /// Stop --watch after N lines.
        #[arg(
            long,
            value_name = "N",
            value_parser = clap::value_parser!(u64).range(1..),
            requires = "watch"
        )]
        count: Option<u64>,
    },
    /// Coordinate a container's processes: purge the oldest volatile data of any of them first.
    #[command(
        after_help = "Runs in the foreground until SIGINT or SIGTERM. Processes using vrange \
        connect when the socket exists (VRANGE_COORDINATOR=PATH|off in their environment \
        overrides where they look); without a coordinator each purges on its own."
    )]
    Daemon(coord::DaemonArgs),
    /// A live view of a coordinator's participants: volatile, pinned, purged, requests obeyed.
    Top(coord::TopArgs),
    /// A short tour: mark data volatile, create real pressure, show what was purged and saved.
    Demo(demo::DemoArgs),
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
            interval,
            count,
        } => stat::main(pid, watch, interval, count),
        Command::Daemon(args) => coord::daemon(args),
        Command::Top(args) => coord::top(args),
        Command::Demo(args) => demo::main(&args),
        Command::Features => {
            print!("{}", vrange::features());
            0
        }
        Command::Man { dir } => man::main(Cli::command(), &dir),
    };
    std::process::exit(code);
}
