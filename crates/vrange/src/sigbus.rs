//! SIGBUS mode: touching a purged page of a range that is still volatile raises SIGBUS at that
//! address instead of reading zero, and [`fill`](crate::fill) patches the page from a signal handler (the
//! access is then retried and succeeds). The design's table, cell by cell:
//!
//! | | purged | not purged |
//! |---|---|---|
//! | access without unmarking | SIGBUS (`si_addr` the address) | original content |
//! | access after unmarking | zero, no signal | original content, never lost |
//!
//! Built on one userfaultfd per process, opened with `UFFD_FEATURE_SIGBUS` at the first use
//! (`vrange_sys::uffd`), with ranges registered in MISSING mode:
//!
//! - **Managed and hybrid regions** are populated when created and registered for good: only a
//!   purge (MADV_DONTNEED of a whole range) makes pages missing. The unmark that reports a
//!   purge installs zero pages over the range (`UFFDIO_ZEROPAGE`, skipping pages [`fill`](crate::fill)
//!   placed), so pinned memory never signals. Hybrid SIGBUS regions are not armed (they
//!   purge like managed ones): the per-page proof of an armed unmark would itself touch
//!   missing pages.
//! - **Shared regions** are populated by their creator; each process registers its own mapping
//!   if it asked for SIGBUS mode, so a purge (a hole punched in the file) signals there and
//!   reads zero in the other processes' mappings.
//! - **The kernel path** (lazy regions and the classic call on any private anonymous memory):
//!   the mark scans and frees the pages lazily as usual (the scan maps the zero page wherever
//!   nothing was ever written, so only pages discarded later are missing), then registers the
//!   range; the unmark unregisters it first, then proves each page as usual (a discarded page
//!   faults in as zero).
//!
//! The descriptor is a `GuestFd` (above the floor, close-on-exec, verified before each use).
//! If the program closes it, the kernel drops every registration with it: purged pages then
//! read zero, as without SIGBUS mode, until the next SIGBUS region or mark opens a new one,
//! which registers the live SIGBUS regions again (the loss is counted in
//! `Stats::descriptors_lost`). A fork child inherits no registration (the kernel clears them
//! without `UFFD_FEATURE_EVENT_FORK`): in the child, purged pages read zero; its copy of the
//! descriptor is closed.

use crate::registry::{self, Policy};
use crate::span::Span;
use crate::userfault::Held;
use crate::Error;
use std::os::fd::RawFd;
use vrange_sys::{mem, uffd};

/// The process's SIGBUS-mode userfaultfd.
pub(crate) static UFFD: Held = Held::new(vrange_sys::lock::Rank::SigbusOpen, after_fork_child);

/// In a fork child (under the descriptor's lock): no registration came along.
fn after_fork_child() {
    UFFD.after_fork_child();
}

/// The descriptor, opened now if there is none (or the program closed it: then the live
/// SIGBUS regions are registered on the new one).
///
/// # Errors
/// `Error::Os(ENOTSUP)` where userfaultfd or its SIGBUS feature is unavailable (or not allowed
/// to this process); the errno of placing the descriptor (EMFILE).
pub(crate) fn ensure() -> Result<RawFd, Error> {
    let opened = UFFD.ensure(uffd::open_sigbus)?;
    if opened.replaced {
        reregister(opened.fd);
    }
    Ok(opened.fd)
}

pub(crate) fn current() -> Option<RawFd> {
    UFFD.current()
}

/// Registers every live managed SIGBUS range, and every refill region filled on the faulting
/// thread (with its fill buffers), on a new descriptor.
fn reregister(fd: RawFd) {
    registry::for_each_live(|_, slot| {
        if slot.sigbus() && slot.policy() != Policy::Lazy {
            let (start, len) = slot.extent();
            let _ = uffd::register_missing(fd, start, len);
        }
    });
    crate::refill_here::reregister(fd);
}

/// Makes a new private region SIGBUS-armed: every page present, the whole region registered.
pub(crate) fn arm_region(start: usize, len: usize) -> Result<(), Error> {
    let fd = ensure()?;
    mem::populate_write(start as *mut u8, len)?;
    uffd::register_missing(fd, start, len)?;
    Ok(())
}

/// Installs zero pages at the missing pages of a range whose unmark reported a purge, so that
/// pinned memory reads zero without a signal, and returns how many pages were missing: those
/// the purge took that no [`fill`](crate::fill) placed again. A placed page counts as intact
/// (vrange.h: its content is what the handler regenerated). `None` when that is not known: the
/// descriptor is gone (the kernel dropped the registration, and missing pages fault in as zero
/// anyway) or the install failed; the caller then counts every page purged.
pub(crate) fn zero_fill(start: usize, len: usize) -> Option<usize> {
    let fd = current()?;
    let installed = uffd::zero(fd, start, len).ok()?;
    Some(installed / mem::page_size())
}

/// Registers a range marked in SIGBUS mode on the kernel path.
pub(crate) fn register(fd: RawFd, span: Span) -> Result<(), Error> {
    uffd::register_missing(fd, span.start, span.len()).map_err(Error::from)
}

/// Before the kernel path's unmark (and a mark, and `forget`): unregister, so that the proof
/// (and the program) reads a discarded page as zero. One fstat and one ioctl in a process that
/// used SIGBUS mode, nothing otherwise. Async-signal-safe.
pub(crate) fn disarm(span: Span) {
    if !UFFD.ever_opened() {
        return;
    }
    if let Some(fd) = current() {
        let _ = uffd::unregister(fd, span.start, span.len());
    }
}

/// [`crate::fill`] on the descriptors given (SIGBUS mode's, the refill regions'): the first
/// where `dst` is registered places the pages. Async-signal-safe.
///
/// # Safety
/// As [`crate::fill`].
pub(crate) unsafe fn fill_into(
    fds: [Option<RawFd>; 2],
    dst: *mut u8,
    src: *const u8,
    len: usize,
) -> Result<(), Error> {
    let page = mem::page_size();
    if dst as usize % page != 0 || len % page != 0 {
        return Err(Error::Unaligned);
    }
    if len == 0 {
        return Ok(());
    }
    for fd in fds.into_iter().flatten() {
        // SAFETY: src is readable for len bytes (caller contract); the kernel checks dst.
        match unsafe { uffd::copy(fd, dst as usize, src, len) } {
            Ok(()) => return Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EINVAL)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::NotRegion)
}
