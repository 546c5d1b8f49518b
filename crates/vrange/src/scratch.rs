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
//! Live scratch regions are extents in the region table (`crate::regions`), so that the
//! classic call can refuse them cheaply (a scratch page cannot be pinned: unmarking one would
//! promise content the kernel may still drop), `vrange_free` can recognise them and `stats()`
//! can count them.

use crate::extents::Kind;
use crate::regions;
use crate::Error;
use std::ptr::NonNull;
use vrange_sys::mem;

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
    /// process already holds [`MAX_SCRATCH_REGIONS`](crate::MAX_SCRATCH_REGIONS).
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
        let recorded = regions::record(
            Kind::Scratch,
            start.as_ptr() as usize,
            len,
            std::ptr::null_mut(),
        );
        if let Err(e) = recorded {
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
        if regions::exactly(Kind::Scratch, ptr as usize, len).is_none() {
            return Err(Error::NotRegion);
        }
        Ok(ScratchRegion { start, len })
    }

    /// The handle of the live scratch region the region table found exactly at `start`, `len`.
    pub(crate) fn adopt(start: usize, len: usize) -> ScratchRegion {
        ScratchRegion {
            start: NonNull::new(start as *mut u8).expect("a region starts above 0"),
            len,
        }
    }
}

impl Drop for ScratchRegion {
    fn drop(&mut self) {
        if regions::remove(Kind::Scratch, self.start.as_ptr() as usize, self.len).is_some() {
            // SAFETY: this handle owned the mapping (it was recorded, and only one handle
            // unrecords it); no reference into it outlives the handle.
            unsafe { mem::unmap(self.start, self.len) };
        }
    }
}
