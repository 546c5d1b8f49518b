//! `vrange stat PID`: what a process's memory really is. RSS alone misleads once pages are
//! lazily freed (they count in RSS until the kernel takes them), so this shows LazyFree and
//! page-table memory beside it, and the process's vrange statistics when it publishes them
//! (see `vrange::publish`). `--watch` prints the same values as a time series, one aligned
//! line per interval with the wall-clock time and the seconds elapsed.
//!
//! Exit status: 0 when everything was read, 1 when there is no such process, 3 when the process
//! exists but this user may not read its memory (/proc/PID/smaps_rollup needs the same user or
//! root); what could be read is printed all the same. 2 is a usage error (clap's). `--watch`
//! ends with status 0 when the process exits or after `--count` lines, and when interrupted
//! (SIGINT) prints a last line, then dies of the signal as an interrupted program should.

use crate::clock::Local;
use crate::table::Table;
use std::io::{self, Write as _};
use std::time::{Duration, Instant};
use vrange_sys::procfs::{self, Ids, Smaps, Status};

/// The exit status for a process whose memory this user may not read.
pub const NOT_PERMITTED: i32 = 3;

/// The shortest `--interval`: each line reads /proc/PID/smaps_rollup, which walks the whole
/// address space of the process under its memory-map lock.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The longest `--interval`, a day: longer is surely a typing error.
const MAX_INTERVAL: Duration = Duration::from_secs(86_400);

/// `--interval`: a whole number of milliseconds or seconds, `500ms` or `2s`, from
/// [`MIN_INTERVAL`] to [`MAX_INTERVAL`]. Strict, like the size grammar: no fraction, no space,
/// a unit always.
pub fn interval_arg(s: &str) -> Result<Duration, String> {
    duration_arg(s, MIN_INTERVAL)
}

/// A duration flag in the grammar of [`interval_arg`], at least `min` and at most a day.
pub fn duration_arg(s: &str, min: Duration) -> Result<Duration, String> {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &s[digits.len()..];
    let n: u64 = if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse().map_err(|_| "too large".to_string())?
    } else {
        return Err("a whole number with a unit: ms or s (500ms, 2s)".into());
    };
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "" => return Err(format!("a unit is needed: {n}ms or {n}s")),
        u => return Err(format!("unknown unit {u:?}: ms or s (500ms, 2s)")),
    };
    if d < min {
        return Err(format!("at least {}ms", min.as_millis()));
    }
    if d > MAX_INTERVAL {
        return Err(format!("at most {}s", MAX_INTERVAL.as_secs()));
    }
    Ok(d)
}

/// "500ms", "2s".
fn interval_text(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// What one of process `pid`'s /proc files read as: `Ok(None)` when the process is gone, the
/// error in words (naming `file`) when it could not be read.
fn proc_read<T>(pid: u32, file: &str, read: io::Result<T>) -> Result<Option<T>, String> {
    match read {
        Ok(v) => Ok(Some(v)),
        Err(e) if procfs::is_gone(&e) => Ok(None),
        Err(e) => {
            let why = match e.raw_os_error() {
                Some(libc::EACCES | libc::EPERM) => refusal(pid),
                _ => String::new(),
            };
            Err(format!(
                "cannot read {}: {}{why}",
                procfs::path(Some(pid), file),
                vrange_sys::statsdir::plain(&e)
            ))
        }
    }
}

/// CAP_SYS_PTRACE, bit 19 of the capability sets in /proc/PID/status.
const CAP_SYS_PTRACE: u32 = 19;

/// Why the kernel refused to let this process read process `pid`'s memory map, in words:
/// /proc/PID/smaps_rollup (like maps, environ, mem) passes the ptrace access check in read
/// mode (`PTRACE_MODE_READ_FSCREDS`, ptrace(2) "Ptrace access mode checking"). It allows a
/// caller whose filesystem uid and gid equal every uid and gid (real, effective, saved) of a
/// dumpable target; anything else needs CAP_SYS_PTRACE in the target's user namespace, and a
/// security module (AppArmor, SELinux) may refuse even then. Yama's `ptrace_scope` restricts
/// attaching only, not this read. Root is not enough by itself: a container or a service
/// often runs as root without CAP_SYS_PTRACE.
fn refusal(pid: u32) -> String {
    let ours = procfs::status(None).unwrap_or_default();
    let theirs = procfs::status(Some(pid)).unwrap_or_default();
    let our_caps = ours.cap_eff;
    let ptrace = our_caps.map(|c| c & (1 << CAP_SYS_PTRACE) != 0);
    // The capability module's rule: without CAP_SYS_PTRACE, the caller's effective set must
    // hold every capability the target may use.
    let more_caps = match (theirs.cap_prm, our_caps) {
        (Some(t), Some(o)) if t & !o != 0 => format!(
            "; it holds capabilities this process lacks (mask {:#x})",
            t & !o
        ),
        _ => String::new(),
    };
    // The security modules in force, when securityfs says.
    let lsm = std::fs::read_to_string("/sys/kernel/security/lsm")
        .map(|l| format!(" (active here: {})", l.trim()))
        .unwrap_or_default();
    let (Some(our_uid), Some(our_gid)) = (ours.uid, ours.gid) else {
        return String::new();
    };
    let (Some(uid), Some(gid)) = (theirs.uid, theirs.gid) else {
        return String::new();
    };
    // The filesystem ids are the caller's that count; all three of the target's must match.
    let (fsuid, fsgid) = (our_uid.filesystem, our_gid.filesystem);
    let all = |ids: Ids, id: u32| {
        [ids.real, ids.effective, ids.saved]
            .iter()
            .all(|&i| i == id)
    };
    let same = all(uid, fsuid) && all(gid, fsgid);
    let who = |ids: Ids| {
        if all(ids, ids.real) {
            format!("{}", ids.real)
        } else {
            format!(
                "{} (effective {}, saved {})",
                ids.real, ids.effective, ids.saved
            )
        }
    };
    let theirs = format!("pid {pid} runs as uid {} gid {}", who(uid), who(gid));
    let check = "the kernel's ptrace access check (read mode) refused";
    match (same, ptrace) {
        (false, Some(false)) => {
            let root = if fsuid == 0 {
                " (root, but with CAP_SYS_PTRACE dropped, as containers and many services run)"
            } else {
                ""
            };
            format!(
                ": {check}: {theirs}{more_caps}, this process as uid {fsuid} gid {fsgid} \
                 without CAP_SYS_PTRACE{root}; run as uid {} gid {}, or with CAP_SYS_PTRACE",
                uid.effective, gid.effective
            )
        }
        (true, Some(false)) if !more_caps.is_empty() => format!(
            ": {check}: {theirs}, as this process does{more_caps}; reading it needs those \
             capabilities or CAP_SYS_PTRACE"
        ),
        (true, Some(false)) => format!(
            ": {check}: {theirs}, as this process does, but it is not dumpable (a \
             set-user-ID or file-capability program, or one that called \
             prctl(PR_SET_DUMPABLE, 0)), or it is in another user namespace; reading it needs \
             CAP_SYS_PTRACE"
        ),
        (_, Some(true)) => format!(
            ": {check} although this process has CAP_SYS_PTRACE ({theirs}{more_caps}): the \
             process is in a user namespace that capability does not reach, or a security \
             module (AppArmor, SELinux, Landlock, a BPF LSM){lsm} refused"
        ),
        (_, None) => format!(": {check} ({theirs})"),
    }
}

/// One look at a process.
struct Sample {
    pid: u32,
    /// /proc/PID/status; `None` when it could not be read (then `denied` says why).
    status: Option<Status>,
    /// /proc/PID/smaps_rollup; `None` when it could not be read (then `denied` says why).
    rollup: Option<Smaps>,
    denied: Option<String>,
    /// The published statistics; `None` when not looked for (a kernel thread, an exited
    /// process, or status could not be read).
    stats: Option<Result<Vec<(String, u64)>, vrange::published::Unavailable>>,
}

impl Sample {
    /// Reads the process; `None` when it is gone.
    fn read(pid: u32) -> Option<Sample> {
        let mut s = Sample {
            pid,
            status: None,
            rollup: None,
            denied: None,
            stats: None,
        };
        match proc_read(pid, "status", procfs::status(Some(pid))) {
            Ok(status) => s.status = Some(status?),
            Err(why) => {
                s.denied = Some(why);
                return Some(s);
            }
        }
        if s.rss_kb().is_none() {
            return Some(s);
        }
        match proc_read(pid, "smaps_rollup", procfs::smaps_rollup(Some(pid))) {
            Ok(rollup) => s.rollup = Some(rollup?),
            Err(why) => s.denied = Some(why),
        }
        s.stats = Some(vrange::published::read(s.pid));
        Some(s)
    }

    fn name(&self) -> &str {
        self.status.as_ref().map_or("", |s| s.name.as_str())
    }

    /// The memory lines of status; `None` for a kernel thread (or status unread).
    fn memory(&self) -> Option<&Status> {
        self.status.as_ref().filter(|s| s.address_space)
    }

    /// VmRSS; `None` for a kernel thread (or status unread).
    fn rss_kb(&self) -> Option<u64> {
        self.memory().map(|s| s.vm_rss_kb)
    }

    /// A published statistic, in bytes.
    fn stat(&self, key: &str) -> Option<u64> {
        let v = self.stats.as_ref()?.as_ref().ok()?;
        Some(v.iter().find(|(n, _)| n == key).map_or(0, |(_, x)| *x))
    }

    /// The report in words, as `vrange stat PID` prints it.
    fn text(&self) -> String {
        let (pid, name) = (self.pid, self.name());
        if self.denied.is_some() && self.status.is_none() {
            return String::new();
        }
        let Some(mem) = self.memory() else {
            if self.status.as_ref().is_some_and(|s| s.exited) {
                return format!("pid {pid} ({name}): exited, not yet reaped: no user memory\n");
            }
            return format!("pid {pid} ({name}): a kernel thread, no user memory\n");
        };
        let mib = |k: u64| format!("{:.1}", k as f64 / 1024.0);
        let mut out = format!(
            "pid {pid} ({name}): RSS {} MiB (anon {}, file {}), ",
            mib(mem.vm_rss_kb),
            mib(mem.rss_anon_kb),
            mib(mem.rss_file_kb),
        );
        if let Some(r) = &self.rollup {
            out.push_str(&format!(
                "LazyFree {} MiB, AnonHugePages {} MiB, ",
                mib(r.lazy_free_kb),
                mib(r.anon_huge_kb),
            ));
        }
        out.push_str(&format!("page tables (VmPTE) {} MiB\n", mib(mem.vm_pte_kb)));
        if let Some(why) = &self.denied {
            out.push_str(&format!("  LazyFree and AnonHugePages unknown: {why}\n"));
        }
        match &self.stats {
            None => {}
            // Whether a process this user may not read uses vrange is not for us to guess.
            Some(Err(e)) if e.is_absent() && self.denied.is_none() => out.push_str(&format!(
                "  vrange: {e} (the process runs no vrange reclaimer: no managed or hybrid memory, \
                 no vrange-malloc; or it publishes elsewhere, see VRANGE_STATS_DIR)\n"
            )),
            Some(Err(e)) => out.push_str(&format!("  vrange: {e}\n")),
            Some(Ok(_)) => {
                let get = |k: &str| self.stat(k).unwrap_or(0);
                let m = |b: u64| b as f64 / (1 << 20) as f64;
                out.push_str(&format!(
                    "  vrange: volatile {:.1} MiB (armed {:.1}, reserve {:.1}), not resident (purged or never touched) {:.1} MiB, pinned {:.1} MiB; purged in all {:.1} MiB; losses reported {}\n",
                    m(get("volatile_bytes")),
                    m(get("armed_bytes")),
                    m(get("reserve_bytes")),
                    m(get("purged_bytes")),
                    m(get("pinned_bytes")),
                    m(get("purged_total_bytes")),
                    get("losses_reported"),
                ));
                if get("coordinated") > 0 || get("coordinator_requests") > 0 {
                    out.push_str(&format!(
                        "  coordinator: {}; {} obeyed, {:.1} MiB freed for it\n",
                        if get("coordinated") > 0 {
                            "connected, it orders this process's purges"
                        } else {
                            "not connected now (purging on its own)"
                        },
                        crate::out::count(get("coordinator_requests"), "purge request", None),
                        m(get("coordinator_freed_bytes")),
                    ));
                }
                if get("alloc_allocations") > 0 {
                    out.push_str(&format!(
                        "  vrange-malloc: live {:.1} MiB, free {:.1} MiB of {:.1} MiB mapped; handed out: reused intact {:.1} MiB, fresh or purged {:.1} MiB (address space)\n",
                        m(get("alloc_allocated_bytes")),
                        m(get("alloc_free_bytes")),
                        m(get("alloc_mapped_bytes")),
                        m(get("alloc_reused_intact_bytes")),
                        m(get("alloc_zero_filled_bytes")),
                    ));
                }
            }
        }
        out
    }

    /// The values of one `--watch` line, in MiB ("–": not known, see the first report).
    fn values(&self) -> Vec<String> {
        let mib = |k: Option<u64>| k.map_or("–".into(), |k| format!("{:.1}", k as f64 / 1024.0));
        let stat = |key: &str| mib(self.stat(key).map(|b| b / 1024));
        vec![
            mib(self.rss_kb()),
            mib(self.rollup.map(|r| r.lazy_free_kb)),
            mib(self.rollup.map(|r| r.anon_huge_kb)),
            mib(self.memory().map(|s| s.vm_pte_kb)),
            stat("volatile_bytes"),
            stat("purged_bytes"),
            stat("purged_total_bytes"),
        ]
    }
}

/// The columns of `--watch`; sizes in MiB.
const COLUMNS: [&str; 9] = [
    "time",
    "elapsed",
    "RSS",
    "LazyFree",
    "AnonHuge",
    "VmPTE",
    "volatile",
    "purged",
    "purged total",
];

pub fn main(pid: u32, watch: bool, interval: Duration, count: Option<u64>) -> i32 {
    let Some(first) = Sample::read(pid) else {
        // A process killed before its exit handler ran leaves its file behind.
        vrange::published::sweep();
        eprintln!("vrange stat: no process {pid}");
        return 1;
    };
    if let Some(why) = &first.denied {
        print!("{}", first.text());
        eprintln!("vrange stat: {why}");
        return NOT_PERMITTED;
    }
    if !watch || first.rss_kb().is_none() {
        print!("{}", first.text());
        return 0;
    }
    self::watch(first, interval, count)
}

/// Why a wait ended.
enum Woke {
    Timeout,
    Interrupted,
}

/// Holds SIGINT pending (blocked) while watching, so that the wait between lines can end
/// on it and the last line be printed; [`Interrupt::wait`] takes it.
struct Interrupt {
    set: libc::sigset_t,
}

impl Interrupt {
    fn block() -> Interrupt {
        // SAFETY: all-zero bytes are a valid sigset_t, which sigemptyset then initialises.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a live local; blocking a signal in this (the only) thread changes
        // nothing but when SIGINT is delivered.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        Interrupt { set }
    }

    /// Waits until `deadline` or a SIGINT, whichever is first.
    fn wait(&self, deadline: Instant) -> Woke {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ts = libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            };
            // SAFETY: valid pointers to live locals; a null info pointer is allowed.
            let r = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
            if r == libc::SIGINT {
                return Woke::Interrupted;
            }
            // EAGAIN: the time is up; EINTR (another signal): wait for the rest.
            if Instant::now() >= deadline {
                return Woke::Timeout;
            }
        }
    }

    /// Dies of SIGINT (its default action), unless the signal is ignored here.
    fn resend(&self) {
        let _ = std::io::stdout().flush();
        // SAFETY: raising a signal blocked in this thread leaves it pending; unblocking
        // delivers it with the disposition this process inherited.
        unsafe {
            libc::raise(libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &self.set, std::ptr::null_mut());
        }
    }
}

/// `--watch`: a header once, then one line per interval, until the process exits (a last
/// line says so), `count` lines were printed, or SIGINT.
fn watch(first: Sample, interval: Duration, count: Option<u64>) -> i32 {
    let pid = first.pid;
    // The pid alone could name a new process once the watched one has exited.
    let started_as = procfs::start_ticks(Some(pid)).ok();
    let start = Instant::now();
    let stamp = || {
        [
            Local::now().time(),
            format!("{:.1}", start.elapsed().as_secs_f64()),
        ]
    };
    // Widths from the first line, with room for the values to grow.
    let mut table = Table::new(&COLUMNS);
    table.row(stamp().into_iter().chain(first.values()).collect());
    let layout = table.layout().widen(7);
    println!(
        "pid {pid} ({}): every {}, sizes in MiB (–: not published; see --help)",
        first.name(),
        interval_text(interval)
    );
    print!("{}", layout.header(&COLUMNS));
    let interrupt = Interrupt::block();
    let mut sample = Some(first);
    let mut lines = 0u64;
    loop {
        let now = stamp();
        let alive = sample
            .take()
            .filter(|_| procfs::start_ticks(Some(pid)).ok() == started_as);
        let Some(s) = alive else {
            print!(
                "{}",
                layout.line(&[now[0].as_str(), &now[1], &format!("pid {pid} has exited")])
            );
            return 0;
        };
        let mut cells = now.to_vec();
        cells.extend(s.values());
        print!("{}", layout.line(&cells));
        lines += 1;
        if count.is_some_and(|c| lines >= c) {
            return 0;
        }
        // The next point of the grid start + k × interval at least half an interval away: a
        // line that came late (a slow or loaded machine) is not followed at once by another.
        let soon = Instant::now() + interval / 2;
        let k = soon
            .saturating_duration_since(start)
            .as_nanos()
            .div_ceil(interval.as_nanos().max(1))
            .max(u128::from(lines));
        let next = start + interval * u32::try_from(k).unwrap_or(u32::MAX);
        if let Woke::Interrupted = interrupt.wait(next) {
            let now = stamp();
            print!(
                "{}",
                layout.line(&[now[0].as_str(), &now[1], "interrupted (SIGINT)"])
            );
            interrupt.resend();
            return 0;
        }
        sample = Sample::read(pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_grammar_is_strict() {
        assert_eq!(interval_arg("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(interval_arg("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(interval_arg("100ms"), Ok(MIN_INTERVAL));
        for bad in [
            "", "1", "1.5s", " 2s", "2 s", "2S", "2sec", "-1s", "99ms", "0s", "ms", "86401s",
        ] {
            assert!(interval_arg(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(interval_text(Duration::from_millis(200)), "200ms");
        assert_eq!(interval_text(Duration::from_secs(3)), "3s");
    }
}
