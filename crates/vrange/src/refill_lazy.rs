//! A refill region's blocks on their way to the lazy-free path. A block just put in place is
//! dirty anonymous memory, which a machine without swap cannot reclaim until it is lazily freed
//! (MADV_FREE). That call costs more than the rest of a fault (its page walk, the move of the
//! pages to the lazy-free list, the TLB flush): freeing each block as it is made doubled the
//! time of a fault on a missing page. So blocks made one after another, as a thread reading
//! through a region makes them, join a run that is freed in one call
//! when the next block is not its neighbour, when it reaches [`RUN_MAX`] bytes, when memory is
//! short (the block and the run at once), and within a moment otherwise: the refill thread
//! before it sleeps, the reclaimer at each tick for regions filled on the faulting thread
//! ([`Run::flush`]). What the kernel cannot take meanwhile is one run per region, at most
//! [`RUN_MAX`] bytes, for at most one tick.
//!
//! A write to a refill page is not kept for good either way (the module documentation of
//! `crate::refill`): a run freed later than its block was made may let the kernel take a page
//! written meanwhile, which is then made again by the fill, as any page it takes.
//!
//! Lock-free and async-signal-safe (a SIGBUS handler makes blocks too): the run is one word,
//! its first block and its length in blocks, changed by compare-exchange; whoever takes a run
//! out of the word frees it, inside the region (the callers are).

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use vrange_sys::mem;

/// The largest run, in bytes (at least one block).
pub(crate) const RUN_MAX: usize = 1 << 20;

/// A region's run of blocks made but not yet lazily freed: `first << 32 | count`, 0 for none.
#[derive(Default)]
pub(crate) struct Run(AtomicU64);

/// Where a region's blocks lie.
#[derive(Clone, Copy)]
pub(crate) struct Place {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) block: usize,
}

impl Place {
    /// Lazily frees `count` blocks from block `first` (the region's last one may be short).
    fn free(&self, first: u64, count: u64) {
        let Some(from) = (first as usize).checked_mul(self.block) else {
            return;
        };
        if count == 0 || from >= self.len {
            return;
        }
        let bytes = (count as usize)
            .saturating_mul(self.block)
            .min(self.len - from);
        // SAFETY: blocks of a live refill region (the caller is inside it), whose content is
        // the fill's, made again when the kernel takes it.
        let _ = unsafe { mem::purge_lazy((self.start + from) as *mut u8, bytes) };
    }
}

fn unpack(word: u64) -> (u64, u64) {
    (word >> 32, word & u64::from(u32::MAX))
}

impl Run {
    /// The block at `offset` was just put in place: joins the run, or frees it at once with
    /// the run when `short` (memory is short by the caller's rule).
    pub(crate) fn made(&self, place: Place, offset: usize, short: bool) {
        let index = offset / place.block;
        let max = (RUN_MAX / place.block).max(1) as u64;
        let Ok(index) = u32::try_from(index).map(u64::from) else {
            return place.free(index as u64, 1);
        };
        if short {
            self.flush(place);
            return place.free(index, 1);
        }
        let mut word = self.0.load(Acquire);
        loop {
            let (first, count) = unpack(word);
            let joins = count > 0 && first + count == index && count < max;
            let next = if joins { word + 1 } else { index << 32 | 1 };
            match self.0.compare_exchange_weak(word, next, AcqRel, Acquire) {
                Ok(_) => {
                    if !joins {
                        place.free(first, count);
                    }
                    return;
                }
                Err(now) => word = now,
            }
        }
    }

    /// Frees the run now, if there is one.
    pub(crate) fn flush(&self, place: Place) {
        let (first, count) = unpack(self.0.swap(0, AcqRel));
        place.free(first, count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_join_a_run_and_a_stranger_or_a_full_run_frees_it() {
        let page = mem::page_size();
        let block = 4 * page;
        let len = 1024 * block;
        let at = mem::map_anon(len, page).expect("map");
        let place = Place {
            start: at.as_ptr() as usize,
            len,
            block,
        };
        let run = Run::default();
        run.made(place, 0, false);
        run.made(place, block, false);
        run.made(place, 2 * block, false);
        assert_eq!(unpack(run.0.load(Acquire)), (0, 3));
        run.made(place, 9 * block, false);
        assert_eq!(
            unpack(run.0.load(Acquire)),
            (9, 1),
            "a stranger starts a new run"
        );
        let max = (RUN_MAX / block) as u64;
        for i in 10..9 + max {
            run.made(place, i as usize * block, false);
        }
        assert_eq!(unpack(run.0.load(Acquire)), (9, max));
        run.made(place, (9 + max) as usize * block, false);
        assert_eq!(
            unpack(run.0.load(Acquire)),
            (9 + max, 1),
            "a full run is freed"
        );
        run.made(place, (10 + max) as usize * block, true);
        assert_eq!(
            run.0.load(Acquire),
            0,
            "short: the run and the block go at once"
        );
        run.made(place, 0, false);
        run.flush(place);
        assert_eq!(run.0.load(Acquire), 0);
        // SAFETY: mapped above; nothing refers into it.
        unsafe { mem::unmap(at, len) };
    }
}
