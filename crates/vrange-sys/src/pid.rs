//! Processes by pid: who this process is, in words another process can check later, and
//! whether the process such words name has died. For pins that die with their holder (shared
//! regions record who holds each pin): a pin is released only when its holder is *certainly*
//! gone, so every doubt here answers "alive".
//!
//! Owns `kill(pid, 0)`. Reads `/proc/self/stat` without allocating ([`identity`] is
//! async-signal-safe: an unmark may claim a holder record); other processes' stat files
//! through `procfs`.
//!
//! A pid alone does not name a process: pids are reused, and a process in another pid
//! namespace sees another number. An [`Identity`] adds the start time (clock ticks after boot,
//! which a reused pid does not share) and the pid namespace (the inode of `/proc/PID/ns/pid`):
//! a record from another namespace is never judged.
//!
//! # References
//! proc(5) (`/proc/PID/stat` field 22, `/proc/PID/ns/`), kill(2) (signal 0), pid_namespaces(7).

/// A process as another process can check it later. Zero fields are unknown: a record with
/// an unknown namespace is never judged gone, one with an unknown start is judged by its pid
/// alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Identity {
    /// Its pid, in its own pid namespace.
    pub pid: u32,
    /// When it started, in clock ticks after boot (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
    /// The inode of its pid namespace (`/proc/PID/ns/pid`).
    pub pid_ns: u64,
}

/// This process's identity. Async-signal-safe: getpid, one stat(2), and `/proc/self/stat`
/// read through a descriptor held for the moment into a stack buffer. Without `/proc`, the
/// start and namespace are unknown (0).
pub fn identity() -> Identity {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    Identity {
        pid,
        start_ticks: own_start_ticks().unwrap_or(0),
        pid_ns: pid_ns(c"/proc/self/ns/pid").unwrap_or(0),
    }
}

/// The inode of the namespace file at `path`, if it can be stat'ed. Async-signal-safe.
fn pid_ns(path: &std::ffi::CStr) -> Option<u64> {
    // SAFETY: stat is plain data that stat(2) fills; path is NUL-terminated.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::stat(path.as_ptr(), &mut st) } == 0).then_some(st.st_ino)
}

/// Field 22 of `/proc/self/stat`, read without allocating.
fn own_start_ticks() -> Option<u64> {
    let file = crate::fd::open_transient_c(c"/proc/self/stat", libc::O_RDONLY).ok()?;
    // The file is one line far shorter than this (a 16-byte name and 50 numbers).
    let mut buf = [0u8; 1024];
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: the rest of buf is writable; the descriptor is open while `file` lives.
        let n = unsafe { libc::read(file.raw(), buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        match n {
            0 => break,
            n if n > 0 => len += n as usize,
            _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
            _ => return None,
        }
    }
    start_ticks_of(&buf[..len])
}

/// Field 22 (start time) of `/proc/PID/stat` text, counted after the command name's last `)`
/// (the name may hold spaces and parentheses). No allocation.
pub fn start_ticks_of(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    // Field 3 is the first after the name.
    let field = stat[close + 1..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .nth(22 - 3)?;
    let mut n = 0u64;
    for &d in field {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(n)
}

/// Whether process `pid` exists in this process's pid namespace: `Some(false)` when kill(2)
/// says no such process, `Some(true)` when it exists (signal 0 is never sent; EPERM means it
/// exists), `None` for any other answer.
fn exists(pid: u32) -> Option<bool> {
    let pid = libc::pid_t::try_from(pid).ok().filter(|&p| p > 0)?;
    // SAFETY: signal 0 checks only that the process exists and may be signalled.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return Some(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ESRCH) => Some(false),
        Some(libc::EPERM) => Some(true),
        _ => None,
    }
}

/// Whether the process `who` names has certainly died: it is in this process's pid namespace
/// and its pid names no process, a zombie (dead, not yet waited for; a zombie main thread
/// with other threads alive is alive), or a process that
/// started at another time (the pid was reused). Every doubt (another namespace, an unknown
/// namespace, a stat file this process may not read) answers `false`. Reads
/// `/proc/PID/stat`: allocates, and opens a descriptor for the moment.
pub fn is_gone(who: &Identity) -> bool {
    if who.pid == 0 || who.pid_ns == 0 || pid_ns(c"/proc/self/ns/pid") != Some(who.pid_ns) {
        return false;
    }
    match exists(who.pid) {
        Some(false) => return true,
        None => return false,
        Some(true) => {}
    }
    match crate::procfs::stat(Some(who.pid)) {
        Ok(s) if who.start_ticks != 0 && s.start_ticks != who.start_ticks => true,
        Ok(s) if s.state == 'X' => true,
        // A zombie main thread: the process is dead only if no other thread of it lives (a
        // main thread that called pthread_exit shows `Z` while its other threads still run
        // and use their pins). A task list that cannot be read is a doubt: alive.
        Ok(s) if s.state == 'Z' => {
            crate::procfs::tasks(Some(who.pid)).is_ok_and(|tids| tids.len() <= 1)
        }
        Ok(_) => false,
        // Hidden by hidepid, or gone between the two looks: kill(2) tells which.
        Err(_) => exists(who.pid) == Some(false),
    }
}

impl Identity {
    /// Whether this is the calling process (its pid and namespace; the start is not read).
    pub fn is_self(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        self.pid == pid && pid_ns(c"/proc/self/ns/pid").is_none_or(|ns| ns == self.pid_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_identity_matches_procfs() {
        let me = identity();
        assert_eq!(me.pid, std::process::id());
        assert_eq!(me.start_ticks, crate::procfs::start_ticks(None).unwrap());
        assert_ne!(me.pid_ns, 0);
        assert!(me.is_self());
        assert!(!is_gone(&me), "this process is alive");
    }

    /// A process whose main thread called pthread_exit shows `Z` while its other threads run:
    /// alive, until it really dies.
    #[test]
    fn a_zombie_main_thread_with_a_live_thread_is_alive() {
        extern "C" fn park(_: *mut libc::c_void) -> *mut libc::c_void {
            loop {
                // SAFETY: pause only waits for a signal.
                unsafe { libc::pause() };
            }
        }
        let me = identity();
        // SAFETY: the child calls only pthread_create (glibc's fork leaves its own locks
        // usable), _exit or the thread's exit(2), and, in its thread, pause.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let mut t: libc::pthread_t = 0;
            // SAFETY: `park` never returns; no argument is read.
            unsafe {
                if libc::pthread_create(&mut t, std::ptr::null(), park, std::ptr::null_mut()) != 0 {
                    libc::_exit(1);
                }
                // The main thread alone ends (exit(2), not exit_group), as pthread_exit would
                // without unwinding through these frames.
                libc::syscall(libc::SYS_exit, 0);
            }
        }
        let pid = pid as u32;
        let who = Identity {
            pid,
            start_ticks: crate::procfs::start_ticks(Some(pid)).unwrap(),
            pid_ns: me.pid_ns,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while crate::procfs::stat(Some(pid)).unwrap().state != 'Z' {
            assert!(
                std::time::Instant::now() < deadline,
                "the main thread never exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let alive = !is_gone(&who);
        // SAFETY: kills and reaps the child forked above.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
            libc::waitpid(pid as i32, std::ptr::null_mut(), 0);
        }
        assert!(alive, "a zombie main thread with a live thread is alive");
        assert!(is_gone(&who), "gone once killed and reaped");
    }

    #[test]
    fn start_ticks_after_a_name_with_parentheses() {
        let text = b"42 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 23\n";
        assert_eq!(start_ticks_of(text), Some(777));
        assert_eq!(start_ticks_of(b"42 (x) S 1 2"), None);
        assert_eq!(start_ticks_of(b"no name"), None);
    }

    #[test]
    fn a_reaped_child_a_zombie_a_reused_pid_and_a_foreign_namespace() {
        let me = identity();
        // A zombie: exited, not waited for.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let s = crate::procfs::stat(Some(pid)).unwrap();
            if s.state == 'Z' {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the child never exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let zombie = Identity {
            pid,
            start_ticks: crate::procfs::start_ticks(Some(pid)).unwrap(),
            pid_ns: me.pid_ns,
        };
        assert!(is_gone(&zombie), "a zombie is dead");
        child.wait().unwrap();
        assert!(is_gone(&zombie), "a reaped child is gone");
        // This process's pid with another start: the pid was reused.
        let reused = Identity {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert!(is_gone(&reused));
        // Unknown or foreign namespaces are never judged.
        assert!(!is_gone(&Identity {
            pid_ns: 0,
            ..zombie
        }));
        assert!(!is_gone(&Identity {
            pid_ns: me.pid_ns + 1,
            ..zombie
        }));
        // Unknown start: judged by the pid alone.
        assert!(!is_gone(&Identity {
            start_ticks: 0,
            ..me
        }));
    }
}
