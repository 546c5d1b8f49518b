//! The kernel purge path: volatile pages are handed to MADV_FREE, and unmarking proves page by
//! page, with witness words, whether the kernel discarded them.
//!
//! Owns the mark and unmark algorithms over the page-state table (`shadow`). Marking may map
//! table leaves and calls madvise; unmarking is async-signal-safe: it never allocates, never
//! locks and makes no system call except the range check of [`unmark`] and the huge-page
//! check of `huge_proof`.

use crate::shadow::{self, PINNED, PURGED, WITNESS, ZERO};
use crate::span::Span;
use crate::{huge_proof, sigbus, witness, Error, Unmarked};
use std::sync::atomic::{AtomicU16, Ordering};
use vrange_sys::{mem, vma};

/// Marks a validated span of arbitrary memory (the public entry is [`crate::mark_volatile`]),
/// after checking that it is private anonymous read-write memory.
///
/// # Safety
/// As [`crate::mark_volatile`].
pub(crate) unsafe fn mark_volatile(span: Span) -> Result<usize, Error> {
    check_mapping(span)?;
    // SAFETY: the range was just checked to be private anonymous read-write memory, and the
    // caller owns it.
    unsafe { mark_span(span)? };
    Ok(span.len())
}

/// [`mark_volatile`] in SIGBUS mode (see `sigbus`).
///
/// # Safety
/// As [`crate::mark_volatile_sigbus`].
pub(crate) unsafe fn mark_volatile_sigbus(span: Span) -> Result<usize, Error> {
    check_mapping(span)?;
    // SAFETY: as in mark_volatile.
    unsafe { mark_span_sigbus(span)? };
    Ok(span.len())
}

/// [`mark_span`] in SIGBUS mode: unregistered first (marking a volatile page again proves its
/// witness, which must not signal), marked (the scan maps a zero page at every page never
/// touched, so only pages discarded from now on are missing), then registered. A range that
/// cannot be registered is pinned again.
///
/// # Safety
/// As [`mark_span`].
pub(crate) unsafe fn mark_span_sigbus(span: Span) -> Result<(), Error> {
    sigbus::disarm(span);
    let fd = sigbus::ensure()?;
    // SAFETY: forwarded contract.
    unsafe { mark_span(span)? };
    if let Err(e) = sigbus::register(fd, span) {
        // SAFETY: forwarded contract.
        unsafe { repin_span(span) };
        return Err(e);
    }
    Ok(())
}

/// Unmarks a validated span of arbitrary memory (the public entry is [`crate::unmark`]).
/// Async-signal-safe.
///
/// # Safety
/// As [`crate::unmark`].
pub(crate) unsafe fn unmark(span: Span) -> Result<Unmarked, Error> {
    check_mapping(span)?;
    // Memory marked in SIGBUS mode stops signalling first: the proof reads every page.
    sigbus::disarm(span);
    // SAFETY: the range was just checked to be mapped private anonymous read-write memory.
    Ok(unsafe { unmark_span(span) })
}

/// Whether the kernel path can serve `span`: [`Error::NotMapped`] for a hole,
/// [`Error::Unsupported`] for shared, file-backed, read-only or inaccessible memory.
/// Async-signal-safe.
fn check_mapping(span: Span) -> Result<(), Error> {
    match vma::check_private_anon(span.start, span.end)? {
        vma::Coverage::PrivateAnon => Ok(()),
        vma::Coverage::Hole => Err(Error::NotMapped),
        vma::Coverage::Other => Err(Error::Unsupported),
    }
}

/// Marks a span the caller has already validated.
///
/// # Safety
/// `span` must be mapped private anonymous read-write memory owned by the caller.
pub(crate) unsafe fn mark_span(span: Span) -> Result<(), Error> {
    let page_size = mem::page_size();
    let words = page_size / 8;
    shadow::for_each(span.start, span.end, true, |page, entry| {
        witness::prefetch((page + witness::PREFETCH_PAGES * page_size) as *const u64);
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
        return Err(Error::from_advice(e));
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

/// Unmarks a span the caller has already validated. Async-signal-safe: whole 2 MiB blocks
/// make one PAGEMAP_SCAN ioctl per 128 MiB (see `huge_proof`), nothing else calls the kernel.
///
/// # Safety
/// `span` must be mapped private anonymous read-write memory owned by the caller.
pub(crate) unsafe fn unmark_span(span: Span) -> Unmarked {
    let page_size = mem::page_size();
    let mut result = Unmarked {
        pages: span.len() / page_size,
        ..Unmarked::default()
    };
    let mut start = span.start;
    while start < span.end {
        let end = huge_proof::window_end(start, span.end);
        // SAFETY: forwarded: a window of the caller's validated span.
        let proven = unsafe { huge_proof::pin_blocks(start, end) };
        let tally = shadow::for_each(start, end, false, |page, entry| {
            let covered = proven.covers(page);
            if covered {
                witness::prefetch((page + witness::PREFETCH_PAGES * page_size) as *const u64);
            }
            // A proven block needs no locked exchange per entry either: the caller owns the
            // span, and nothing else changes these entries during its unmark.
            let state = if covered {
                let s = entry.load(Ordering::Relaxed);
                if s != PINNED {
                    entry.store(PINNED, Ordering::Relaxed);
                }
                s
            } else {
                entry.swap(PINNED, Ordering::Relaxed)
            };
            if state == PINNED {
                return;
            }
            result.volatile += 1;
            let lost = match state {
                PURGED => true,
                ZERO => false,
                _ => {
                    let word = (page as *mut u64).wrapping_add(usize::from(state & !WITNESS));
                    if covered {
                        // SAFETY: a page of a block pin_blocks proved mapped and stable.
                        unsafe { huge_proof::lost(word) }
                    } else {
                        // SAFETY: the witness index is below the page's word count; the page
                        // is the caller's mapped writable memory.
                        unsafe { witness::pin_word(word) == 0 }
                    }
                }
            };
            result.purged += usize::from(lost);
        });
        // Without create, for_each fails only for spans beyond the table, which Span excludes.
        debug_assert!(tally.is_ok());
        crate::stats::count_huge_proofs(proven.blocks());
        start = end;
    }
    result
}

/// Drops vrange's state for `[ptr, ptr + len)` without touching the memory: call it before
/// unmapping (or otherwise giving up) memory that may still be volatile. Async-signal-safe.
///
/// Without it, a later mapping at the same addresses inherits the old page states, and the
/// worst that can follow is a false "purged" report (a stale witness reads as lost), never a
/// false "intact". [`Region`](crate::Region) does this itself when dropped. Memory marked in
/// SIGBUS mode stops signalling.
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
    sigbus::disarm(span);
    shadow::forget(span.start, span.end);
    Ok(())
}

/// Number of volatile pages in `[ptr, ptr + len)`; for tests and reports.
///
/// # Errors
/// [`Error::Unaligned`], [`Error::Overflow`] or [`Error::OutOfReach`] for a range that fails
/// the madvise(2)-style checks (`ptr` page-aligned, no overflow, within the tracked space).
pub fn volatile_pages(ptr: *const u8, len: usize) -> Result<usize, Error> {
    let span = Span::new(ptr as usize, len)?;
    shadow::count_volatile(span.start, span.end)
}
