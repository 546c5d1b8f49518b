//! Shared volatile regions: memfd-backed, mappable by any process that receives the descriptor
//! (over a UNIX socket or by inheritance). The range's state word, its last-use time and a purge
//! counter live in a header page at the start of the file, so every process's marks, unmarks
//! and reclaimer work on the same word:
//!
//! - the word counts the processes that hold the range pinned; a range pinned by any process
//!   is never purged, and one unpinned by all may be purged by any process's reclaimer
//!   (ashmem pin/unpin semantics);
//! - a purge punches a hole in the file, freeing the pages for every process, and bumps
//!   `epoch`; each process remembers the epoch it last saw, so every process learns of the
//!   purge at its own next unmark, even if another process pinned and refilled the range first;
//! - the reclaimer purges only if the word still equals its snapshot, whose generation changes
//!   at every mark: a range used in between is not purged on stale information (what Chromium's
//!   DiscardableSharedMemory does with a lock word and a last-unlock timestamp).
//!
//! Shared regions are always managed: MADV_FREE does not apply to shared memory.

use crate::state::RangeState;
use crate::Error;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Release};
use vrange_sys::fd::{GuestFd, Inherit};
use vrange_sys::{mem, shm};

const MAGIC: u64 = u64::from_le_bytes(*b"VRANGESH");
const VERSION: u32 = 1;
const NAME: &std::ffi::CStr = c"vrange-shared";

/// The first page of a shared region's file.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Header {
    magic: AtomicU64,
    version_and_len: AtomicU64,
    data_len: AtomicU64,
    pub state: RangeState,
    pub last_used: AtomicU64,
    /// Purges so far.
    pub epoch: AtomicU64,
}

impl Header {
    /// Whether this is the header of a shared region of `len` bytes of data, in this version.
    fn is_valid(&self, len: usize) -> bool {
        self.magic.load(Acquire) == MAGIC
            && self.version_and_len.load(Acquire) == u64::from(VERSION)
            && self.data_len.load(Acquire) == len as u64
    }

    /// Purges the region for every process if its word still equals `seen` (the snapshot its
    /// purger chose it by): the word moves to PURGING (no process can pin the range until it
    /// leaves), `punch` frees the data, the epoch is bumped so that every process learns of the
    /// purge at its next unmark, and the word becomes PURGED. If `punch` fails, the range goes
    /// back to `seen`, volatile and intact. Returns whether it was purged.
    pub fn purge<E>(&self, seen: u64, punch: impl FnOnce() -> Result<(), E>) -> bool {
        if !self.state.begin_purge(seen) {
            return false;
        }
        if punch().is_err() {
            self.state.abort_purge(seen);
            return false;
        }
        self.epoch.fetch_add(1, Release);
        self.state.finish_purge();
        true
    }
}

/// The data bytes of the shared region file `fd` (its size less the header page), if it is
/// sized like one.
fn data_len(fd: BorrowedFd<'_>) -> Result<usize, Error> {
    let page = mem::page_size();
    let total = shm::size(fd).map_err(Error::from)?;
    if total < 2 * page || total % page != 0 {
        return Err(Error::Unsupported);
    }
    Ok(total - page)
}

/// A shared mapping: header page, then `len` bytes of data.
pub(crate) struct Mapping {
    pub base: NonNull<u8>,
    pub len: usize,
    pub fd: GuestFd,
}

impl Mapping {
    pub fn header(&self) -> &Header {
        // SAFETY: base is the start of a live shared mapping of at least one page, page-aligned,
        // and Header (atomics only) fits in a page.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    pub fn data(&self) -> *mut u8 {
        // SAFETY: the data follows the header page inside the mapping.
        unsafe { self.base.as_ptr().add(mem::page_size()) }
    }

    /// Gives up the mapping's ownership to the registry: (header address, data, descriptor
    /// from `Box::into_raw`).
    pub fn into_parts(self) -> (*mut Header, *mut u8, *mut GuestFd) {
        let data = self.data();
        (
            self.base.as_ptr().cast(),
            data,
            Box::into_raw(Box::new(self.fd)),
        )
    }
}

/// Creates a shared region of `len` bytes (a page multiple), pinned by this process.
pub(crate) fn create(len: usize) -> Result<Mapping, Error> {
    let page = mem::page_size();
    let total = len.checked_add(page).ok_or(Error::Overflow)?;
    let fd = shm::create(NAME, total).map_err(Error::from)?;
    let fd = GuestFd::adopt(fd, Inherit::Keep).map_err(Error::from)?;
    let base = map(&fd, total)?;
    let m = Mapping { base, len, fd };
    let h = m.header();
    h.data_len.store(len as u64, Release);
    h.version_and_len.store(u64::from(VERSION), Release);
    h.state.reset();
    h.magic.store(MAGIC, Release);
    Ok(m)
}

/// Maps a shared region created by [`create`] (in this or another process) from its descriptor.
/// The descriptor is duplicated; the caller keeps its own.
pub(crate) fn open(fd: BorrowedFd<'_>) -> Result<Mapping, Error> {
    let len = data_len(fd)?;
    let total = len + mem::page_size();
    let fd = shm::dup(fd).map_err(Error::from)?;
    let fd = GuestFd::adopt(fd, Inherit::Keep).map_err(Error::from)?;
    let base = map(&fd, total)?;
    let m = Mapping { base, len, fd };
    if !m.header().is_valid(len) {
        // SAFETY: the mapping was created above and nothing refers into it.
        unsafe { mem::unmap(m.base, total) };
        return Err(Error::Unsupported);
    }
    Ok(m)
}

fn map(fd: &GuestFd, total: usize) -> Result<NonNull<u8>, Error> {
    let fd = fd.get().ok_or(Error::Os(libc::EBADF))?;
    shm::map(fd, total).map_err(Error::from)
}

/// Frees the data of a region being purged, for every process: a hole punched through this
/// process's mapping (so that it works from a thread whose descriptor table holds none of the
/// program's, and even after the program closed the region's descriptor).
///
/// # Errors
/// The errno of madvise(2) MADV_REMOVE.
///
/// # Safety
/// The caller must have moved the range to `PURGING`; `data..data + len` is the region's data
/// in this process's mapping.
pub(crate) unsafe fn punch(data: usize, len: usize) -> Result<(), Error> {
    // SAFETY: the range is PURGING: no process holds it pinned, and none can pin it until the
    // purge finishes; the mapping is shared and writable (see `map`).
    unsafe { shm::punch_mapped(data as *mut u8, len) }.map_err(Error::from)
}

/// The header page of a shared region's file, mapped alone (a coordinator purging regions
/// participants handed it, without mapping their data). Unmapped on drop.
pub(crate) struct HeaderPage {
    base: NonNull<u8>,
    /// Bytes of data after the header.
    pub len: usize,
}

// SAFETY: the page holds atomics only, shared with other processes anyway.
unsafe impl Send for HeaderPage {}
// SAFETY: as above.
unsafe impl Sync for HeaderPage {}

impl HeaderPage {
    /// Maps and checks the header of the shared region `fd`.
    pub fn open(fd: BorrowedFd<'_>) -> Result<HeaderPage, Error> {
        let len = data_len(fd)?;
        let base = shm::map(fd, mem::page_size()).map_err(Error::from)?;
        let h = HeaderPage { base, len };
        if h.header().is_valid(len) {
            Ok(h)
        } else {
            Err(Error::Unsupported)
        }
    }

    pub fn header(&self) -> &Header {
        // SAFETY: base is a live, page-aligned mapping of one page; Header (atomics) fits.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }
}

impl Drop for HeaderPage {
    fn drop(&mut self) {
        // SAFETY: mapped by `open`, referred to by nothing once the handle goes.
        unsafe { mem::unmap(self.base, mem::page_size()) };
    }
}
