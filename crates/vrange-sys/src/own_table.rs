//! A descriptor table of the calling thread's own, for a library thread that opens files while
//! the program juggles its descriptors.
//!
//! Every descriptor a thread opens takes the lowest free number of its table. In the program's
//! table that may be a number the program closed a moment ago and is about to restore: a
//! program that closes 1 and puts its stdout back with `dup2` (CPython's subprocess tests do,
//! around every spawn) either has its `dup2` fail with EBUSY (the number is being allocated by
//! the other thread's open) or sees its restored stdout closed by the library's check-then-close
//! of "its" file at 1. No check closes that window: only not sharing the table does.
//!
//! [`enter`] gives the calling thread an empty table of its own: from then on its opens,
//! closes and failures never touch the program's numbers, and the program can neither close
//! nor replace what it holds (threads it spawns share that table). `close_range(0, ~0,
//! CLOSE_RANGE_UNSHARE)` (Linux 5.9, allowed by Docker's default seccomp profile) does it
//! without copying any of the program's descriptors. Where close_range is refused,
//! `unshare(CLONE_FILES)` copies the table and the copies are closed at once (POSIX record
//! locks belong to a table, so none of the program's are released; a pipe's end of file comes
//! a moment later); it needs CAP_SYS_ADMIN under Docker's profile. Where both are refused the
//! thread keeps the program's table and [`enter`] says why.
//!
//! A fork child is a copy of the forking thread, whose table is the program's: nothing of an
//! own table is inherited. Exec ends the thread with its table.

use std::cell::Cell;
use std::io;
use std::os::fd::RawFd;

thread_local! {
    /// Whether this thread's table is its own. A `const` initialiser and no destructor: a plain
    /// thread-local access, async-signal-safe.
    static OWN: Cell<bool> = const { Cell::new(false) };
}

const CLOSE_RANGE_UNSHARE: libc::c_uint = 1 << 1;

/// Whether the calling thread has a descriptor table of its own (see [`enter`]): then nothing
/// but vrange can close or replace its descriptors. Async-signal-safe.
pub fn active() -> bool {
    OWN.with(Cell::get)
}

/// Called first by a thread that `spawner_own` says was spawned from a thread in its own table:
/// it shares that table (threads share their creator's table), and records it.
pub fn spawned_by(spawner_own: bool) {
    if spawner_own {
        OWN.with(|o| o.set(true));
    }
}

/// Gives the calling thread an empty descriptor table of its own (see the module
/// documentation). Calling it again is a no-op.
///
/// # Errors
/// The errno of close_range(2) (ENOSYS before Linux 5.9; EPERM under a seccomp filter) when
/// unshare(2) is refused too; the thread's table is then the program's, unchanged.
pub fn enter() -> io::Result<()> {
    enter_by(true)
}

/// [`enter`], trying close_range first only if `close_range` (else unshare alone, as on
/// kernels before 5.9).
fn enter_by(close_range: bool) -> io::Result<()> {
    if active() {
        return Ok(());
    }
    // SAFETY: close_range takes plain integers; with CLOSE_RANGE_UNSHARE over the whole range
    // the new, private table is empty: nothing of the program's is copied or closed.
    let unshared = close_range
        && unsafe { libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, CLOSE_RANGE_UNSHARE) }
            == 0;
    if !unshared {
        let why = if close_range {
            io::Error::last_os_error()
        } else {
            io::Error::from_raw_os_error(libc::ENOSYS)
        };
        // SAFETY: unshare(CLONE_FILES) gives this thread a copy of the table; no memory effect.
        if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
            return Err(why);
        }
        OWN.with(|o| o.set(true));
        close_all();
        return Ok(());
    }
    OWN.with(|o| o.set(true));
    Ok(())
}

/// Runs `f` on a short-lived thread with an empty table of its own, and returns what it
/// returned. The helper starts with every signal blocked.
///
/// # Errors
/// As [`enter`]; the errno of the thread's creation.
pub fn apart<T: Send>(f: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|scope| {
        let helper = crate::process::with_signals_blocked(|| {
            std::thread::Builder::new()
                .name("vrange-files".into())
                .spawn_scoped(scope, || enter().map(|()| f()))
        })?;
        helper
            .join()
            .unwrap_or_else(|_| Err(io::Error::from_raw_os_error(libc::EIO)))
    })
}

/// Closes every descriptor of this thread's own table, one by one (where close_range is
/// missing or refused). Allocates: not for signal handlers.
fn close_all() {
    debug_assert!(active());
    let Ok(dir) = std::fs::read_dir("/proc/thread-self/fd") else {
        return;
    };
    let numbers: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in numbers {
        // SAFETY: this thread's own table (see `enter`): closing a copy here closes nothing of
        // the program's; the directory's own descriptor, listed too, is already closed (EBADF).
        unsafe { libc::close(fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn is_open(fd: RawFd) -> bool {
        // SAFETY: F_GETFD has no memory effects.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }

    fn identity(fd: RawFd) -> Option<(u64, u64)> {
        // SAFETY: stat is plain data; fstat fills it or fails.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
    }

    #[test]
    fn a_thread_in_its_own_table_touches_nothing_of_the_programs() {
        touches_nothing(true);
    }

    /// The same by unshare(2) and closing one by one, as where close_range is missing.
    #[test]
    fn without_close_range_the_thread_gets_the_same_table() {
        touches_nothing(false);
    }

    /// The thread holds none of the program's descriptors, and what it opens or closes never
    /// shows in the program's table.
    fn touches_nothing(close_range: bool) {
        let theirs = std::fs::File::open("/proc/self/status").unwrap();
        let theirs_fd = theirs.as_raw_fd();
        let program_zero = identity(0);
        let (tx, rx) = std::sync::mpsc::channel();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            enter_by(close_range).unwrap();
            assert!(active());
            assert!(
                !is_open(theirs_fd),
                "the program's file is in the own table"
            );
            // Opens here take the lowest free numbers of this table, 0 first.
            let mine = std::fs::File::open("/proc/self/status").unwrap();
            let n = mine.as_raw_fd();
            assert_eq!(n, 0, "the own table was not empty");
            tx.send((n, identity(n))).unwrap();
            wait.recv().unwrap();
            // Closing this thread's 0 leaves the program's 0 alone.
            drop(mine);
        });
        let (n, thread_file) = rx.recv().unwrap();
        assert!(!active(), "the flag leaked to another thread");
        assert!(thread_file.is_some());
        assert_ne!(
            identity(n),
            thread_file,
            "the thread's file is in the program's table"
        );
        go.send(()).unwrap();
        thread.join().unwrap();
        assert_eq!(
            identity(0),
            program_zero,
            "the thread's close reached the program's 0"
        );
        assert!(is_open(theirs_fd));
    }

    /// Work done apart opens in an empty table and leaves the program's untouched.
    #[test]
    fn work_done_apart_sees_none_of_the_programs_descriptors() {
        let theirs = std::fs::File::open("/proc/self/status").unwrap();
        let fd = theirs.as_raw_fd();
        let (opened_at, saw_theirs) = apart(|| {
            let f = std::fs::File::open("/proc/self/status").unwrap();
            (f.as_raw_fd(), is_open(fd))
        })
        .unwrap();
        assert_eq!(opened_at, 0, "the helper's table was not empty");
        assert!(!saw_theirs, "the helper held a copy of the program's file");
        assert!(!active());
        assert!(is_open(fd));
    }
}
