//! Memory hogs: a process that takes fresh memory until reclaim must make room for it (and
//! gives it back when told, [`Hog`]), and makes itself the one the OOM killer picks if reclaim
//! cannot. System calls only, so a forked child of the harness may be the hog. The tests'
//! hogs and vrange-bench's neighbours are these.

// Writes /proc/self/oom_score_adj with raw system calls, so that a forked child can: no
// allocation, no locks.
#![allow(clippy::disallowed_methods)]

use std::io;
use std::ptr::NonNull;
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

/// Memory held on purpose: one mapping of small pages (so the charge moves a page at a time and
/// reclaim runs often and gradually), of which the first [`Hog::held`] bytes are resident. It
/// is never unmapped: a hog holds its memory until its process ends. System calls only.
pub struct Hog {
    base: NonNull<u8>,
    len: usize,
    held: usize,
}

impl Hog {
    /// Room for `len` bytes (rounded up to whole pages, at least one), none of them resident
    /// yet.
    ///
    /// # Errors
    /// The mapping cannot be made.
    pub fn new(len: usize) -> io::Result<Hog> {
        let page = mem::page_size();
        let len = len.next_multiple_of(page).max(page);
        let base = mem::map_anon(len, page)?;
        let _ = mem::advise_huge(base.as_ptr(), len, false);
        Ok(Hog { base, len, held: 0 })
    }

    /// The bytes it has room for.
    pub fn capacity(&self) -> usize {
        self.len
    }

    /// The bytes resident now.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Holds `bytes` (rounded up to whole pages, at most [`Hog::capacity`]): the pages it grows by
    /// are written, those it shrinks by dropped (MADV_DONTNEED).
    pub fn hold(&mut self, bytes: usize) {
        let page = mem::page_size();
        let target = bytes.next_multiple_of(page).min(self.len);
        if target > self.held {
            for off in (self.held..target).step_by(page) {
                // SAFETY: inside the mapping, which is never unmapped.
                unsafe { self.base.as_ptr().add(off).write_volatile(1) };
            }
        } else if target < self.held {
            // SAFETY: the hog's own pages above `target`; nothing refers to their content.
            let _ =
                unsafe { mem::purge_forced(self.base.as_ptr().add(target), self.held - target) };
        }
        self.held = target;
    }

    /// Writes `value` into every page held again: recently used memory, which reclaim finds
    /// no cheaper to take than anyone else's.
    pub fn touch_again(&mut self, value: u8) {
        for off in (0..self.held).step_by(mem::page_size()) {
            // SAFETY: inside the mapping's held part, never unmapped.
            unsafe { self.base.as_ptr().add(off).write_volatile(value) };
        }
    }
}

/// Touches `bytes` of fresh anonymous memory, `step` bytes at a time with `pause` between
/// steps, and keeps it (until the process exits): a [`Hog`] that grows to `bytes`.
///
/// # Errors
/// The mapping cannot be made.
pub fn touch(bytes: usize, step: usize, pause: Duration) -> io::Result<()> {
    let mut hog = Hog::new(bytes)?;
    let step = step.max(mem::page_size());
    while hog.held() < bytes {
        hog.hold((hog.held() + step).min(bytes));
        if hog.held() < bytes && !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    Ok(())
}
