//! SIGBUS mode: touching a purged page of a range that is still volatile raises SIGBUS at that
//! address instead of reading zero, and [`fill`] patches the page from a signal handler (the
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
//!   purge installs zero pages over the range (`UFFDIO_ZEROPAGE`, skipping pages [`fill`]
//!   placed), so pinned memory never signals. Hybrid SIGBUS regions are not armed (they
//!   purge like managed ones): the per-page proof of an armed unmark would itself touch
//!   missing pages.
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
use crate::Error;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicI32, AtomicU64};
use vrange_sys::fd::{GuestFd, Ident, Inherit};
use vrange_sys::sync::SpinLock;
use vrange_sys::{mem, uffd};

/// The descriptor's identity, in atomics so that [`fill`] can verify it from a signal handler.
static FD: AtomicI32 = AtomicI32::new(-1);
static DEV: AtomicU64 = AtomicU64::new(0);
static INO: AtomicU64 = AtomicU64::new(0);
/// Serialises opening; held across fork.
pub(crate) static OPEN: SpinLock = SpinLock::new();
/// The owner of the open descriptor (closed only when replaced, and only if still verified).
static HELD: std::sync::Mutex<Option<GuestFd>> = std::sync::Mutex::new(None);

/// The process's userfaultfd if it is open and still the one vrange opened. Async-signal-safe:
/// atomics and one fstat(2).
fn current() -> Option<RawFd> {
    let fd = FD.load(Acquire);
    if fd < 0 {
        return None;
    }
    let ident = Ident::from_parts(fd, DEV.load(Relaxed), INO.load(Relaxed));
    ident.verify().then_some(fd)
}

/// The userfaultfd, opened now if there is none (or the program closed it: then the live SIGBUS
/// regions are registered on the new one).
///
/// # Errors
/// `Error::Os(ENOTSUP)` where userfaultfd or its SIGBUS feature is unavailable (or not allowed
/// to this process); the errno of placing the descriptor (EMFILE).
pub(crate) fn ensure() -> Result<RawFd, Error> {
    if let Some(fd) = current() {
        return Ok(fd);
    }
    let _open = OPEN.lock();
    if let Some(fd) = current() {
        return Ok(fd);
    }
    let (owned, _reach) = uffd::open_sigbus().map_err(|e| match e.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOMEM) => Error::from(e),
        _ => Error::Os(libc::ENOTSUP),
    })?;
    let guest = GuestFd::adopt(owned, Inherit::Private)?;
    let ident = guest.ident();
    let replaced = FD.load(Relaxed) >= 0;
    DEV.store(ident.dev(), Relaxed);
    INO.store(ident.ino(), Relaxed);
    FD.store(ident.fd(), Release);
    // The old owner, if any, is dropped: closed only if it still verifies (it does not: that is
    // why a new one was opened), else counted lost.
    *HELD.lock().unwrap_or_else(|e| e.into_inner()) = Some(guest);
    if replaced {
        reregister(ident.fd());
    }
    Ok(ident.fd())
}

/// Registers every live managed SIGBUS range on a new descriptor.
fn reregister(fd: RawFd) {
    registry::for_each_live(|_, slot| {
        if slot.sigbus() && slot.policy() != Policy::Lazy {
            let (start, len) = slot.extent();
            let _ = uffd::register_missing(fd, start, len);
        }
    });
}

/// Makes a new private region SIGBUS-armed: every page present, the whole region registered.
pub(crate) fn arm_region(start: usize, len: usize) -> Result<(), Error> {
    let fd = ensure()?;
    mem::populate_write(start as *mut u8, len)?;
    uffd::register_missing(fd, start, len)?;
    Ok(())
}

/// Installs zero pages at the missing pages of a range whose unmark reported a purge, so that
/// pinned memory reads zero without a signal. Nothing to do if the descriptor is gone (the
/// kernel dropped the registration: missing pages fault in as zero anyway).
pub(crate) fn zero_fill(start: usize, len: usize) {
    if let Some(fd) = current() {
        let _ = uffd::zero(fd, start, len);
    }
}

/// Registers a range marked in SIGBUS mode on the kernel path.
pub(crate) fn register(fd: RawFd, span: Span) -> Result<(), Error> {
    uffd::register_missing(fd, span.start, span.len()).map_err(Error::from)
}

/// Before the kernel path's unmark (and a mark, and `forget`): unregister, so that the proof
/// (and the program) reads a discarded page as zero. One fstat and one ioctl in a process that used SIGBUS mode, nothing
/// otherwise. Async-signal-safe.
pub(crate) fn disarm(span: Span) {
    if FD.load(Relaxed) < 0 {
        return;
    }
    if let Some(fd) = current() {
        let _ = uffd::unregister(fd, span.start, span.len());
    }
}

/// Places `len` bytes from `src` into the purged pages of `[dst, dst + len)` of SIGBUS-mode
/// memory, atomically per page, leaving pages that are present as they are. Async-signal-safe:
/// a SIGBUS handler calls it for the faulting page and returns, and the access is retried.
///
/// # Errors
/// [`Error::Unaligned`] unless `dst` and `len` are page multiples; [`Error::NotRegion`] where
/// `dst` is not SIGBUS-mode memory that is volatile (or the descriptor was closed by the
/// program); `Error::Os(ENOMEM)` when memory for the pages cannot be charged.
///
/// # Safety
/// `src` must be readable for `len` bytes; `[dst, dst + len)` must be memory the caller owns.
pub unsafe fn fill(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Error> {
    let page = mem::page_size();
    if dst as usize % page != 0 || len % page != 0 {
        return Err(Error::Unaligned);
    }
    if len == 0 {
        return Ok(());
    }
    let Some(fd) = current() else {
        return Err(Error::NotRegion);
    };
    // SAFETY: src is readable for len bytes (caller contract); the kernel checks dst.
    match unsafe { uffd::copy(fd, dst as usize, src, len) } {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EINVAL)) => {
            Err(Error::NotRegion)
        }
        Err(e) => Err(e.into()),
    }
}

/// In a fork child: the parent's descriptor is not the child's to use (its registrations did
/// not come along); `fd::close_private_after_fork` closed the child's copy. Forget it without
/// running destructors. Async-signal-safe.
pub(crate) fn after_fork_child() {
    FD.store(-1, Relaxed);
    if let Ok(mut held) = HELD.try_lock() {
        std::mem::forget(held.take());
    }
    // SAFETY: taken by the parent's prepare handler; no guard of it is live in this thread.
    unsafe { OPEN.force_unlock() };
}
