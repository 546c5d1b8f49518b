//! `VolatileRegion`: the Rust handle of a library-owned region (what `vrange_alloc` returns in
//! C), with O(1) marking for managed and hybrid policies and shared memory between processes.

use crate::managed::{self, Options};
use crate::registry::{self, Policy, Priority};
use crate::span::Span;
use crate::{Error, Unmarked};
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

/// A library-owned region whose ranges can be made volatile. Dropping it frees it.
///
/// ```
/// use vrange::{Options, Policy, VolatileRegion};
/// let r = VolatileRegion::new(1 << 20, Options { policy: Policy::Managed, ..Options::default() })?;
/// // SAFETY: no reference into the region is live while it is volatile.
/// unsafe {
///     r.as_ptr().write_bytes(1, r.len());
///     r.mark()?; // one atomic operation, whatever the size
/// }
/// let report = r.unmark()?;
/// if report.was_purged() {
///     // regenerate: a purged managed range reads as zero
/// }
/// # Ok::<(), vrange::Error>(())
/// ```
#[derive(Debug)]
pub struct VolatileRegion {
    start: NonNull<u8>,
    len: usize,
}

// SAFETY: the handle is an address and a length; every operation synchronises through the
// registry's atomics, and the memory is only reached through the caller's own unsafe code.
unsafe impl Send for VolatileRegion {}
// SAFETY: as above; every &self method is thread-safe.
unsafe impl Sync for VolatileRegion {}

mapping_accessors!(VolatileRegion);

impl VolatileRegion {
    /// Creates a region of at least `len` bytes (rounded up to a page), zero and pinned.
    ///
    /// # Errors
    /// [`Error::NotRegion`] for `len == 0`, [`Error::Overflow`] for absurd sizes,
    /// [`Error::Os`] when mapping (or, for shared regions, memfd creation) fails.
    pub fn new(len: usize, opts: Options) -> Result<VolatileRegion, Error> {
        let (start, len) = managed::create(len, opts)?;
        if opts.policy != Policy::Lazy {
            crate::reclaim::ensure_running();
        }
        Ok(VolatileRegion::at(start, len))
    }

    /// Maps a shared region from a descriptor obtained from [`VolatileRegion::shared_fd`] in
    /// this or another process (passed over a UNIX socket or inherited). The descriptor is
    /// duplicated. The new mapping takes a holder number (see the README: pins die with their
    /// holder) and holds no pin: [`VolatileRegion::unmark`] it, or the part to use, before use;
    /// that unmark reports what was purged since this process mapped it.
    ///
    /// # Errors
    /// [`Error::Unsupported`] if the descriptor is not a vrange shared region (or one of an
    /// older layout); `Error::Os(EUSERS)` if 32 mappings hold numbers in it already (the
    /// numbers of mappings whose process died are released first);
    /// [`Error::Os`] for mapping failures.
    pub fn open_shared(fd: BorrowedFd<'_>, priority: Priority) -> Result<VolatileRegion, Error> {
        VolatileRegion::open_shared_with(
            fd,
            Options {
                priority,
                ..Options::default()
            },
        )
    }

    /// [`VolatileRegion::open_shared`] with the class and SIGBUS mode of `opts` (its other
    /// fields do not apply: the creator chose them). In SIGBUS mode, touching a purged page
    /// of this mapping while it is volatile raises SIGBUS here, whatever mode other processes
    /// chose for theirs.
    ///
    /// # Errors
    /// As [`VolatileRegion::open_shared`]; `Error::Os(ENOTSUP)` for SIGBUS mode without
    /// userfaultfd.
    pub fn open_shared_with(fd: BorrowedFd<'_>, opts: Options) -> Result<VolatileRegion, Error> {
        let (start, len) = managed::open_shared(fd, opts.priority, opts.sigbus)?;
        crate::reclaim::ensure_running();
        Ok(VolatileRegion::at(start, len))
    }

    pub(crate) fn at(start: usize, len: usize) -> VolatileRegion {
        VolatileRegion {
            start: NonNull::new(start as *mut u8).expect("regions are never at address 0"),
            len,
        }
    }

    /// The region's purge policy.
    pub fn policy(&self) -> Policy {
        registry::owner_of(self.as_ptr() as usize)
            .map(|(_, s)| s.policy())
            .unwrap_or_default()
    }

    fn span(&self, offset: usize, len: usize) -> Result<Span, Error> {
        let start = (self.as_ptr() as usize)
            .checked_add(offset)
            .ok_or(Error::Overflow)?;
        let span = Span::new(start, len)?;
        if span.end > self.as_ptr() as usize + self.len {
            return Err(Error::NotMapped);
        }
        Ok(span)
    }

    /// Marks the whole region volatile. For managed and hybrid regions this is one atomic
    /// operation and a clock read.
    ///
    /// # Errors
    /// Lazy regions: [`Error::Refused`] if the kernel refuses (locked memory).
    ///
    /// # Safety
    /// No reference into the region may assume its content is stable until it is unmarked:
    /// the reclaimer (or, for lazy and armed hybrid ranges, the kernel) may replace it with
    /// zeros.
    pub unsafe fn mark(&self) -> Result<(), Error> {
        // SAFETY: forwarded contract.
        unsafe { self.mark_range(0, self.len) }
    }

    /// Marks `len` bytes at `offset` volatile. A call that covers part of a range splits it
    /// first (once; cost proportional to the pages split off). In a shared region it drops this
    /// mapping's pins of those pages, one atomic operation per page: a page no mapping in any
    /// process pins any more may be purged (ashmem's `ASHMEM_UNPIN`, Chromium's
    /// `DiscardableSharedMemory::Unlock(offset, length)`).
    ///
    /// # Errors
    /// [`Error::Unaligned`], [`Error::NotMapped`] past the end, and as
    /// [`VolatileRegion::mark`].
    ///
    /// # Safety
    /// As [`VolatileRegion::mark`], for the range.
    pub unsafe fn mark_range(&self, offset: usize, len: usize) -> Result<(), Error> {
        let span = self.span(offset, len)?;
        if span.is_empty() {
            return Ok(());
        }
        // SAFETY: forwarded contract; the span lies inside this region.
        unsafe { managed::mark(span)? };
        crate::reclaim::noticed_mark();
        crate::reclaim::catch_up();
        Ok(())
    }

    /// Pins the whole region again and reports what was purged while it was volatile.
    ///
    /// # Errors
    /// None in practice for a live region (the signature matches the range variant).
    pub fn unmark(&self) -> Result<Unmarked, Error> {
        self.unmark_range(0, self.len)
    }

    /// Pins `len` bytes at `offset` again and reports what was purged. Waits while the
    /// reclaimer is in the middle of purging or arming one of the ranges. In a shared region it
    /// pins those pages for this mapping and reports, page by page, those it had not pinned
    /// (`volatile`) and those purged since it last held them (`purged`), even if another process
    /// pinned and refilled them first (ashmem's `ASHMEM_PIN`, Chromium's
    /// `DiscardableSharedMemory::Lock(offset, length)`).
    ///
    /// # Errors
    /// As [`VolatileRegion::mark_range`]; in a shared region, `Error::Os(EUSERS)` if this
    /// mapping has no holder number yet (a fork child's) and the region has no free one.
    pub fn unmark_range(&self, offset: usize, len: usize) -> Result<Unmarked, Error> {
        let span = self.span(offset, len)?;
        if span.is_empty() {
            return Ok(Unmarked::default());
        }
        managed::unmark(span)
    }

    /// Pins the whole region and returns a guard that derefs to its bytes and says whether the
    /// content was purged while it was volatile (then it reads as zero: regenerate it through
    /// the guard). Dropping the guard makes the region volatile again. The safe way to use a
    /// region: no reference into it can outlive the pin.
    ///
    /// ```
    /// use vrange::{Options, Policy, VolatileRegion};
    /// let mut img = VolatileRegion::new(1 << 20, Options { policy: Policy::Managed, ..Options::default() })?;
    /// {
    ///     let mut pixels = img.pin()?;
    ///     if pixels.was_purged() || pixels[0] == 0 {
    ///         pixels.fill(0x7f); // decode again
    ///     }
    /// } // volatile again: the system may take it back
    /// assert_eq!(img.pin()?.len(), 1 << 20);
    /// # Ok::<(), vrange::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`VolatileRegion::unmark`]. A failure to mark the region again on drop (lazy regions
    /// in locked memory) leaves it pinned, which loses nothing.
    pub fn pin(&mut self) -> Result<Pinned<'_>, Error> {
        let report = self.unmark()?;
        Ok(Pinned {
            region: self,
            report,
        })
    }

    /// Whether the reclaimer purged the region (or part of it) while it was volatile. Reads
    /// only: unlike [`VolatileRegion::unmark`] it neither pins the region nor changes its age.
    /// Pages the kernel discarded from an armed hybrid range show only at the next unmark.
    pub fn is_purged(&self) -> bool {
        self.is_purged_range(0, self.len).unwrap_or(false)
    }

    /// Whether the reclaimer purged any of `len` bytes at `offset` while volatile (in a shared
    /// region: a page purged that no mapping, in any process, has pinned since). Reads only, as
    /// [`VolatileRegion::is_purged`].
    ///
    /// # Errors
    /// [`Error::Unaligned`], [`Error::NotMapped`] past the end.
    pub fn is_purged_range(&self, offset: usize, len: usize) -> Result<bool, Error> {
        let span = self.span(offset, len)?;
        if span.is_empty() {
            return Ok(false);
        }
        managed::is_purged(span)
    }

    /// How long the region has been volatile, if it is (volatile or armed, not yet purged):
    /// the age the reclaimer orders it by. `None` while pinned, purged or being purged. A
    /// shared region: once no process pins any of its pages, since the most recent of them
    /// became volatile.
    pub fn idle(&self) -> Option<std::time::Duration> {
        let now = vrange_sys::clock::now_ns();
        managed::idle(self.as_ptr() as usize, now).map(std::time::Duration::from_nanos)
    }

    /// Purges the region now if it is volatile, as the reclaimer would (whole ranges; a pinned
    /// range is left alone), and counts it as an explicit purge. Returns the bytes freed. For a
    /// client that keeps its own budget (a cache purging its least recently used entries).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a lazy region (the kernel alone purges those).
    pub fn purge(&self) -> Result<usize, Error> {
        crate::reclaim::purge_region(self.span(0, self.len)?)
    }

    /// Sets the reclaim class of the whole region.
    pub fn set_priority(&self, priority: Priority) {
        let _ = self.set_priority_range(0, self.len, priority);
    }

    /// Sets the reclaim class of `len` bytes at `offset` (splitting ranges as marking does).
    ///
    /// # Errors
    /// As [`VolatileRegion::mark_range`].
    pub fn set_priority_range(
        &self,
        offset: usize,
        len: usize,
        priority: Priority,
    ) -> Result<(), Error> {
        let span = self.span(offset, len)?;
        if span.is_empty() {
            return Ok(());
        }
        managed::set_priority(span, priority)
    }

    /// The memfd of a shared region (`None` for private ones), valid while the region lives.
    /// Send it to another process and map it there with [`VolatileRegion::open_shared`].
    pub fn shared_fd(&self) -> Option<BorrowedFd<'_>> {
        managed::shared_fd(self.as_ptr() as usize)
    }

    /// Takes back ownership of a region given up with [`VolatileRegion::into_raw`] (or
    /// returned by `vrange_alloc`).
    ///
    /// # Errors
    /// [`Error::NotRegion`] unless `ptr` and `len` (rounded up to a page) name a live region.
    ///
    /// # Safety
    /// The caller must own the region: no other handle may free it.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Result<VolatileRegion, Error> {
        let span = Span::new(ptr as usize, len)?;
        match registry::owner_of(span.start) {
            Some((_, s))
                if s.region_start.load(std::sync::atomic::Ordering::Relaxed) == span.start
                    && s.region_len.load(std::sync::atomic::Ordering::Relaxed) == span.len() =>
            {
                Ok(VolatileRegion::at(span.start, span.len()))
            }
            _ => Err(Error::NotRegion),
        }
    }
}

/// A pinned [`VolatileRegion`]: derefs to its bytes, which cannot be purged while the guard
/// lives; dropping it makes the region volatile again. From [`VolatileRegion::pin`].
#[derive(Debug)]
pub struct Pinned<'a> {
    region: &'a mut VolatileRegion,
    report: Unmarked,
}

impl Pinned<'_> {
    /// Whether any content was purged while the region was volatile (it reads as zero).
    pub fn was_purged(&self) -> bool {
        self.report.was_purged()
    }

    /// What the unmark found, page by page.
    pub fn report(&self) -> Unmarked {
        self.report
    }
}

impl std::ops::Deref for Pinned<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the region is mapped, readable and `len` bytes long while the handle lives,
        // and pinned while the guard lives (nothing can purge it); the guard borrows the handle
        // mutably, so no other pin or mark can run meanwhile.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr(), self.region.len()) }
    }
}

impl std::ops::DerefMut for Pinned<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; the guard holds the only borrow of the handle.
        unsafe { std::slice::from_raw_parts_mut(self.region.as_ptr(), self.region.len()) }
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        // SAFETY: the slices handed out borrow the guard, which is being dropped: no reference
        // into the region survives the mark.
        let _ = unsafe { self.region.mark() };
    }
}

/// The start and length of the library-owned region of any kind holding `ptr`, if any: what
/// `from_raw` of its handle type (or [`free_region`](crate::free_region)) needs to name it.
/// Async-signal-safe (one lookup in the region table).
pub fn region_containing(ptr: *const u8) -> Option<(*mut u8, usize)> {
    crate::regions::containing(ptr as usize).map(|(start, len)| (start as *mut u8, len))
}

impl Drop for VolatileRegion {
    fn drop(&mut self) {
        // SAFETY: the handle owns the region and is going away.
        let freed = unsafe { managed::free(self.as_ptr() as usize, self.len) };
        debug_assert!(freed.is_ok());
    }
}
