//! A lazily allocated table with one atomic entry per page of the address space: 2^18 leaf
//! pointers, each leaf covering 1 GiB and mapped (zeroed, populated on touch) the first time an
//! entry in it is created. Lookups never allocate or lock, so readers stay async-signal-safe;
//! leaves are never freed. The page-state table (`shadow`) and the owner map of managed ranges
//! (`registry`) are both instances.

use crate::span::ADDR_LIMIT;
use crate::Error;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU16, AtomicU32, Ordering};
use vrange_sys::mem;

/// Atomic integers whose all-zero bit pattern is a valid value (so a fresh anonymous mapping
/// is a valid leaf of them).
///
/// # Safety
/// Implementors must be valid when zero-initialised and have no drop glue.
pub(crate) unsafe trait ZeroAtomic: Sync + 'static {}
// SAFETY: atomic integers are plain integers in memory; zero is a valid value.
unsafe impl ZeroAtomic for AtomicU16 {}
// SAFETY: as above.
unsafe impl ZeroAtomic for AtomicU32 {}

const LEAF_SHIFT: usize = 18;
const LEAF_PAGES: usize = 1 << LEAF_SHIFT;
const TOP_ENTRIES: usize = ADDR_LIMIT >> 12 >> LEAF_SHIFT;

pub(crate) struct PageIndex<E: ZeroAtomic> {
    top: [AtomicPtr<E>; TOP_ENTRIES],
}

fn page_shift() -> u32 {
    mem::page_size().trailing_zeros()
}

impl<E: ZeroAtomic> PageIndex<E> {
    pub const fn new() -> Self {
        PageIndex {
            top: [const { AtomicPtr::new(null_mut()) }; TOP_ENTRIES],
        }
    }

    /// The entries for pages `[first, first + count)` of one leaf (`first` is a page number).
    /// Returns the slice (shorter than `count` where the leaf ends) or `None` if the leaf was
    /// never created.
    fn leaf(&self, first: usize, count: usize, create: bool) -> Result<Option<&[E]>, Error> {
        let slot = self.top.get(first >> LEAF_SHIFT).ok_or(Error::OutOfReach)?;
        let mut base = slot.load(Ordering::Acquire);
        if base.is_null() {
            if !create {
                return Ok(None);
            }
            base = install_leaf(slot)?;
        }
        let offset = first & (LEAF_PAGES - 1);
        let n = count.min(LEAF_PAGES - offset);
        // SAFETY: base points to a leaf of LEAF_PAGES entries that is never unmapped, valid when
        // zero (ZeroAtomic), and offset + n <= LEAF_PAGES.
        Ok(Some(unsafe {
            std::slice::from_raw_parts(base.add(offset), n)
        }))
    }

    /// The entries of the `count` pages from the page holding `addr` (fewer where its leaf
    /// ends), if the leaf exists. Async-signal-safe.
    pub fn entries(&self, addr: usize, count: usize) -> Option<&[E]> {
        self.leaf(addr >> page_shift(), count, false).ok().flatten()
    }

    /// The entry of the page holding `addr`, if its leaf exists. Async-signal-safe.
    pub fn get(&self, addr: usize) -> Option<&E> {
        match self.leaf(addr >> page_shift(), 1, false) {
            Ok(Some(entries)) => entries.first(),
            _ => None,
        }
    }

    /// Calls `f(page_address, entry)` for every page of `[start, end)` (page-aligned), creating
    /// leaves when `create` is set and skipping pages of absent leaves otherwise.
    pub fn for_each(
        &self,
        start: usize,
        end: usize,
        create: bool,
        mut f: impl FnMut(usize, &E),
    ) -> Result<(), Error> {
        let shift = page_shift();
        let (mut page, last) = (start >> shift, end >> shift);
        while page < last {
            let want = last - page;
            let span = match self.leaf(page, want, create)? {
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
}

fn install_leaf<E>(slot: &AtomicPtr<E>) -> Result<*mut E, Error> {
    let bytes = LEAF_PAGES * std::mem::size_of::<E>();
    let fresh = mem::map_anon(bytes, mem::page_size()).map_err(Error::from)?;
    let fresh_ptr = fresh.as_ptr().cast::<E>();
    match slot.compare_exchange(null_mut(), fresh_ptr, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Ok(fresh_ptr),
        Err(winner) => {
            // SAFETY: the losing leaf was never published.
            unsafe { mem::unmap(fresh, bytes) };
            Ok(winner)
        }
    }
}
