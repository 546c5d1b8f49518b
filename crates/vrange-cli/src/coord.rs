//! `vrange daemon` (the coordinator, in the foreground) and `vrange top` (its participants,
//! live).

use crate::table::Table;
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use vrange::coordination::{Row, SharedRow};
use vrange_coordinator::{MetricsAddr, Options, Scope, Shared};

#[derive(Args)]
pub struct DaemonArgs {
    /// Socket to listen on (default: /run/vrange/coordinator.sock as root, else
    /// /dev/shm/vrange-UID/coordinator.sock: where processes look).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The memory cgroup directory to coordinate (default: the daemon's own).
    #[arg(long, conflicts_with = "machine")]
    cgroup: Option<PathBuf>,
    /// Coordinate the whole machine (MemAvailable, /proc/pressure/memory).
    #[arg(long)]
    machine: bool,
    /// Headroom to keep (e.g. 64M), below the limit; default: the limit / 16, between 4 and
    /// 256 MiB.
    #[arg(long, value_name = "SIZE", value_parser = crate::size_arg)]
    headroom: Option<u64>,
    /// How often to read the headroom between pressure events (10ms or more).
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = tick_arg)]
    interval: Duration,
    /// Serve Prometheus metrics at a loopback ADDRESS:PORT or unix:/PATH.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<MetricsAddr>,
    /// Label each participant's metrics with its pid too (by default program name and cgroup,
    /// which survive a restart; processes sharing both are summed).
    #[arg(long, requires = "metrics")]
    metrics_pid: bool,
    /// Proactive mode: while the scope's memory stall stays under --proactive-stall, free a
    /// step of its memory each second from the coldest volatile memory (and, on cgroup v2, the
    /// kernel's page cache); hold at once on a stall, pressure or refaults. Off by default.
    #[arg(long)]
    proactive: bool,
    /// The stall to keep under: percent of the time some task stalled on memory (PSI some).
    #[arg(long, value_name = "PERCENT", default_value = "0.1", requires = "proactive",
          value_parser = percent_arg)]
    proactive_stall: f64,
    /// Volatile memory idle at least this long is a candidate; younger memory never is.
    #[arg(long, value_name = "DURATION", default_value = "30s", requires = "proactive",
          value_parser = age_arg)]
    proactive_age: Duration,
    /// A step, in percent of the scope's usage.
    #[arg(long, value_name = "PERCENT", default_value = "1", requires = "proactive",
          value_parser = step_arg)]
    proactive_step: f64,
}

/// A percentage in 0..=100 (a decimal number).
fn percent_arg(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err("a number from 0 to 100 (0.1, 1)".into()),
    }
}

/// A step: a percentage above 0 and at most 100.
fn step_arg(s: &str) -> Result<f64, String> {
    percent_arg(s).and_then(|v| {
        if v > 0.0 {
            Ok(v)
        } else {
            Err("above 0".into())
        }
    })
}

fn age_arg(s: &str) -> Result<Duration, String> {
    crate::stat::duration_arg(s, Duration::ZERO)
}

fn tick_arg(s: &str) -> Result<Duration, String> {
    crate::stat::duration_arg(s, Duration::from_millis(10))
}

/// Runs the coordinator until SIGINT or SIGTERM. Options it cannot run with (a directory that
/// is not a memory cgroup, a headroom at or above the limit) exit 2 before anything is bound;
/// it says where it listens only once it does.
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
    opts.metrics_pid = args.metrics_pid;
    opts.proactive = args.proactive.then_some(vrange_coordinator::Proactive {
        stall_pct: args.proactive_stall,
        min_idle: args.proactive_age,
        step_pct: args.proactive_step,
        ..vrange_coordinator::Proactive::default()
    });
    match vrange_coordinator::check(&opts) {
        Ok(Some(warning)) => eprintln!("vrange daemon: warning: {warning}"),
        Ok(None) => {}
        Err(e) => {
            eprintln!("vrange daemon: {e}");
            return 2;
        }
    }
    let shared = Shared::default();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, shared.stop.clone()) {
            eprintln!("vrange daemon: cannot handle signal {sig}: {e}");
            return 1;
        }
    }
    let coordinator = match vrange_coordinator::Coordinator::bind(&opts) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vrange daemon: {e}");
            return 1;
        }
    };
    eprintln!(
        "vrange daemon: coordinating {} at {}{}",
        vrange_coordinator::describe(&opts.scope),
        opts.socket.display(),
        coordinator
            .metrics_addr()
            .map(|m| format!(", metrics at {m}"))
            .unwrap_or_default()
    );
    match coordinator.run(&shared) {
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

/// `n` and the noun in the right number: "1 participant", "2 participants".
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
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

/// The columns, in screen order, with the key that sorts by each (`<` and `>` move along them).
const KEYS: [(SortKey, char); 7] = [
    (SortKey::Pid, 'i'),
    (SortKey::Name, 'n'),
    (SortKey::Volatile, 'v'),
    (SortKey::Pinned, 'p'),
    (SortKey::Purged, 'u'),
    (SortKey::Obeyed, 'o'),
    (SortKey::Freed, 'f'),
];

/// One screen: the totals line and the table, sorted by `key`.
fn screen(socket: &std::path::Path, key: SortKey) -> Result<String, String> {
    let (status, mut rows, regions) = vrange_coordinator::query_all(socket)
        .map_err(|e| format!("no coordinator at {}: {e}", socket.display()))?;
    sort(&mut rows, key);
    let header = |name: &str, k: SortKey| {
        if std::mem::discriminant(&k) == std::mem::discriminant(&key) {
            format!("[{name}]")
        } else {
            name.to_string()
        }
    };
    let mut t = Table::new(&[
        &header("PID", SortKey::Pid),
        &header("NAME", SortKey::Name),
        &header("VOLATILE MiB", SortKey::Volatile),
        &header("PINNED MiB", SortKey::Pinned),
        &header("PURGED MiB", SortKey::Purged),
        &header("OBEYED", SortKey::Obeyed),
        &header("FREED MiB", SortKey::Freed),
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
    let limit = if status.limit == 0 {
        "no limit".to_string()
    } else {
        format!("{} of {} MiB", mib(status.headroom), mib(status.limit))
    };
    let proactive = if status.proactive == 0 {
        String::new()
    } else {
        format!(
            "proactive: saved {} MiB, target {} MiB, stalls {}\n",
            mib(status.proactive_saved),
            mib(status.proactive_target),
            status.proactive_stalls
        )
    };
    Ok(format!(
        "vrange top: {} at {}; headroom {limit}; rounds {}, requests {}, freed {} MiB, refused {}\n{proactive}{}{}",
        count(status.participants, "participant", "participants"),
        socket.display(),
        status.rounds,
        status.requests,
        mib(status.freed),
        status.refused,
        t.to_text(),
        shared_table(&regions)
    ))
}

/// The shared regions the coordinator holds, one row each (nothing without any): their bytes
/// by state in every process that maps them.
fn shared_table(regions: &[SharedRow]) -> String {
    if regions.is_empty() {
        return String::new();
    }
    let mut t = Table::new(&[
        "SHARED INODE",
        "MiB",
        "VOLATILE MiB",
        "PINNED MiB",
        "PURGED MiB",
        "HOLDERS",
        "PARTICIPANTS",
    ]);
    for r in regions {
        t.row(vec![
            r.ino.to_string(),
            mib(r.len),
            mib(r.volatile),
            mib(r.pinned),
            mib(r.purged),
            r.holders.to_string(),
            r.participants.to_string(),
        ]);
    }
    format!("\n{}", t.to_text())
}

/// Shows the coordinator's participants: once (`--once`, or when standard output is not a
/// terminal: one screen per interval), or live on a terminal like top(1): `<` and `>` move the
/// sort column, `i n v p u o f` pick one, `q` quits.
pub fn top(args: TopArgs) -> i32 {
    use std::io::IsTerminal;
    let socket = args
        .socket
        .unwrap_or_else(vrange_coordinator::default_socket);
    if args.once || !std::io::stdout().is_terminal() {
        loop {
            match screen(&socket, args.sort) {
                // Cut to COLUMNS when it is set, as top(1) does in batch mode.
                Ok(text) => print!("{}", crate::out::fit(&text, crate::out::columns())),
                Err(e) => {
                    eprintln!("vrange top: {e}");
                    return 1;
                }
            }
            if args.once {
                return 0;
            }
            println!();
            std::thread::sleep(args.interval);
        }
    }
    match live(&socket, args.sort, args.interval) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("vrange top: {e}");
            1
        }
    }
}

/// Restores the terminal however `live` ends.
struct RawScreen;

impl Drop for RawScreen {
    fn drop(&mut self) {
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::cursor::Show,
            crossterm::terminal::LeaveAlternateScreen
        );
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

fn live(socket: &std::path::Path, mut key: SortKey, interval: Duration) -> Result<(), String> {
    use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    use std::io::Write;
    crossterm::terminal::enable_raw_mode().map_err(|e| e.to_string())?;
    let _restore = RawScreen;
    crossterm::execute!(
        std::io::stdout(),
        crossterm::terminal::EnterAlternateScreen,
        crossterm::cursor::Hide
    )
    .map_err(|e| e.to_string())?;
    loop {
        let text = screen(socket, key)?;
        let mut out = std::io::stdout().lock();
        // Every line cut to the terminal's width, as top(1) does: a wrapped line scrolls the
        // screen.
        let text = format!("{text}\n<, > or i n v p u o f: sort   q: quit\n");
        let text = crate::out::fit(&text, crate::out::columns());
        let _ = write!(out, "\x1b[H\x1b[2J{}", text.replace('\n', "\r\n"));
        let _ = out.flush();
        drop(out);
        let deadline = std::time::Instant::now() + interval;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            if !event::poll(left).map_err(|e| e.to_string())? {
                break;
            }
            let Event::Key(k) = event::read().map_err(|e| e.to_string())? else {
                continue;
            };
            if k.kind != KeyEventKind::Press {
                continue;
            }
            let at = KEYS
                .iter()
                .position(|(s, _)| std::mem::discriminant(s) == std::mem::discriminant(&key))
                .unwrap_or(2);
            match k.code {
                KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                KeyCode::Char('<') | KeyCode::Left => key = KEYS[at.saturating_sub(1)].0,
                KeyCode::Char('>') | KeyCode::Right => key = KEYS[(at + 1).min(KEYS.len() - 1)].0,
                KeyCode::Char(c) => match KEYS.iter().find(|(_, k)| *k == c) {
                    Some((s, _)) => key = *s,
                    None => continue,
                },
                _ => continue,
            }
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::count;

    /// Issue 20: `vrange top` said "1 participants".
    #[test]
    fn one_participant_is_singular() {
        assert_eq!(count(1, "participant", "participants"), "1 participant");
        assert_eq!(count(0, "participant", "participants"), "0 participants");
        assert_eq!(count(2, "participant", "participants"), "2 participants");
    }
}
