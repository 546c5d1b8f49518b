//! Memory hogs: a process that takes fresh memory until reclaim must make room for it, and
//! makes itself the one the OOM killer picks if reclaim cannot. System calls only, so a forked
//! child of the harness may be the hog.

// Writes /proc/self/oom_score_adj with raw system calls, so that a forked child can: no
// allocation, no locks.
#![allow(clippy::disallowed_methods)]

use std::io;
use std::time::Duration;
use vrange_sys::mem;

/// Makes this process the OOM killer's first choice (`oom_score_adj` 1000), so that if a
/// cgroup's limit is ever exceeded the hog dies and the process under test lives to report it.
///
/// # Errors
/// Opening or writing `/proc/self/oom_score_adj`.
pub fn prefer_oom_kill() -> io::Result<()> {
    const PATH: &[u8] = b"/proc/self/oom_score_adj\0";
    // SAFETY: PATH is NUL-terminated; the descriptor is closed below.
    unsafe {
        let fd = libc::open(PATH.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let written = libc::write(fd, b"1000".as_ptr().cast(), 4);
        let result = if written == 4 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
        libc::close(fd);
        result
    }
}

/// Touches `bytes` of fresh anonymous memory, `step` bytes at a time with `pause` between
/// steps, and keeps it (until the process exits). Small pages: the charge grows one page at a
/// time, so reclaim runs often and gradually.
///
/// # Errors
/// The mapping cannot be made.
pub fn touch(bytes: usize, step: usize, pause: Duration) -> io::Result<()> {
    let page = mem::page_size();
    let p = mem::map_anon(bytes, page)?;
    let _ = mem::advise_huge(p.as_ptr(), bytes, false);
    let step = step.max(page);
    let mut done = 0;
    while done < bytes {
        let end = (done + step).min(bytes);
        for off in (done..end).step_by(page) {
            // SAFETY: inside the fresh mapping, which is never unmapped.
            unsafe { p.as_ptr().add(off).write_volatile(1) };
        }
        done = end;
        if done < bytes && !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    Ok(())
}
