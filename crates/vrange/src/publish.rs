//! Publishing this process's statistics for other processes (`vrange stat PID`, `vrange run`):
//! a small text file, `vrange-<pid>.stats`, of `key=value` lines, in a directory private to
//! the user. The reclaimer thread rewrites it at most every 250 ms (a new file and a rename, so
//! readers never see half a file), and an exit handler acts a last time.
//!
//! | `VRANGE_STATS_DIR` | directory | checks | at exit | stale files removed |
//! |---|---|---|---|---|
//! | unset or empty | `/dev/shm/vrange-<euid>`, made with mode 0700 on first use | owned by the euid, mode 0700 or stricter | the file is removed | dead processes' files, and `.tmp` files older than a minute |
//! | an absolute path | that directory (never created) | owned by the euid, not writable by group or others | the final snapshot is kept | `.tmp` files older than a minute |
//! | `off` | none: nothing is published | | | |
//!
//! A directory that fails its checks (a symbolic link, another owner, a mode that lets others
//! in, a relative path) is not used: this is said once on stderr (for the default directory
//! only when the refusal is one of those, not for a missing `/dev/shm`), and nothing is
//! published. Every file operation is relative to the descriptor the checks were made on, and
//! none follows a symbolic link: the temporary file is created with `O_EXCL | O_NOFOLLOW`
//! (`.vrange-<pid>.<n>.tmp`, mode 0600, the next `n` when a name is taken) and renamed over
//! `vrange-<pid>.stats`, which replaces whatever entry had that name instead of writing
//! through it. The directory is open only while one file is written (see `sys::statsdir`).
//!
//! Stale files are those of processes that are gone, or whose recorded `start_ticks` is not the
//! start of the live process with that pid (a killed process whose pid was reused). The first
//! write of each publisher and every reader ([`read`], [`sweep`]) removes them; in a directory
//! named by `VRANGE_STATS_DIR` the final snapshots are kept for whoever set it (`vrange run`
//! sums up a process tree that way, in a fresh private directory of its own).
//!
//! Why `/dev/shm` and not `$XDG_RUNTIME_DIR`: a reader finds a process's file only if both
//! compute the same directory, and the two often disagree about `XDG_RUNTIME_DIR` (services,
//! cron jobs, `sudo` and `su` shells have none or another user's); `/dev/shm` is a memory-backed
//! file system on every Linux system. Its drawback, that another user can create
//! `/dev/shm/vrange-<uid>` first, only stops publishing (reported as above); it cannot redirect
//! a write.
//!
//! Readers look in the directory of the process's effective uid (from /proc/PID/status), so
//! root reading another user's process reads `/dev/shm/vrange-<that uid>`, which must be owned
//! by that uid; other users cannot read it at all (mode 0700). A reader with `VRANGE_STATS_DIR`
//! set looks there instead.
//!
//! Processes in different pid namespaces must not share a directory (each would take the
//! other's files for stale); containers have a `/dev/shm` of their own.
//!
//! Only processes whose reclaimer runs publish (any managed or hybrid memory, or vrange-malloc).
//! Never runs on a mark or unmark path. A fork child inherits the exit handler, which acts for
//! the child's own pid.

use crate::stats::Stats;
use std::fmt::{self, Write as _};
use std::io::{self, Write as _};
use std::path::PathBuf;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use vrange_sys::procfs;
use vrange_sys::statsdir::{self, PrivateDir, Refusal};

const INTERVAL_NS: u64 = 250_000_000;
/// A temporary file this old was left by a writer that died between create and rename.
const TMP_MAX_AGE_SECS: i64 = 60;
/// Taken temporary names skipped before a write gives up.
const TMP_ATTEMPTS: u32 = 64;

static LAST: AtomicU64 = AtomicU64::new(0);
static EXIT_HOOK: AtomicBool = AtomicBool::new(false);
static SWEPT: AtomicBool = AtomicBool::new(false);
static REFUSAL_SAID: AtomicBool = AtomicBool::new(false);
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);
/// Set by the exit handler: the reclaimer writes no more.
static EXITING: AtomicBool = AtomicBool::new(false);
/// The pid of the process whose reclaimer is writing now (0: none). A pid, not a flag, because
/// a fork child inherits it set if the parent was writing at the time, and must not wait.
static WRITER: AtomicU32 = AtomicU32::new(0);
/// How long the exit handler waits for the reclaimer's write in progress (1 ms steps).
const EXIT_WAIT_MS: u32 = 100;

/// The default directory of user `uid`'s statistics files.
pub fn default_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/vrange-{uid}"))
}

/// Where statistics files of processes of user `owner` are, as this process sees it.
struct Location {
    path: PathBuf,
    /// Named by `VRANGE_STATS_DIR` (then owned by us, whoever `owner` was).
    explicit: bool,
    owner: u32,
}

/// `None`: `VRANGE_STATS_DIR=off`.
fn location(owner: u32) -> Option<Location> {
    match std::env::var_os("VRANGE_STATS_DIR") {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(Location {
            path: PathBuf::from(v),
            explicit: true,
            owner: statsdir::effective_uid(),
        }),
        _ => Some(Location {
            path: default_dir(owner),
            explicit: false,
            owner,
        }),
    }
}

impl Location {
    /// Opens the directory after its checks; `create` makes the default one if missing.
    fn open(&self, create: bool) -> Result<PrivateDir, Refusal> {
        // Nobody else may look into the default directory; a directory the user chose need
        // only keep others from writing.
        let forbidden = if self.explicit { 0o022 } else { 0o077 };
        PrivateDir::open(&self.path, self.owner, forbidden, create && !self.explicit)
    }

    /// The directory as the user would recognise it.
    fn label(&self) -> String {
        if self.explicit {
            format!("VRANGE_STATS_DIR={}", self.path.display())
        } else {
            self.path.display().to_string()
        }
    }

    fn unavailable(&self, why: Refusal) -> Unavailable {
        match why {
            Refusal::Missing if !self.explicit => Unavailable::NotPublished(self.path.clone()),
            Refusal::Io(e) => Unavailable::Directory(format!(
                "cannot open {}: {}",
                self.label(),
                statsdir::plain(&e)
            )),
            why => Unavailable::Directory(format!(
                "{} is not a private directory ({why})",
                self.label()
            )),
        }
    }
}

/// Why [`read`] has no statistics for a process.
#[derive(Debug)]
#[non_exhaustive]
pub enum Unavailable {
    /// `VRANGE_STATS_DIR=off` in the reading process.
    Off,
    /// The directory could not be used; the text says which and why.
    Directory(String),
    /// There is no current file of the process in this directory.
    NotPublished(PathBuf),
}

impl Unavailable {
    /// Whether the process has simply published nothing (as opposed to: it could not be seen).
    pub fn is_absent(&self) -> bool {
        matches!(self, Unavailable::NotPublished(_))
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::Off => f.write_str("statistics not looked for (VRANGE_STATS_DIR=off)"),
            Unavailable::Directory(why) => write!(f, "statistics not read: {why}"),
            Unavailable::NotPublished(dir) => {
                write!(f, "no statistics published in {}", dir.display())
            }
        }
    }
}

/// Renders a snapshot as `key=value` lines.
pub fn render(pid: u32, s: &Stats) -> String {
    let a = &s.allocator;
    let mut out = String::with_capacity(1024);
    let fields: [(&str, u64); 25] = [
        ("pid", u64::from(pid)),
        (
            "start_ticks",
            vrange_sys::procfs::start_ticks(Some(pid)).unwrap_or(0),
        ),
        ("volatile_ranges", s.volatile_ranges),
        ("volatile_bytes", s.volatile_bytes),
        ("armed_bytes", s.armed_bytes),
        ("purged_bytes", s.purged_bytes),
        ("pinned_bytes", s.pinned_bytes),
        ("purged_total_bytes", s.purged_total_bytes),
        ("armed_total_bytes", s.armed_total_bytes),
        ("reserve_bytes", s.reserve_bytes),
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
        ("coordinated", u64::from(s.coordinator.connected)),
        ("coordinator_requests", s.coordinator.requests),
        ("coordinator_freed_bytes", s.coordinator.bytes),
        ("page_size", crate::page_size() as u64),
        ("time_ns", vrange_sys::clock::now_ns()),
    ];
    for (k, v) in fields {
        let _ = writeln!(out, "{k}={v}");
    }
    out
}

/// The published statistics of live process `pid`, from the directory of its effective uid
/// (or `VRANGE_STATS_DIR`). Removes stale files there first (see the module documentation).
///
/// # Errors
/// [`Unavailable`]: publishing is off here, the directory cannot be used (not private, or not
/// readable by this user), or the process has no current file.
pub fn read(pid: u32) -> Result<Vec<(String, u64)>, Unavailable> {
    let owner = procfs::euid_of(pid).unwrap_or_else(|_| statsdir::effective_uid());
    let loc = location(owner).ok_or(Unavailable::Off)?;
    let dir = loc.open(false).map_err(|why| loc.unavailable(why))?;
    sweep_in(&dir, loc.explicit);
    let name = file_name(pid);
    let absent = || Unavailable::NotPublished(loc.path.clone());
    let values = parse(&dir.read(&name).map_err(|_| absent())?);
    if recorded_start(&values) != procfs::start_ticks(Some(pid)).ok() {
        return Err(absent());
    }
    Ok(values)
}

/// Removes the stale statistics files (see the module documentation) from this user's
/// directory, if it has one.
pub fn sweep() {
    let Some(loc) = location(statsdir::effective_uid()) else {
        return;
    };
    if let Ok(dir) = loc.open(false) {
        sweep_in(&dir, loc.explicit);
    }
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

fn file_name(pid: u32) -> String {
    format!("vrange-{pid}.stats")
}

/// The pid of a statistics file name (`vrange-<digits>.stats`).
fn pid_of(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("vrange-")?.strip_suffix(".stats")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn is_temporary(name: &str) -> bool {
    name.starts_with(".vrange-") && name.ends_with(".tmp")
}

/// The recorded start of the process that wrote `values`.
fn recorded_start(values: &[(String, u64)]) -> Option<u64> {
    values
        .iter()
        .find(|(k, _)| k == "start_ticks")
        .map(|(_, v)| *v)
}

/// Removes stale files from `dir`; with `keep_snapshots` only abandoned temporary files.
fn sweep_in(dir: &PrivateDir, keep_snapshots: bool) {
    let Ok(entries) = dir.entries() else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    for e in entries {
        let stale = match pid_of(&e.name) {
            Some(pid) => !keep_snapshots && !is_current(dir, &e.name, pid),
            None => is_temporary(&e.name) && now - e.modified > TMP_MAX_AGE_SECS,
        };
        if stale {
            let _ = dir.remove(&e.name);
        }
    }
}

/// Whether file `name` of `dir` is the current file of live process `pid`.
fn is_current(dir: &PrivateDir, name: &str, pid: u32) -> bool {
    let Ok(live) = procfs::start_ticks(Some(pid)) else {
        return false;
    };
    // An entry that is not a readable regular file (a symbolic link, a FIFO) is not current.
    dir.read(name)
        .is_ok_and(|text| recorded_start(&parse(&text)) == Some(live))
}

/// Says once per process why a directory is not used. For the default directory only a refusal
/// that means someone else's hand is said; a system without a usable /dev/shm stays quiet.
fn say_refusal(loc: &Location, why: &Refusal) {
    let worth_saying = loc.explicit || !matches!(why, Refusal::Io(_) | Refusal::Missing);
    if worth_saying && !REFUSAL_SAID.swap(true, Relaxed) {
        // The reclaimer's table is its own: its 2 is not the program's stderr.
        let line = format!(
            "vrange: {} is not a private directory ({why}); not publishing\n",
            loc.label()
        );
        vrange_sys::fd::write_stderr(line.as_bytes());
    }
}

/// Creates the next free temporary name in `dir`.
fn create_temporary(dir: &PrivateDir, pid: u32) -> Option<(String, std::fs::File)> {
    for _ in 0..TMP_ATTEMPTS {
        let name = format!(".vrange-{pid}.{}.tmp", TMP_SEQ.fetch_add(1, Relaxed));
        match dir.create_new(&name) {
            Ok(file) => return Some((name, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(_) => return None,
        }
    }
    None
}

fn write_now() -> Option<()> {
    let loc = location(statsdir::effective_uid())?;
    let dir = match loc.open(true) {
        Ok(dir) => dir,
        Err(why) => {
            say_refusal(&loc, &why);
            return None;
        }
    };
    if !SWEPT.swap(true, Relaxed) {
        sweep_in(&dir, loc.explicit);
    }
    let pid = std::process::id();
    let text = render(pid, &crate::stats());
    let (tmp, mut file) = create_temporary(&dir, pid)?;
    let written = file.write_all(text.as_bytes());
    drop(file);
    if written
        .and_then(|_| dir.replace(&tmp, &file_name(pid)))
        .is_err()
    {
        let _ = dir.remove(&tmp);
        return None;
    }
    Some(())
}

/// Called when the reclaimer starts: installs the exit handler (once), so that even a process
/// that ends before the first tick leaves its final snapshot.
pub(crate) fn started() {
    if location(statsdir::effective_uid()).is_some() && !EXIT_HOOK.swap(true, Relaxed) {
        let _ = vrange_sys::process::at_exit(at_exit);
    }
}

/// Called by the reclaimer on every tick: rewrites the file if the last write is old enough.
pub(crate) fn tick(now: u64) {
    if now.saturating_sub(LAST.load(Relaxed)) < INTERVAL_NS {
        return;
    }
    LAST.store(now, Relaxed);
    // With the exit handler's stores and loads in the opposite order (all SeqCst), either this
    // sees EXITING or the handler sees WRITER and waits: a write never lands after the handler
    // removed the file, or over the final snapshot.
    WRITER.store(std::process::id(), SeqCst);
    if !EXITING.load(SeqCst) {
        let _ = write_now();
    }
    WRITER.store(0, SeqCst);
}

extern "C" fn at_exit() {
    EXITING.store(true, SeqCst);
    let pid = std::process::id();
    for _ in 0..EXIT_WAIT_MS {
        if WRITER.load(SeqCst) != pid {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let Some(loc) = location(statsdir::effective_uid()) else {
        return;
    };
    if loc.explicit {
        let _ = write_now();
    } else if let Ok(dir) = loc.open(false) {
        let _ = dir.remove(&file_name(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_statistics_and_temporary_names_are_recognised() {
        assert_eq!(pid_of("vrange-123.stats"), Some(123));
        for other in [
            "vrange-.stats",
            "vrange-+1.stats",
            "vrange-12a.stats",
            "vrange-1.stats.tmp",
            "xvrange-1.stats",
            ".vrange-1.stats",
        ] {
            assert_eq!(pid_of(other), None, "{other}");
        }
        assert!(is_temporary(".vrange-7.3.tmp"));
        assert!(is_temporary(".vrange-7.stats.tmp"));
        assert!(!is_temporary("vrange-7.stats"));
    }
}
