//! `#[global_allocator]` for Rust programs: requests at or above the threshold go to
//! vrange-malloc, everything else to the system allocator.

use crate::heap;
use std::alloc::{GlobalAlloc, Layout, System};

/// The allocator type: `#[global_allocator] static A: vrange_malloc::VrangeMalloc =
/// vrange_malloc::VrangeMalloc;`
#[derive(Debug, Default, Clone, Copy)]
pub struct VrangeMalloc;

// SAFETY: blocks come either from the heap (disjoint, aligned as asked, live until freed) or
// from System; every pointer goes back to the allocator that made it (the chunk map tells).
unsafe impl GlobalAlloc for VrangeMalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match heap::alloc(layout.size(), layout.align()) {
            Some(b) => b.ptr.as_ptr(),
            // SAFETY: forwarded from the caller.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match heap::alloc(layout.size(), layout.align()) {
            Some(b) => {
                if !b.zeroed {
                    // SAFETY: the block has at least layout.size() writable bytes.
                    unsafe { b.ptr.as_ptr().write_bytes(0, layout.size()) };
                }
                b.ptr.as_ptr()
            }
            // SAFETY: forwarded from the caller.
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr is live and freed once (the caller's contract).
        if !unsafe { heap::free(ptr) } {
            // SAFETY: not ours, so System's, with this layout.
            unsafe { System.dealloc(ptr, layout) };
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let ours = heap::owns(ptr);
        if ours && layout.align() <= crate::chunk::CHUNK {
            // SAFETY: a live block of ours.
            if unsafe { heap::resize_in_place(ptr, new_size) } {
                return ptr;
            }
        } else if !ours && !heap::serves(new_size, layout.align()) {
            // SAFETY: forwarded from the caller: System's block.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: new_size is non-zero and valid for this alignment (the caller's contract).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: as above.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live and disjoint, each at least this long.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: the old block is no longer used.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}
