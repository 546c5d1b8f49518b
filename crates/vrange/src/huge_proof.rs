//! One pin for a whole 2 MiB huge page: how an unmark proves a transparent huge page without
//! 512 locked writes.
//!
//! The witness proof of a page (`witness::pin_word`) is a locked write because the kernel may
//! be discarding that very page while unmark reads it. A huge page mapped by one page-table
//! entry (a PMD) is made dirty as a whole by one write to any of its bytes, and a dirty
//! anonymous page is never discarded (lazy-free reclaim re-checks the dirty bit and keeps the
//! page). So for each whole 2 MiB block of an unmarked span:
//!
//! 1. pin the block's first witness (one locked write: if one PMD maps the block now, the whole
//!    block can no longer be discarded);
//! 2. ask the kernel (PAGEMAP_SCAN, one call for up to 64 blocks) whether one PMD of real
//!    memory maps the block *now*;
//! 3. if so, read every other witness of the block with a plain load; a zero word is a lost
//!    page, as with a pin. Otherwise prove each page with its own pin, as before.
//!
//! Why 3 is sound: when step 2 sees a PMD, that PMD is dirty, so the block's content can no
//! longer change and plain loads read what survived. Either step 1 wrote through that PMD
//! (directly, or by faulting in a fresh huge page where the kernel had discarded the block
//! whole), or it appeared after step 1: a collapse (khugepaged or MADV_COLLAPSE) builds its
//! PMD dirty, and no fault can install one over the page step 1 pinned; a split keeps the dirty
//! bit in every PTE. The check does not assume the huge page stayed whole since the mark:
//! a block the kernel split, discarded in part and collapsed again reads zero where pages were
//! lost, and the loads see it. Pages that were zero or purged before need no proof at all.
//!
//! The check costs one ioctl per 128 MiB window and the loads one cache line per page; the
//! locked writes it saves cost 20–40 ns each. `tests/huge_proof.rs` races it against
//! splitting, page-out and collapse.

use crate::shadow::{self, WITNESS};
use crate::witness;
use std::sync::atomic::Ordering;
use vrange_sys::mem::{self, HUGE_PAGE};
use vrange_sys::pagemap;

/// Blocks one window covers (one bit each).
pub(crate) const WINDOW_BLOCKS: usize = 64;

/// The blocks of a window whose pages may be proven by plain loads.
#[derive(Clone, Copy)]
pub(crate) struct Proven {
    base: usize,
    bits: u64,
}

impl Proven {
    /// Whether the page at `addr` lies in a proven block.
    #[inline]
    pub(crate) fn covers(&self, addr: usize) -> bool {
        let block = addr.wrapping_sub(self.base) / HUGE_PAGE;
        block < WINDOW_BLOCKS && self.bits & (1 << block) != 0
    }

    /// How many blocks were proven.
    pub(crate) fn blocks(&self) -> u32 {
        self.bits.count_ones()
    }
}

/// The end of the window that starts at `start`: at most [`WINDOW_BLOCKS`] blocks past the
/// block `start` lies in, and not past `end`.
pub(crate) fn window_end(start: usize, end: usize) -> usize {
    let base = start & !(HUGE_PAGE - 1);
    end.min(base.saturating_add(WINDOW_BLOCKS * HUGE_PAGE))
}

/// Steps 1 and 2 for the whole blocks of `[start, end)`, a window (see [`window_end`]) of a
/// validated span: pins the first witness of each block that has one, then keeps the blocks one
/// PMD maps now. Async-signal-safe (one ioctl, no allocation).
///
/// # Safety
/// `[start, end)` must be mapped private anonymous read-write memory owned by the caller.
pub(crate) unsafe fn pin_blocks(start: usize, end: usize) -> Proven {
    let base = start & !(HUGE_PAGE - 1);
    let none = Proven { base, bits: 0 };
    // The PMD is 2 MiB only with 4 KiB pages.
    if mem::page_size() != 4096 {
        return none;
    }
    let first = start.next_multiple_of(HUGE_PAGE);
    let last = end & !(HUGE_PAGE - 1);
    if first >= last {
        return none;
    }
    let page = mem::page_size();
    let mut wanted = 0u64;
    let mut block = first;
    while block < last {
        let first_witness = shadow::entries(block, HUGE_PAGE / page).and_then(|entries| {
            entries.iter().enumerate().find_map(|(i, e)| {
                let state = e.load(Ordering::Relaxed);
                (state & WITNESS != 0).then_some((block + i * page, state))
            })
        });
        if let Some((at, state)) = first_witness {
            // SAFETY: the witness index is below the page's word count by construction of the
            // state; the page is the caller's mapped, writable memory.
            unsafe { witness::pin_word((at as *mut u64).add(usize::from(state & !WITNESS))) };
            wanted |= 1 << ((block - base) / HUGE_PAGE);
        }
        block += HUGE_PAGE;
    }
    if wanted == 0 {
        return none;
    }
    let mut bits = 0u64;
    let asked = pagemap::huge_runs(first, last, |s, e| {
        let mut b = s.next_multiple_of(HUGE_PAGE);
        while b + HUGE_PAGE <= e {
            bits |= 1 << ((b - base) / HUGE_PAGE);
            b += HUGE_PAGE;
        }
    });
    match asked {
        Ok(true) => Proven {
            base,
            bits: bits & wanted,
        },
        // Without the answer every page is proven by its own pin.
        _ => none,
    }
}

/// Step 3 for one page of a proven block: whether its witness word reads zero.
///
/// # Safety
/// `word` must point into a page of a block [`Proven::covers`], in the caller's memory.
#[inline]
pub(crate) unsafe fn lost(word: *const u64) -> bool {
    // SAFETY: forwarded; the block is mapped, and its content no longer changes (module docs).
    unsafe { word.read_volatile() == 0 }
}
