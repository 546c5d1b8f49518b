//! The kernel purge path: volatile pages are handed to MADV_FREE, and unmarking proves page by
//! page, with witness words, whether the kernel discarded them.
//!
//! Owns the mark and unmark algorithms over the page-state table (`shadow`). Marking may map
//! table leaves and calls madvise; unmarking is async-signal-safe: it never allocates, never
//! locks and makes no system call except the range check of [`unmark`].

use crate::shadow::{self, PINNED, PURGED, WITNESS, ZERO};
use crate::span::Span;
use crate::sys::{mem, vma};
use crate::{witness, Error, Unmarked};
use std::sync::atomic::{AtomicU16, Ordering};

/// Marks `[ptr, ptr + len)` volatile: the kernel may discard its pages when memory is short,
/// and [`unmark`] will say which it did. Returns the number of bytes marked (`len` rounded up
/// to a page).
///
/// Pages already volatile keep their state (a purge they suffered is still reported at the next
/// unmark). A write into a volatile page keeps that page (and the write) until it is marked
/// again.
///
/// # Errors
/// [`Error::Unaligned`], [`Error::Overflow`], [`Error::OutOfReach`] for bad input;
/// [`Error::NotMapped`] for holes; [`Error::Unsupported`] for shared, file-backed or
/// protected memory; [`Error::Refused`] when the kernel refuses the hint (locked memory), in
/// which case every page of the range is pinned again, except pages found purged, which keep
/// that state so the next unmark reports them. Nothing else is marked on error.
///
/// # Safety
/// The caller must own the memory and hold no reference into it that assumes its content is
/// stable: any page may read as zero once marked, until it is unmarked.
///
/// # References
/// madvise(2) MADV_FREE.
pub unsafe fn mark_volatile(ptr: *mut u8, len: usize) -> Result<usize, Error> {
    let span = Span::new(ptr as usize, len)?;
    if span.is_empty() {
        return Ok(0);
    }
    vma::check_private_anon(span.start, span.end)?;
    // SAFETY: the range was just checked to be private anonymous read-write memory, and the
    // caller owns it.
    unsafe { mark_span(span)? };
    Ok(span.len())
}

/// Pins `[ptr, ptr + len)` again and reports how many of its pages were discarded while
/// volatile. Discarded pages read as zero. Pages that were not volatile count as intact.
///
/// Exact: a page is reported intact only if its content provably survived, and it can no longer
/// be discarded when this returns. A page that was all zero when marked is reported intact and
/// is left as it is (touching it would only fault memory in), so it may still be dropped
/// until written, losing nothing.
///
/// Async-signal-safe: no allocation, no lock; the only system calls are the PROCMAP_QUERY
/// range check (or, on kernels before 6.11, open/read/close of `/proc/self/maps`).
///
/// # Errors
/// As [`mark_volatile`], except that the kernel is never asked anything that can be refused.
///
/// # Safety
/// The caller must own the memory: pages are written (their witness word, atomically, with the
/// value it holds).
pub unsafe fn unmark(ptr: *mut u8, len: usize) -> Result<Unmarked, Error> {
    let span = Span::new(ptr as usize, len)?;
    if span.is_empty() {
        return Ok(Unmarked::default());
    }
    vma::check_private_anon(span.start, span.end)?;
    // SAFETY: the range was just checked to be mapped private anonymous read-write memory.
    Ok(unsafe { unmark_span(span) })
}

/// Marks a span the caller has already validated.
///
/// # Safety
/// `span` must be mapped private anonymous read-write memory owned by the caller.
pub(crate) unsafe fn mark_span(span: Span) -> Result<(), Error> {
    let words = mem::page_size() / 8;
    shadow::for_each(span.start, span.end, true, |page, entry| {
        // SAFETY: page lies in the caller's validated span.
        unsafe { mark_page(page as *mut u64, words, entry) }
    })?;
    if !mem::lazy_free_supported() {
        // Without MADV_FREE nothing can be discarded: the state is kept, the content too.
        return Ok(());
    }
    // SAFETY: every page now has a witness (or is known zero) recorded, so any discard the
    // kernel performs from here on will be detected by unmark.
    if let Err(e) = unsafe { mem::purge_lazy(span.start as *mut u8, span.len()) } {
        // SAFETY: the span is the caller's validated memory.
        unsafe { repin_span(span) };
        return Err(Error::from_errno(e));
    }
    Ok(())
}

/// After a refused mark: pins every page that provably survived and keeps every page found
/// lost as `PURGED`, so that the next unmark still reports it (the kernel may have advised part
/// of the range before refusing the rest, and a page may have been purged before this call).
///
/// # Safety
/// `span` must be mapped private anonymous read-write memory owned by the caller.
unsafe fn repin_span(span: Span) {
    let _ = shadow::for_each(span.start, span.end, false, |page, entry| {
        let state = entry.load(Ordering::Relaxed);
        let next = match state {
            PURGED => PURGED,
            // SAFETY: the witness index is below the page's word count; the page is the
            // caller's mapped writable memory.
            s if s & WITNESS != 0 && unsafe { pin_witness(page, s) } == 0 => PURGED,
            _ => PINNED,
        };
        entry.store(next, Ordering::Relaxed);
    });
}

/// Runs `pin_word` on the witness of a `WITNESS` state.
///
/// # Safety
/// `page` must be the caller's mapped, writable page whose state is `state`.
unsafe fn pin_witness(page: usize, state: u16) -> u64 {
    // SAFETY: forwarded; the index is below the word count by construction of the state.
    unsafe { witness::pin_word((page as *mut u64).add(usize::from(state & !WITNESS))) }
}

/// # Safety
/// `page` must be a mapped, writable page of `words` words owned by the caller.
unsafe fn mark_page(page: *mut u64, words: usize, entry: &AtomicU16) {
    let state = entry.load(Ordering::Relaxed);
    if state == PURGED {
        return;
    }
    if state & WITNESS != 0 {
        // SAFETY: the page is mapped, writable and in state `state`.
        if unsafe { pin_witness(page as usize, state) } == 0 {
            entry.store(PURGED, Ordering::Relaxed);
            return;
        }
    }
    // The page is stable now: never marked, all zero, or made dirty by pin_word above.
    // SAFETY: the page is mapped, readable and owned by the caller.
    let next = match unsafe { witness::find(page, words) } {
        Some(index) => WITNESS | index as u16,
        None => ZERO,
    };
    entry.store(next, Ordering::Relaxed);
}

/// Unmarks a span the caller has already validated. Async-signal-safe.
///
/// # Safety
/// `span` must be mapped private anonymous read-write memory owned by the caller.
pub(crate) unsafe fn unmark_span(span: Span) -> Unmarked {
    let mut result = Unmarked {
        pages: span.len() / mem::page_size(),
        ..Unmarked::default()
    };
    let tally = shadow::for_each(span.start, span.end, false, |page, entry| {
        let state = entry.swap(PINNED, Ordering::Relaxed);
        if state == PINNED {
            return;
        }
        result.volatile += 1;
        let lost = match state {
            PURGED => true,
            ZERO => false,
            // SAFETY: the witness index is below the page's word count; the page is the
            // caller's mapped writable memory.
            _ => unsafe {
                witness::pin_word((page as *mut u64).add(usize::from(state & !WITNESS))) == 0
            },
        };
        result.purged += usize::from(lost);
    });
    // Without create, for_each fails only for spans beyond the table, which Span excludes.
    debug_assert!(tally.is_ok());
    result
}

/// Drops vrange's state for `[ptr, ptr + len)` without touching the memory: call it before
/// unmapping (or otherwise giving up) memory that may still be volatile. Async-signal-safe.
///
/// Without it, a later mapping at the same addresses inherits the old page states, and the
/// worst that can follow is a false "purged" report (a stale witness reads as lost), never a
/// false "intact". [`Region`](crate::Region) does this itself when dropped.
///
/// # Errors
/// As for range validation ([`Error::Unaligned`], [`Error::Overflow`], [`Error::OutOfReach`]);
/// the range need not be mapped.
///
/// # Safety
/// Pages of the range that are still mapped and volatile stay lazy-free: the caller must not
/// rely on their content afterwards.
pub unsafe fn forget(ptr: *mut u8, len: usize) -> Result<(), Error> {
    let span = Span::new(ptr as usize, len)?;
    shadow::forget(span.start, span.end);
    Ok(())
}

/// Number of volatile pages in `[ptr, ptr + len)`; for tests and reports.
///
/// # Errors
/// As for [`Span`] validation.
pub fn volatile_pages(ptr: *const u8, len: usize) -> Result<usize, Error> {
    let span = Span::new(ptr as usize, len)?;
    shadow::count_volatile(span.start, span.end)
}
