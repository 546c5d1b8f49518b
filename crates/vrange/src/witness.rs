//! Witness words: how a page proves it survived.
//!
//! At mark time each page with data remembers the index of one non-zero 64-bit word. At
//! unmark, [`pin_word`] atomically reads that word and writes the same value back. A discarded
//! page reads as zero, so a non-zero answer proves the page was never discarded, and the write
//! sets the page-table dirty bit in the same instruction, so the kernel can no longer discard it
//! (lazy-free reclaim re-checks the dirty bit after clearing the PTE and remaps dirty pages).
//! A write that lands after the PTE is cleared faults in a fresh zero page and reads zero. No
//! window exists in which a page is reported intact but lost.

/// Atomically returns the word at `p` and stores the same value back, as one locked
/// read-modify-write that the compiler cannot turn into a plain load (LLVM rewrites idempotent
/// `fetch_or(0)`/`fetch_add(0)` into loads, which would not dirty the page).
///
/// # Safety
/// `p` must be 8-byte aligned and point into mapped, writable memory that the caller may write.
#[inline(always)]
pub(crate) unsafe fn pin_word(p: *mut u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let mut v: u64 = 0;
        // SAFETY: the caller guarantees p is aligned, mapped and writable. `lock xadd` with a
        // zero addend always performs the locked write of the unchanged value.
        unsafe {
            std::arch::asm!(
                "lock xadd qword ptr [{p}], {v}",
                p = in(reg) p,
                v = inout(reg) v,
                options(nostack),
            );
        }
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::atomic::{AtomicU64, Ordering};
        // SAFETY: the caller guarantees p is aligned, mapped and writable; AtomicU64 has the
        // layout of u64.
        let word = unsafe { &*(p as *const AtomicU64) };
        // A successful compare-exchange always stores, even of the same value.
        let mut v = word.load(Ordering::Relaxed);
        loop {
            match word.compare_exchange_weak(v, v, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return v,
                Err(now) => v = now,
            }
        }
    }
}

/// Index of the first non-zero 64-bit word of the page at `page` (`words` words long), or
/// `None` for an all-zero page.
///
/// # Safety
/// `page` must be 8-byte aligned and point to `words` readable words that no other thread
/// writes during the call.
#[inline]
pub(crate) unsafe fn find(page: *const u64, words: usize) -> Option<usize> {
    // SAFETY: the caller guarantees `words` readable, stable words at `page`.
    let page = unsafe { std::slice::from_raw_parts(page, words) };
    page.iter().position(|&w| w != 0)
}

/// How far ahead, in pages, the page-strided loops of mark and unmark prefetch: the hardware
/// prefetchers stop at 4 KiB boundaries, so every page's first line would otherwise be a
/// serial miss on memory that left the cache.
pub(crate) const PREFETCH_PAGES: usize = 8;

/// Hints the CPU to load the line at `p`. Never faults, whatever `p` is.
#[inline(always)]
pub(crate) fn prefetch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch instructions never fault and have no effect on program state, for any
    // address (unmapped ones included).
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
