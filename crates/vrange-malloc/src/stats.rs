//! The allocator's counters: per arena (updated under the arena's lock, so on a cache line
//! nobody else writes) and for large blocks, summed when asked (`heap::report`, above the
//! arenas: this module counts for them and never reads them). Reported through
//! `vrange::stats()` (its `allocator` field) and, with `VRANGE_MALLOC_STATS=1`, printed at exit.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64};
use vrange::{AllocatorStats, Taken};
use vrange_sys::fd::{GuestFd, Inherit};

/// Counters of one arena (or of large blocks).
pub struct Counters {
    allocated: AtomicU64,
    freed: AtomicU64,
    reused_intact: AtomicU64,
    zero_filled: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
}

impl Counters {
    pub const fn new() -> Counters {
        Counters {
            allocated: AtomicU64::new(0),
            freed: AtomicU64::new(0),
            reused_intact: AtomicU64::new(0),
            zero_filled: AtomicU64::new(0),
            allocations: AtomicU64::new(0),
            frees: AtomicU64::new(0),
        }
    }

    /// A block of `bytes` was handed out; `taken` says what its pages held.
    pub fn allocated(&self, bytes: usize, taken: &Taken) {
        let bytes = bytes as u64;
        let page = vrange::page_size() as u64;
        let faulting = if taken.zero {
            bytes
        } else {
            (taken.purged as u64 * page).min(bytes)
        };
        self.allocated.fetch_add(bytes, Relaxed);
        self.zero_filled.fetch_add(faulting, Relaxed);
        self.reused_intact.fetch_add(bytes - faulting, Relaxed);
        self.allocations.fetch_add(1, Relaxed);
    }

    /// A block of `bytes` was freed.
    pub fn freed(&self, bytes: usize) {
        self.shrunk(bytes);
        self.frees.fetch_add(1, Relaxed);
    }

    /// A block grew in place by `bytes`.
    pub fn grown(&self, bytes: usize) {
        self.allocated.fetch_add(bytes as u64, Relaxed);
    }

    /// A live block gave `bytes` back (shrunk in place).
    pub fn shrunk(&self, bytes: usize) {
        self.freed.fetch_add(bytes as u64, Relaxed);
    }

    /// Adds these counters to `s` (`heap::report` sums every arena's and the large blocks').
    pub fn add_to(&self, s: &mut AllocatorStats) {
        let allocated = self.allocated.load(Relaxed);
        let freed = self.freed.load(Relaxed);
        s.allocated_bytes = s
            .allocated_bytes
            .wrapping_add(allocated.wrapping_sub(freed));
        s.reused_intact_bytes += self.reused_intact.load(Relaxed);
        s.zero_filled_bytes += self.zero_filled.load(Relaxed);
        s.allocations += self.allocations.load(Relaxed);
        s.frees += self.frees.load(Relaxed);
    }
}

static MAPPED: AtomicU64 = AtomicU64::new(0);

/// Address space mapped (+) or unmapped (−).
pub fn mapped(delta: i64) {
    if delta >= 0 {
        MAPPED.fetch_add(delta as u64, Relaxed);
    } else {
        MAPPED.fetch_sub(delta.unsigned_abs(), Relaxed);
    }
}

/// Address space mapped now (for the report, `heap::report`).
pub fn mapped_bytes() -> u64 {
    MAPPED.load(Relaxed)
}

/// Where the exit summary goes: a copy of stderr made at start-up, because many programs (GNU
/// coreutils among them) close stderr in their own exit handlers, which run before ours. Kept
/// above vrange's descriptor floor and verified before the write, so a program that closed it
/// and reused the number never gets the summary in its file. Null: write to fd 2.
static SUMMARY_FD: AtomicPtr<GuestFd> = AtomicPtr::new(std::ptr::null_mut());

/// Keeps a private copy of stderr for the exit summary (only when the summary is asked for).
pub fn keep_stderr() {
    // SAFETY: fd 2 is borrowed for the duplication only; if it is closed, fcntl fails.
    let stderr = unsafe { BorrowedFd::borrow_raw(2) };
    match GuestFd::copy_of(stderr, Inherit::Keep) {
        Ok(copy) => {
            let old = SUMMARY_FD.swap(Box::into_raw(Box::new(copy)), AcqRel);
            // Called once, before any thread could print; a second call leaks the first copy's
            // box (its descriptor stays valid) rather than free what another thread may use.
            let _ = old;
        }
        // Started with stderr closed: whatever the program opens as fd 2 later is not stderr.
        Err(_) => NO_STDERR.store(true, Relaxed),
    }
}

static NO_STDERR: AtomicBool = AtomicBool::new(false);

/// Writes a summary of the allocator's and the reclaimer's counters to stderr with write(2)
/// (no allocation: safe at exit, after other destructors ran).
pub fn print_summary() {
    let s = vrange::stats();
    let a = s.allocator;
    let mut buf = vrange_sys::settings::StackText::<1024>::default();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let _ = std::fmt::Write::write_fmt(
        &mut buf,
        format_args!(
            "vrange-malloc: {} allocations, {} frees; live {:.1} MiB, free {:.1} MiB of {:.1} MiB mapped\n\
             vrange-malloc: handed out reused intact {:.1} MiB, fresh or purged {:.1} MiB (address space: the kernel zero-fills a page only where it is touched); free volatile {:.1} MiB, purged now {:.1} MiB, purged in all {:.1} MiB by the reclaimer\n",
            a.allocations,
            a.frees,
            mib(a.allocated_bytes),
            mib(a.free_bytes),
            mib(a.mapped_bytes),
            mib(a.reused_intact_bytes),
            mib(a.zero_filled_bytes),
            mib(s.volatile_bytes),
            mib(s.purged_bytes),
            mib(s.purged_total_bytes),
        ),
    );
    if s.descriptors_lost + s.descriptors_no_room > 0 {
        let _ = std::fmt::Write::write_fmt(
            &mut buf,
            format_args!(
                "vrange-malloc: descriptors closed under vrange by the program {}, not opened for want of a free number {}\n",
                s.descriptors_lost, s.descriptors_no_room,
            ),
        );
    }
    let out = buf.bytes();
    // SAFETY: the copy is never freed once published (see keep_stderr).
    let fd = match unsafe { SUMMARY_FD.load(Acquire).as_ref() } {
        Some(copy) => match copy.get() {
            Some(fd) => fd.as_raw_fd(),
            // The program closed the copy (and may have reused its number): stderr, if open.
            None => 2,
        },
        None if NO_STDERR.load(Relaxed) => return,
        None => 2,
    };
    // SAFETY: writes initialised bytes of a local buffer to a verified copy of stderr or fd 2.
    let _ = unsafe { libc::write(fd, out.as_ptr().cast(), out.len()) };
}
