//! `vrange daemon` (the coordinator, in the foreground) and `vrange top` (its participants,
//! live).

use crate::table::Table;
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use vrange::coordination::Row;
use vrange_coordinator::{MetricsAddr, Options, Scope, Shared};

#[derive(Args)]
pub struct DaemonArgs {
    /// Socket to listen on (default: /run/vrange/coordinator.sock as root, else
    /// /dev/shm/vrange-<uid>/coordinator.sock: where processes look).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The memory cgroup directory to coordinate (default: the daemon's own).
    #[arg(long, conflicts_with = "machine")]
    cgroup: Option<PathBuf>,
    /// Coordinate the whole machine (MemAvailable, /proc/pressure/memory).
    #[arg(long)]
    machine: bool,
    /// Headroom to keep (e.g. 64M); default: the limit / 16, between 4 and 256 MiB.
    #[arg(long, value_name = "SIZE", value_parser = crate::size_arg)]
    headroom: Option<u64>,
    /// How often to read the headroom between pressure events.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = crate::stat::interval_arg)]
    interval: Duration,
    /// Serve Prometheus metrics at a loopback ADDRESS:PORT or unix:/PATH.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<MetricsAddr>,
}

/// Runs the coordinator until SIGINT or SIGTERM.
pub fn daemon(args: DaemonArgs) -> i32 {
    let mut opts = Options::default();
    if let Some(s) = args.socket {
        opts.socket = s;
    }
    if args.machine {
        opts.scope = Scope::Machine;
    } else if let Some(cg) = args.cgroup {
        opts.scope = Scope::Cgroup(cg);
    }
    opts.headroom = args.headroom;
    opts.interval = args.interval;
    opts.metrics = args.metrics;
    let shared = Shared::default();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, shared.stop.clone()) {
            eprintln!("vrange daemon: cannot handle signal {sig}: {e}");
            return 1;
        }
    }
    let scope = match &opts.scope {
        Scope::Machine => "the machine".to_string(),
        Scope::Cgroup(p) => format!("cgroup {}", p.display()),
    };
    eprintln!(
        "vrange daemon: coordinating {scope} at {}{}",
        opts.socket.display(),
        opts.metrics
            .as_ref()
            .map(|m| format!(", metrics at {m:?}"))
            .unwrap_or_default()
    );
    match vrange_coordinator::run(&opts, &shared) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("vrange daemon: {e}");
            1
        }
    }
}

/// A column `vrange top` sorts by (largest first; pid and name ascending).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SortKey {
    Volatile,
    Pinned,
    Purged,
    Obeyed,
    Freed,
    Pid,
    Name,
}

#[derive(Args)]
pub struct TopArgs {
    /// The coordinator's socket (default: the one `vrange daemon` would use).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The column to sort by.
    #[arg(long, value_enum, default_value = "volatile")]
    sort: SortKey,
    /// Time between refreshes.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = crate::stat::interval_arg)]
    interval: Duration,
    /// Print one snapshot and exit.
    #[arg(long)]
    once: bool,
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1 << 20) as f64)
}

fn name(r: &Row) -> String {
    String::from_utf8_lossy(&r.name)
        .trim_end_matches('\0')
        .to_string()
}

fn sort(rows: &mut [Row], key: SortKey) {
    match key {
        SortKey::Pid => rows.sort_by_key(|r| r.pid),
        SortKey::Name => rows.sort_by_key(name),
        _ => rows.sort_by_key(|r| {
            std::cmp::Reverse(match key {
                SortKey::Pinned => r.pinned,
                SortKey::Purged => r.purged,
                SortKey::Obeyed => r.obeyed,
                SortKey::Freed => r.freed,
                _ => r.volatile,
            })
        }),
    }
}

/// Shows the coordinator's participants: once, or refreshed until interrupted (the screen is
/// redrawn when standard output is a terminal).
pub fn top(args: TopArgs) -> i32 {
    use std::io::IsTerminal;
    let socket = args
        .socket
        .unwrap_or_else(vrange_coordinator::default_socket);
    let tty = std::io::stdout().is_terminal();
    loop {
        let (status, mut rows) = match vrange_coordinator::query(&socket) {
            Ok(answer) => answer,
            Err(e) => {
                eprintln!("vrange top: no coordinator at {}: {e}", socket.display());
                return 1;
            }
        };
        sort(&mut rows, args.sort);
        let mut t = Table::new(&[
            "PID",
            "NAME",
            "VOLATILE MiB",
            "PINNED MiB",
            "PURGED MiB",
            "OBEYED",
            "FREED MiB",
            "QUIET ms",
            "STATE",
        ]);
        for r in &rows {
            t.row(vec![
                r.pid.to_string(),
                name(r),
                mib(r.volatile),
                mib(r.pinned),
                mib(r.purged),
                r.obeyed.to_string(),
                mib(r.freed),
                r.quiet_ms.to_string(),
                if r.responsive == 1 { "ok" } else { "late" }.to_string(),
            ]);
        }
        if tty && !args.once {
            print!("\x1b[H\x1b[2J");
        }
        let limit = if status.limit == 0 {
            "no limit".to_string()
        } else {
            format!("{} of {} MiB", mib(status.headroom), mib(status.limit))
        };
        println!(
            "vrange top: {} participants at {}; headroom {limit}; rounds {}, requests {}, \
             freed {} MiB, refused {}",
            status.participants,
            socket.display(),
            status.rounds,
            status.requests,
            mib(status.freed),
            status.refused
        );
        t.print();
        if args.once {
            return 0;
        }
        if !tty {
            println!();
        }
        std::thread::sleep(args.interval);
    }
}
