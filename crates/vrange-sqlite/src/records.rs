//! The memory of a chunk's slot records, each followed by SQLite's header for its page
//! (`pExtra`) on the next cache line (a record is 57 bytes, padded to 64), so the header sits
//! beside the record the lookup read, as SQLite's own cache keeps its record beside its
//! page. Ordinary memory, never volatile: the
//! headers are SQLite's bookkeeping of pages it may still hold. Owns that allocation only;
//! never touches a page's bytes.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Alignment of each record: a cache line.
const LINE: usize = 64;

/// Records of type `T` (the cache's page record; plain data, no drop glue).
pub(crate) struct Records<T> {
    base: NonNull<u8>,
    layout: Layout,
    /// Bytes from one record to the next: the record, the header, rounded up to a line.
    each: usize,
    n: usize,
    _t: PhantomData<T>,
}

impl<T> Records<T> {
    /// `n` records, each followed by `extra` zeroed bytes; record `i` is `init(i, its header)`
    /// (the header pointer is null when `extra` is 0). `None` if the sizes overflow or memory
    /// is refused.
    pub fn new(
        n: usize,
        extra: usize,
        init: impl Fn(usize, *mut libc::c_void) -> T,
    ) -> Option<Records<T>> {
        const { assert!(!std::mem::needs_drop::<T>() && std::mem::align_of::<T>() <= LINE) };
        let each = std::mem::size_of::<T>()
            .checked_add(extra)?
            .checked_next_multiple_of(LINE)?;
        let layout = Layout::from_size_align(each.checked_mul(n.max(1))?, LINE).ok()?;
        // SAFETY: the layout has a non-zero size (at least one record).
        let base = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        for i in 0..n {
            // SAFETY: record i lies inside the allocation (i < n), aligned to LINE, which
            // satisfies T's alignment (checked above); its header follows it inside the same record.
            unsafe {
                let at = base.as_ptr().add(i * each);
                let header = if extra > 0 {
                    at.add(std::mem::size_of::<T>()).cast()
                } else {
                    std::ptr::null_mut()
                };
                at.cast::<T>().write(init(i, header));
            }
        }
        Some(Records {
            base,
            layout,
            each,
            n,
            _t: PhantomData,
        })
    }

    /// Record `i` (`i` below the count given to `new`).
    pub fn at(&self, i: usize) -> *mut T {
        assert!(i < self.n);
        // SAFETY: record i lies inside the allocation, which lives as long as self.
        unsafe { self.base.as_ptr().add(i * self.each).cast() }
    }
}

impl<T> Drop for Records<T> {
    fn drop(&mut self) {
        // SAFETY: allocated by `new` with this layout; `T` has no drop glue (checked in `new`).
        unsafe { dealloc(self.base.as_ptr(), self.layout) }
    }
}

// SAFETY: the allocation is owned outright; its records are used under their cache's lock.
unsafe impl<T> Send for Records<T> {}
