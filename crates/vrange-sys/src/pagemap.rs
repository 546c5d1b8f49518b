//! Which parts of a range are mapped by one huge-page table entry (a PMD), asked of the kernel
//! without allocating.
//!
//! Owns every use of `/proc/self/pagemap`: the PAGEMAP_SCAN ioctl (Linux 6.7) on a cached,
//! verified descriptor ([`SelfFile`]), one call per batch of answers. Async-signal-safe:
//! only open, fstat and ioctl on stack buffers, no allocation, no lock (unmarking, which may
//! run in a signal handler, asks it). On kernels without the ioctl, or where
//! `/proc/self/pagemap` cannot be opened, [`huge_runs`] answers `Ok(false)` and remembers it;
//! callers then go page by page.
//!
//! # References
//! Documentation/admin-guide/mm/pagemap.rst, "Pagemap Scan IOCTL"; `PAGE_IS_HUGE` is set for a
//! PMD-mapped transparent huge page (and hugetlb), `PAGE_IS_PFNZERO` for the huge zero page.

use super::fd::SelfFile;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// `_IOWR('f', 16, struct pm_scan_arg)` from `<linux/fs.h>`.
const PAGEMAP_SCAN: u64 = 0xC060_6610;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_PFNZERO: u64 = 1 << 5;
const PAGE_IS_HUGE: u64 = 1 << 6;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

static PAGEMAP: SelfFile = SelfFile::new(c"/proc/self/pagemap");
/// Set once PAGEMAP_SCAN has answered ENOTTY/EINVAL: this kernel lacks it.
static NO_SCAN: AtomicBool = AtomicBool::new(false);

/// Calls `visit(start, end)` for each run of `[start, end)` that is mapped, present, by huge
/// page table entries of real memory (not the huge zero page), in address order. `Ok(false)`
/// without calling `visit` when the kernel lacks PAGEMAP_SCAN. Async-signal-safe.
///
/// What this proves lasts only as long as nothing changes the mapping; callers pin the memory
/// first (see `vrange`'s `lazy` module).
///
/// # Errors
/// The errno of opening `/proc/self/pagemap` or of the ioctl.
pub fn huge_runs(
    start: usize,
    end: usize,
    mut visit: impl FnMut(usize, usize),
) -> io::Result<bool> {
    if NO_SCAN.load(Ordering::Relaxed) {
        return Ok(false);
    }
    let fd = match PAGEMAP.get() {
        Ok(fd) => fd,
        // No /proc, or not allowed to read it (a sandbox): for good, so that unmarks do not
        // try the open again each time. EAGAIN (a standard descriptor closed) may pass.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::EACCES | libc::EPERM)
            ) =>
        {
            NO_SCAN.store(true, Ordering::Relaxed);
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let mut runs = [PageRegion::default(); 16];
    let mut cursor = start as u64;
    while cursor < end as u64 {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start: cursor,
            end: end as u64,
            vec: runs.as_mut_ptr() as u64,
            vec_len: runs.len() as u64,
            category_mask: PAGE_IS_HUGE | PAGE_IS_PRESENT,
            return_mask: PAGE_IS_HUGE | PAGE_IS_PRESENT | PAGE_IS_PFNZERO,
            ..Default::default()
        };
        // SAFETY: arg is a properly sized pm_scan_arg whose size field says so, and vec points
        // to `runs`, vec_len entries that live across the call; the kernel writes only there
        // and into arg.walk_end.
        let n = unsafe { libc::ioctl(fd, PAGEMAP_SCAN as _, &mut arg as *mut PmScanArg) };
        if n < 0 {
            // SAFETY: __errno_location returns this thread's errno slot.
            return match unsafe { *libc::__errno_location() } {
                libc::ENOTTY | libc::EINVAL | libc::EOPNOTSUPP => {
                    NO_SCAN.store(true, Ordering::Relaxed);
                    Ok(false)
                }
                libc::EINTR => continue,
                e => Err(io::Error::from_raw_os_error(e)),
            };
        }
        for r in &runs[..n as usize] {
            if r.categories & PAGE_IS_PFNZERO == 0 {
                visit(r.start as usize, r.end as usize);
            }
        }
        // The walk stops early only when the vector is full.
        if (n as usize) < runs.len() || arg.walk_end <= cursor {
            break;
        }
        cursor = arg.walk_end;
    }
    Ok(true)
}

/// Whether this kernel answers PAGEMAP_SCAN (probed by trying it once on an empty range).
pub fn has_pagemap_scan() -> bool {
    let probe = &NO_SCAN as *const AtomicBool as usize & !(super::mem::page_size() - 1);
    matches!(
        huge_runs(probe, probe + super::mem::page_size(), |_, _| {}),
        Ok(true)
    )
}
