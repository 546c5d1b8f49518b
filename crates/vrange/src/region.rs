//! `Region`: a library-owned anonymous mapping whose sub-ranges can be made volatile.
//!
//! The base that managed purging, the allocator and the cache build on: it owns its mapping
//! (2 MiB-aligned and THP-advised when large), so marking skips the mapping check that
//! arbitrary memory needs, and dropping it forgets the state of its pages.

use crate::lazy;
use crate::span::Span;
use crate::{Error, Unmarked};
use std::ptr::NonNull;
use vrange_sys::mem::{self, HUGE_PAGE};
use vrange_sys::probe::{thp_mode, ThpMode};

/// Whether a region asks for transparent huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Huge {
    /// Huge pages for regions of 2 MiB or more when the kernel's THP mode allows them.
    #[default]
    Auto,
    /// Always align to 2 MiB and advise huge pages.
    Always,
    /// Never: 4 KiB pages only (MADV_NOHUGEPAGE).
    Never,
}

/// An owned, page-aligned anonymous mapping with volatile sub-ranges.
///
/// Content starts zero. The region hands out raw pointers only; whoever reads or writes
/// through them must respect the volatile state of the pages they touch.
#[derive(Debug)]
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    huge: bool,
}

// SAFETY: a Region is an owned mapping; its methods synchronise through the page-state table's
// atomics, and the raw memory is only reached through the caller's own unsafe code.
unsafe impl Send for Region {}
// SAFETY: as above; every &self method is thread-safe.
unsafe impl Sync for Region {}

impl Region {
    /// Maps a region of at least `len` bytes (rounded up to a page) with [`Huge::Auto`].
    ///
    /// # Errors
    /// [`Error::Overflow`] for absurd sizes, [`Error::Os`] with mmap's errno otherwise.
    pub fn new(len: usize) -> Result<Region, Error> {
        Region::with_huge(len, Huge::Auto)
    }

    /// Maps a region of at least `len` bytes with the given huge-page choice.
    ///
    /// # Errors
    /// As [`Region::new`].
    pub fn with_huge(len: usize, huge: Huge) -> Result<Region, Error> {
        let page = mem::page_size();
        let len = len.checked_add(page - 1).ok_or(Error::Overflow)? & !(page - 1);
        let len = len.max(page);
        let (base, huge) = map_owned(len, huge)?;
        Ok(Region { base, len, huge })
    }

    /// First byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Length in bytes (a page multiple).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a region has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the region is 2 MiB-aligned and advised for transparent huge pages.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    fn span(&self, offset: usize, len: usize) -> Result<Span, Error> {
        let start = (self.base.as_ptr() as usize)
            .checked_add(offset)
            .ok_or(Error::Overflow)?;
        let span = Span::new(start, len)?;
        if span.end > self.base.as_ptr() as usize + self.len {
            return Err(Error::NotMapped);
        }
        Ok(span)
    }

    /// Marks `len` bytes at `offset` volatile (kernel path). Returns the bytes marked.
    ///
    /// # Errors
    /// [`Error::Unaligned`] for an unaligned offset, [`Error::NotMapped`] past the end,
    /// [`Error::Refused`] if the kernel refuses (the region was locked).
    ///
    /// # Safety
    /// No reference into the range may be live while it is volatile: the kernel may replace
    /// any of its pages with zeros until [`Region::unmark`] returns.
    pub unsafe fn mark_volatile(&self, offset: usize, len: usize) -> Result<usize, Error> {
        let span = self.span(offset, len)?;
        if !span.is_empty() {
            // SAFETY: the span lies inside this region's own private anonymous mapping.
            unsafe { lazy::mark_span(span)? };
        }
        Ok(span.len())
    }

    /// Pins `len` bytes at `offset` again and reports what was discarded. Async-signal-safe
    /// (no system call but one PAGEMAP_SCAN ioctl per 128 MiB when the range holds whole
    /// 2 MiB blocks).
    ///
    /// # Errors
    /// [`Error::Unaligned`] for an unaligned offset, [`Error::NotMapped`] past the end.
    pub fn unmark(&self, offset: usize, len: usize) -> Result<Unmarked, Error> {
        let span = self.span(offset, len)?;
        // SAFETY: the span lies inside this region's own mapping, which lives as long as self.
        Ok(unsafe { lazy::unmark_span(span) })
    }

    /// Number of volatile pages in `len` bytes at `offset`.
    ///
    /// # Errors
    /// As [`Region::unmark`].
    pub fn volatile_pages(&self, offset: usize, len: usize) -> Result<usize, Error> {
        let span = self.span(offset, len)?;
        lazy::volatile_pages(span.start as *const u8, span.len())
    }
}

/// Maps `len` bytes (a page multiple) of private anonymous memory for a library-owned region:
/// 2 MiB-aligned and advised huge when `huge` asks for it (for `Auto`: at least 2 MiB and the
/// kernel's THP mode allows it). Returns the mapping and whether it is huge.
pub(crate) fn map_owned(len: usize, huge: Huge) -> Result<(NonNull<u8>, bool), Error> {
    let thp_allowed = !matches!(thp_mode(), ThpMode::Never | ThpMode::Unavailable);
    let huge = match huge {
        Huge::Always => true,
        Huge::Never => false,
        Huge::Auto => thp_allowed && len >= HUGE_PAGE,
    };
    let align = if huge { HUGE_PAGE } else { mem::page_size() };
    let base = mem::map_anon(len, align).map_err(Error::from)?;
    // Advice failure only costs performance (no THP built in): ignore it.
    let _ = mem::advise_huge(base.as_ptr(), len, huge);
    Ok((base, huge))
}

impl Drop for Region {
    fn drop(&mut self) {
        let start = self.base.as_ptr() as usize;
        crate::shadow::forget(start, start + self.len);
        // SAFETY: the region owns its mapping and is going away; it handed out no references.
        unsafe { mem::unmap(self.base, self.len) };
    }
}
