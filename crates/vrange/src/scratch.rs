//! Scratch regions: memory that is always volatile, written or not, with no marking call ever
//! (the sanitizer shadow of the 2014 design: reserved huge at start-up, sudden zeroing fine).
//!
//! Built on MAP_DROPPABLE (Linux 6.11): the kernel may drop any page at any time and a dropped
//! page reads zero; no commit charge and no page table up front (a TiB reservation costs
//! nothing until touched); the OOM killer never acts for it; a fork child gets zeroes (wipe on
//! fork) and core dumps leave it out.
//!
//! Without MAP_DROPPABLE a scratch region is refused with ENOTSUP (see [`ScratchRegion::new`]):
//! no older primitive keeps written memory droppable without a system call after each write
//! (MADV_FREE is undone by the next write), so any fallback would hand out memory the kernel
//! cannot take back — the OOM kill scratch memory exists to avoid.
//!
//! Live scratch regions sit in a small table of atomics (no lock, nothing allocated), so that
//! the classic call can refuse them cheaply (a scratch page cannot be pinned: unmarking one
//! would promise content the kernel may still drop), `vrange_free` can recognise them and
//! `stats()` can count them.

use crate::span::Span;
use crate::Error;
use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use vrange_sys::mem;

/// How many scratch regions a process may hold at once: they are meant to be few, large and
/// long-lived (reserve a TiB once rather than many small ones).
pub const MAX_SCRATCH_REGIONS: usize = 64;

struct Entry {
    /// Start of the region; 0 when the entry is free. Claimed by a compare-exchange.
    start: AtomicUsize,
    /// Its length; 0 until the region is fully recorded (readers skip it until then).
    len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // only to initialise the table below
const EMPTY: Entry = Entry {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
};
static TABLE: [Entry; MAX_SCRATCH_REGIONS] = [EMPTY; MAX_SCRATCH_REGIONS];
/// Live entries: lets the classic call skip the table with one load when there are none.
static LIVE: AtomicUsize = AtomicUsize::new(0);

fn record(start: usize, len: usize) -> Result<(), Error> {
    for e in &TABLE {
        if e.start.compare_exchange(0, start, AcqRel, Relaxed).is_ok() {
            e.len.store(len, Release);
            LIVE.fetch_add(1, Relaxed);
            return Ok(());
        }
    }
    Err(Error::Os(libc::ENOMEM))
}

/// Removes the entry of exactly `[start, start + len)`; whether there was one.
fn unrecord(start: usize, len: usize) -> bool {
    for e in &TABLE {
        if e.start.load(Acquire) == start && e.len.load(Acquire) == len {
            if e.len.compare_exchange(len, 0, AcqRel, Relaxed).is_err() {
                return false; // freed by another thread meanwhile: the caller's race
            }
            e.start.store(0, Release);
            LIVE.fetch_sub(1, Relaxed);
            return true;
        }
    }
    false
}

fn live() -> impl Iterator<Item = (usize, usize)> {
    TABLE.iter().filter_map(|e| {
        let start = e.start.load(Acquire);
        let len = e.len.load(Acquire);
        (start != 0 && len != 0).then_some((start, len))
    })
}

/// Whether `span` overlaps a scratch region. One relaxed load when there is none.
pub(crate) fn overlaps(span: Span) -> bool {
    LIVE.load(Relaxed) != 0
        && live().any(|(start, len)| span.start < start + len && start < span.start + span.len())
}

/// Live scratch regions and their bytes (reserved, not resident), for `stats()`.
pub(crate) fn totals() -> (u64, u64) {
    live().fold((0, 0), |(n, bytes), (_, len)| (n + 1, bytes + len as u64))
}

/// A scratch region: always volatile memory, whose pages the kernel may drop at any time,
/// written or not; a dropped page reads zero. There is nothing to mark or unmark, and nothing
/// to pin: use it for data that is as good as zero when lost (a sanitizer's shadow, a
/// recomputable lookup table). Unmapped on drop.
///
/// The content is reached through [`ScratchRegion::as_ptr`] only: Rust references to memory
/// the kernel may zero at any moment would promise a stability it does not have. Read with
/// `ptr::read_volatile` or atomics where a page may vanish between two reads of the same byte.
#[derive(Debug)]
pub struct ScratchRegion {
    start: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory owned by this handle; its methods take no references into
// it and the table of live regions is atomics only.
unsafe impl Send for ScratchRegion {}
// SAFETY: as above; no method mutates through `&self`.
unsafe impl Sync for ScratchRegion {}

mapping_accessors!(ScratchRegion);

impl ScratchRegion {
    /// Reserves a scratch region of `len` bytes (rounded up to a page), reading zero. Costs
    /// address space only: no memory, commit charge or page table until pages are written.
    ///
    /// # Errors
    /// [`Error::NotRegion`] for a zero length, [`Error::Overflow`] beyond `isize::MAX`;
    /// `Error::Os(ENOTSUP)` where the kernel has no MAP_DROPPABLE (before Linux 6.11; see the
    /// module documentation); `Error::Os(ENOMEM)` when the address space is exhausted or the
    /// process already holds [`MAX_SCRATCH_REGIONS`].
    ///
    /// # References
    /// mmap(2) MAP_DROPPABLE.
    pub fn new(len: usize) -> Result<ScratchRegion, Error> {
        let len = crate::span::region_len(len)?;
        let start =
            mem::map_droppable(len, mem::page_size()).map_err(|e| match e.raw_os_error() {
                // MAP_DROPPABLE is a map type of its own: older kernels reject the type.
                Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Error::Os(libc::ENOTSUP),
                Some(errno) => Error::Os(errno),
                None => Error::Os(libc::ENOMEM),
            })?;
        if let Err(e) = record(start.as_ptr() as usize, len) {
            // SAFETY: just mapped above, never handed out.
            unsafe { mem::unmap(start, len) };
            return Err(e);
        }
        Ok(ScratchRegion { start, len })
    }

    /// Bytes of the region resident now (mincore(2)). Takes time proportional to the region's
    /// pages: for reports and tests, not for hot paths. The kernel counts no drops per
    /// mapping; what the program wrote minus this is what was dropped.
    ///
    /// # Errors
    /// The errno of mincore(2).
    pub fn resident_bytes(&self) -> Result<usize, Error> {
        let pages = mem::resident_pages(self.as_ptr(), self.len).map_err(Error::from)?;
        Ok(pages * mem::page_size())
    }

    /// Takes back a region given up with [`ScratchRegion::into_raw`]; `len` is rounded up to a
    /// page.
    ///
    /// # Errors
    /// [`Error::NotRegion`] if `ptr` and `len` do not name a live scratch region exactly.
    ///
    /// # Safety
    /// The caller owns the region (no other handle to it exists).
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Result<ScratchRegion, Error> {
        let len = crate::span::region_len(len).map_err(|_| Error::NotRegion)?;
        let start = NonNull::new(ptr).ok_or(Error::NotRegion)?;
        let known = live().any(|(s, l)| s == ptr as usize && l == len);
        if !known {
            return Err(Error::NotRegion);
        }
        Ok(ScratchRegion { start, len })
    }
}

impl Drop for ScratchRegion {
    fn drop(&mut self) {
        if unrecord(self.start.as_ptr() as usize, self.len) {
            // SAFETY: this handle owned the mapping (it was recorded, and only one handle
            // unrecords it); no reference into it outlives the handle.
            unsafe { mem::unmap(self.start, self.len) };
        }
    }
}
