//! The page-state table of the kernel purge path: one 16-bit entry per page of the address
//! space, allocated lazily in 1 GiB leaves (512 KiB each, populated on touch), so that any
//! private anonymous memory (malloc, mmap, a `Vec`) can be marked without registering it.
//!
//! Lookups never allocate or lock, so unmarking stays async-signal-safe; only marking may map a
//! new leaf. Leaves are never freed. The table is private memory, so a fork child inherits the
//! state with the pages.
//!
//! # States and transitions of one page
//!
//! | state        | mark                                       | unmark                          | kernel discards page        |
//! |--------------|--------------------------------------------|---------------------------------|-----------------------------|
//! | `PINNED`     | scan page → `WITNESS(i)` or `ZERO`          | nothing to do, reports intact   | impossible (page not lazy)  |
//! | `WITNESS(i)` | `pin_word(i)`: non-zero → rescan as `PINNED`; zero → `PURGED` | `pin_word(i)`: non-zero → intact, zero → purged; → `PINNED` | word `i` now reads zero |
//! | `ZERO`       | rescan as `PINNED`                          | intact (a zero page loses nothing); → `PINNED` | nothing is lost |
//! | `PURGED`     | stays `PURGED` (a purge is reported once, at the next unmark) | purged; → `PINNED` | — |
//!
//! The scan always happens before the page is handed to MADV_FREE (or after `pin_word` made it
//! dirty again), so it never reads a page the kernel may be discarding.

use crate::page_index::PageIndex;
use crate::Error;
use std::sync::atomic::{AtomicU16, Ordering};

/// Not volatile.
pub(crate) const PINNED: u16 = 0;
/// Volatile; the page was all zero when marked.
pub(crate) const ZERO: u16 = 0x4000;
/// Volatile; found discarded by a later mark, to be reported at the next unmark.
pub(crate) const PURGED: u16 = 0x4001;
/// Volatile; the low bits index the witness word.
pub(crate) const WITNESS: u16 = 0x8000;

static TABLE: PageIndex<AtomicU16> = PageIndex::new();

/// Calls `f(page_address, entry)` for every page of `[start, end)` (page-aligned), creating
/// leaves when `create` is set and skipping pages of absent leaves otherwise.
pub(crate) fn for_each(
    start: usize,
    end: usize,
    create: bool,
    f: impl FnMut(usize, &AtomicU16),
) -> Result<(), Error> {
    TABLE.for_each(start, end, create, f)
}

/// The entries of the `pages` pages from `start` (page-aligned), if their leaf exists; a
/// 2 MiB block never straddles two leaves.
pub(crate) fn entries(start: usize, pages: usize) -> Option<&'static [AtomicU16]> {
    TABLE.entries(start, pages)
}

/// Resets every page of `[start, end)` to `PINNED`, for memory that is about to be unmapped.
pub(crate) fn forget(start: usize, end: usize) {
    let _ = for_each(start, end, false, |_, e| e.store(PINNED, Ordering::Relaxed));
}

/// Counts the volatile pages of `[start, end)`.
pub(crate) fn count_volatile(start: usize, end: usize) -> Result<usize, Error> {
    let mut n = 0;
    for_each(start, end, false, |_, e| {
        n += usize::from(e.load(Ordering::Relaxed) != PINNED)
    })?;
    Ok(n)
}
