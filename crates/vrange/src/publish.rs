//! Publishing this process's statistics for other processes (`vrange stat PID`, `vrange run`):
//! a small text file, `vrange-<pid>.stats`, of `key=value` lines, in `VRANGE_STATS_DIR`
//! (default `/dev/shm`). The reclaimer thread rewrites it at most every 250 ms (a write to a
//! temporary file and a rename, so readers never see half a file), and an exit handler writes it
//! a last time. In the default directory the exit handler removes the file; in a directory named
//! by `VRANGE_STATS_DIR` it leaves the final snapshot for whoever set the variable (`vrange run`
//! aggregates a whole process tree that way). `VRANGE_STATS_DIR=off` publishes nothing.
//!
//! Only processes whose reclaimer runs publish (any managed or hybrid memory, or vrange-malloc).
//! Never runs on a mark or unmark path. A fork child inherits the exit handler, which acts for
//! the child's own pid.

use crate::stats::Stats;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};

const DEFAULT_DIR: &str = "/dev/shm";
const INTERVAL_NS: u64 = 250_000_000;

static LAST: AtomicU64 = AtomicU64::new(0);
static EXIT_HOOK: AtomicBool = AtomicBool::new(false);

/// The directory statistics files go to (`None`: publishing is off), and whether it was
/// chosen explicitly (then final snapshots are kept).
fn dir() -> Option<(PathBuf, bool)> {
    match std::env::var_os("VRANGE_STATS_DIR") {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some((PathBuf::from(v), true)),
        _ => Some((PathBuf::from(DEFAULT_DIR), false)),
    }
}

/// The statistics file of process `pid` in the default directory (or `VRANGE_STATS_DIR`).
pub fn stats_path(pid: u32) -> Option<PathBuf> {
    dir().map(|(d, _)| d.join(format!("vrange-{pid}.stats")))
}

/// Renders a snapshot as `key=value` lines.
pub fn render(pid: u32, s: &Stats) -> String {
    let a = &s.allocator;
    let mut out = String::with_capacity(1024);
    let fields: [(&str, u64); 21] = [
        ("pid", u64::from(pid)),
        (
            "start_ticks",
            crate::sys::procfs::start_ticks(Some(pid)).unwrap_or(0),
        ),
        ("volatile_ranges", s.volatile_ranges),
        ("volatile_bytes", s.volatile_bytes),
        ("armed_bytes", s.armed_bytes),
        ("purged_bytes", s.purged_bytes),
        ("pinned_bytes", s.pinned_bytes),
        ("purged_total_bytes", s.purged_total_bytes),
        ("armed_total_bytes", s.armed_total_bytes),
        ("losses_reported", s.losses_reported),
        ("reclaimer_running", u64::from(s.reclaimer_running)),
        ("alloc_allocated_bytes", a.allocated_bytes),
        ("alloc_free_bytes", a.free_bytes),
        ("alloc_mapped_bytes", a.mapped_bytes),
        ("alloc_reused_intact_bytes", a.reused_intact_bytes),
        ("alloc_zero_filled_bytes", a.zero_filled_bytes),
        ("alloc_allocations", a.allocations),
        ("alloc_frees", a.frees),
        (
            "purge_events",
            s.sources.iter().map(|x| x.purging_events).sum(),
        ),
        ("page_size", crate::page_size() as u64),
        ("time_ns", crate::sys::clock::now_ns()),
    ];
    for (k, v) in fields {
        let _ = writeln!(out, "{k}={v}");
    }
    out
}

/// The published statistics of live process `pid`: `None` when it publishes nothing, or when the
/// file is stale (left by a killed process whose pid was reused; it is removed then).
pub fn read(pid: u32) -> Option<Vec<(String, u64)>> {
    let path = stats_path(pid)?;
    let values = parse(&std::fs::read_to_string(&path).ok()?);
    let started = values
        .iter()
        .find(|(k, _)| k == "start_ticks")
        .map(|(_, v)| *v);
    if started != crate::sys::procfs::start_ticks(Some(pid)) {
        let _ = std::fs::remove_file(&path);
        return None;
    }
    Some(values)
}

/// Parses a file written by [`render`] (unknown lines are skipped).
pub fn parse(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.trim().to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn write_now() -> Option<()> {
    let (dir, _) = dir()?;
    let pid = std::process::id();
    let text = render(pid, &crate::stats());
    let path = dir.join(format!("vrange-{pid}.stats"));
    let tmp = dir.join(format!(".vrange-{pid}.stats.tmp"));
    std::fs::write(&tmp, text).ok()?;
    std::fs::rename(&tmp, &path).ok()
}

/// Called when the reclaimer starts: installs the exit handler (once), so that even a process
/// that ends before the first tick leaves its final snapshot.
pub(crate) fn started() {
    if dir().is_some() && !EXIT_HOOK.swap(true, Relaxed) {
        // SAFETY: a plain function valid for the program's life.
        unsafe { libc::atexit(at_exit) };
    }
}

/// Called by the reclaimer on every tick: rewrites the file if the last write is old enough.
pub(crate) fn tick(now: u64) {
    if now.saturating_sub(LAST.load(Relaxed)) < INTERVAL_NS {
        return;
    }
    LAST.store(now, Relaxed);
    let _ = write_now();
}

extern "C" fn at_exit() {
    let Some((dir, explicit)) = dir() else { return };
    if explicit {
        let _ = write_now();
    } else {
        let _ = std::fs::remove_file(dir.join(format!("vrange-{}.stats", std::process::id())));
    }
}
