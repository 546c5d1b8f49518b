//! The registry's slot arena: slots in chunks that are mapped as the arena grows and never
//! unmapped, a free list of recycled slots, and scans that read every slot handed out without a
//! lock (the reclaimer's).
//!
//! | step | writer (under the registry's lock) | a scan that races it |
//! |---|---|---|
//! | grow | maps a chunk and publishes it (Release), then raises `high` (Release) | reads `high` (Acquire): every chunk below it is published |
//! | alloc | pops the free list, or takes index `high` | — |
//! | free | pushes the slot (already retired by its owner) | may still read it: slots are never unmapped, and the owner's state word tells a stale reader off |
//!
//! Index 0 is never handed out, so that 0 can mean "none" in the free list and the owner map.
//! This file depends only on `crate::sync`, so that the loom model (`tests/loom_registry.rs`)
//! compiles it against loom's atomics, with slots of its own.

use crate::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use crate::sync::atomic::{AtomicPtr, AtomicU32};

/// No slot: ends the free list.
pub(crate) const NONE: u32 = 0;

/// A slot of the arena: it carries the free list's link.
pub(crate) trait Linked {
    fn next_free(&self) -> &AtomicU32;
}

/// The arena: its chunks' pointers, how many slots were ever handed out, the free list, and how
/// a chunk is made.
pub(crate) struct Arena<'a, S> {
    pub(crate) chunks: &'a [AtomicPtr<S>],
    /// Slots per chunk, as a shift.
    pub(crate) chunk_shift: u32,
    /// One past the highest index handed out (starts at 1).
    pub(crate) high: &'a AtomicU32,
    pub(crate) free_head: &'a AtomicU32,
    /// Makes a chunk of `1 << chunk_shift` slots, each valid as it is (a fresh zeroed mapping
    /// for the registry's slots), or `None` when memory cannot be had.
    pub(crate) new_chunk: fn(usize) -> Option<*mut S>,
}

/// The arena has no room left (every chunk is used), or a chunk could not be made.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Exhausted;

impl<'a, S: Linked> Arena<'a, S> {
    /// The slot with index `idx`, which must have been handed out by [`Arena::alloc_locked`].
    #[inline]
    pub(crate) fn get(&self, idx: u32) -> &'a S {
        let chunk = self.chunks[(idx >> self.chunk_shift) as usize].load(Acquire);
        debug_assert!(!chunk.is_null());
        let within = idx as usize & ((1 << self.chunk_shift) - 1);
        // SAFETY: idx was handed out, so its chunk was published (Release) before `high` passed
        // it or before it entered the free list; chunks are never unmapped (they live as long
        // as the arena's chunk table), and hold `1 << chunk_shift` valid slots.
        unsafe { &*chunk.add(within) }
    }

    /// Hands out a slot: a recycled one, or the next never used (mapping its chunk first).
    /// The caller holds the arena's lock.
    pub(crate) fn alloc_locked(&self) -> Result<u32, Exhausted> {
        let head = self.free_head.load(Relaxed);
        if head != NONE {
            self.free_head
                .store(self.get(head).next_free().load(Relaxed), Relaxed);
            return Ok(head);
        }
        let idx = self.high.load(Relaxed);
        let chunk = (idx >> self.chunk_shift) as usize;
        let cell = self.chunks.get(chunk).ok_or(Exhausted)?;
        if cell.load(Relaxed).is_null() {
            let fresh = (self.new_chunk)(1 << self.chunk_shift).ok_or(Exhausted)?;
            cell.store(fresh, Release);
        }
        self.high.store(idx + 1, Release);
        Ok(idx)
    }

    /// Puts slot `idx` (retired by its owner) back on the free list. The caller holds the
    /// arena's lock.
    pub(crate) fn free_locked(&self, idx: u32) {
        let s = self.get(idx);
        s.next_free().store(self.free_head.load(Relaxed), Relaxed);
        self.free_head.store(idx, Relaxed);
    }

    /// How many slots have ever been handed out (live or free), plus one for index 0: a bound
    /// on a scan's results.
    pub(crate) fn high(&self) -> u32 {
        self.high.load(Acquire)
    }

    /// Calls `f` for every slot ever handed out, without a lock: the slots may change under
    /// `f`, which must re-check their state.
    pub(crate) fn for_each(&self, mut f: impl FnMut(u32, &'a S)) {
        let high = self.high();
        for idx in 1..high {
            f(idx, self.get(idx));
        }
    }
}
