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

use crate::sys::mem;
use crate::Error;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU16, Ordering};

/// Not volatile.
pub(crate) const PINNED: u16 = 0;
/// Volatile; the page was all zero when marked.
pub(crate) const ZERO: u16 = 0x4000;
/// Volatile; found discarded by a later mark, to be reported at the next unmark.
pub(crate) const PURGED: u16 = 0x4001;
/// Volatile; the low bits index the witness word.
pub(crate) const WITNESS: u16 = 0x8000;

/// Highest user address tracked, exclusive (48-bit virtual addresses).
pub(crate) const ADDR_LIMIT: usize = 1 << 48;
const LEAF_SHIFT: usize = 18;
const LEAF_PAGES: usize = 1 << LEAF_SHIFT;
const TOP_ENTRIES: usize = ADDR_LIMIT >> 12 >> LEAF_SHIFT;

static TOP: [AtomicPtr<AtomicU16>; TOP_ENTRIES] =
    [const { AtomicPtr::new(null_mut()) }; TOP_ENTRIES];

fn page_shift() -> u32 {
    mem::page_size().trailing_zeros()
}

/// The entries for pages `[first, first + count)` of one leaf, where `first` is a page number.
/// Returns the slice (possibly shorter than `count` if the leaf ends) or `None` if the leaf was
/// never created (no page in it was ever marked).
fn leaf(first: usize, count: usize, create: bool) -> Result<Option<&'static [AtomicU16]>, Error> {
    let top = first >> LEAF_SHIFT;
    let slot = TOP.get(top).ok_or(Error::OutOfReach)?;
    let mut base = slot.load(Ordering::Acquire);
    if base.is_null() {
        if !create {
            return Ok(None);
        }
        base = install_leaf(slot)?;
    }
    let offset = first & (LEAF_PAGES - 1);
    let n = count.min(LEAF_PAGES - offset);
    // SAFETY: base points to a leaf of LEAF_PAGES AtomicU16 that is never unmapped, and
    // offset + n <= LEAF_PAGES.
    Ok(Some(unsafe {
        std::slice::from_raw_parts(base.add(offset), n)
    }))
}

fn install_leaf(slot: &AtomicPtr<AtomicU16>) -> Result<*mut AtomicU16, Error> {
    let bytes = LEAF_PAGES * std::mem::size_of::<AtomicU16>();
    let fresh = mem::map_anon(bytes, mem::page_size()).map_err(Error::Os)?;
    let fresh_ptr = fresh.as_ptr().cast::<AtomicU16>();
    match slot.compare_exchange(null_mut(), fresh_ptr, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Ok(fresh_ptr),
        Err(winner) => {
            // SAFETY: the losing leaf was never published.
            unsafe { mem::unmap(fresh, bytes) };
            Ok(winner)
        }
    }
}

/// Calls `f(page_address, entry)` for every page of `[start, end)` (page-aligned), creating
/// leaves when `create` is set and skipping pages of absent leaves otherwise.
pub(crate) fn for_each(
    start: usize,
    end: usize,
    create: bool,
    mut f: impl FnMut(usize, &AtomicU16),
) -> Result<(), Error> {
    let shift = page_shift();
    let (mut page, last) = (start >> shift, end >> shift);
    while page < last {
        let want = last - page;
        let span = match leaf(page, want, create)? {
            Some(entries) => {
                for (i, entry) in entries.iter().enumerate() {
                    f((page + i) << shift, entry);
                }
                entries.len()
            }
            None => want.min(LEAF_PAGES - (page & (LEAF_PAGES - 1))),
        };
        page += span;
    }
    Ok(())
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
