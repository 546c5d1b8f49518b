//! Ranges whose extent a client manages: an allocator's free spans. They live in the registry
//! like a region's ranges, so the reclaimer ages, arms and purges them with the same state
//! machine, but they are not in the owner map (the client knows its ranges; nothing looks them
//! up by address) and their owner moves their ends as spans are split and coalesced.
//!
//! Every operation claims the range first (`BUSY`), which waits out a purge or an arming step
//! in progress and keeps the reclaimer off while the extent changes. All are O(1) except where
//! a hybrid range was armed: then the armed pages that leave the range are proved (or
//! forgotten) page by page.
//!
//! Nothing here allocates or takes a lock other than the registry's free-list lock (a leaf),
//! except that making a range volatile starts the reclaimer thread if it is not running (as
//! any managed mark does) and wakes it when the budget is exceeded.

use crate::lazy;
use crate::registry::{self, Policy, Priority, Slot};
use crate::shadow;
use crate::span::Span;
use crate::state::{self, Found};
use crate::stats;
use crate::{reclaim, Error};
use std::sync::atomic::Ordering::{Relaxed, Release};
use vrange_sys::{clock, mem};

/// What the bytes of a new range hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// Written before: resident, the reclaimer may purge them.
    Dirty,
    /// Never touched since they were mapped (or known discarded): they read as zero and hold no
    /// memory, so the range starts out purged.
    Zero,
}

/// What the bytes taken out of a range hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Taken {
    /// Pages taken.
    pub pages: usize,
    /// Of those, pages the reclaimer or the kernel discarded (they read as zero and fault on
    /// first touch).
    pub purged: usize,
    /// Every byte taken reads as zero (a `calloc` need not clear them).
    pub zero: bool,
}

/// One range of a client's memory, registered with the reclaimer while the client keeps it
/// volatile (or purged). Owned by exactly one client structure; calls on one range must not
/// race each other (the reclaimer's may: that is what the state word is for).
#[derive(Debug, PartialEq, Eq)]
pub struct OwnedRange(u32);

impl OwnedRange {
    /// Registers `[start, start + len)` (page-aligned, private anonymous memory the caller owns)
    /// as a volatile range: the reclaimer may purge it from now on.
    ///
    /// # Errors
    /// [`Error::Unaligned`]/[`Error::Overflow`] for a bad span; `ENOMEM` when the registry is full.
    ///
    /// # Safety
    /// The caller gives up the content of the span until it takes it back with
    /// [`OwnedRange::take`] or [`OwnedRange::take_tail`], and keeps it mapped until then.
    pub unsafe fn new(
        start: usize,
        len: usize,
        policy: Policy,
        priority: Priority,
        content: Content,
    ) -> Result<OwnedRange, Error> {
        let span = Span::new(start, len)?;
        if span.is_empty() {
            return Err(Error::NotRegion);
        }
        // One atomic load once installed.
        let new = registry::alloc_slot()?;
        let (idx, slot) = (new.idx(), new.slot());
        slot.init(policy, priority, span.start, span.len());
        match content {
            Content::Dirty => {
                slot.touch(clock::now_ns());
                slot.state().mark();
                stats::volatile_add(idx, span.len());
            }
            Content::Zero => slot.state().reset_to(state::PURGED),
        }
        new.publish();
        if policy != Policy::Lazy {
            reclaim::ensure_running();
            if content == Content::Dirty {
                reclaim::noticed_mark();
            }
        }
        Ok(OwnedRange(idx))
    }

    /// Tells the reclaimer the THP advice the caller gave this memory (`madvise`
    /// MADV_HUGEPAGE if `huge`, else MADV_NOHUGEPAGE, over all of it). On kernels whose
    /// MADV_DONTNEED keeps page tables (before PT_RECLAIM), a purge then replaces the range's
    /// whole 2 MiB blocks with a fresh mapping of the same advice, which frees their page
    /// tables; without it, a purge keeps them (about 2 KiB per MiB ever touched). Say it only
    /// for memory mapped private and anonymous with no other `madvise` or `mlock` setting that
    /// must survive a purge, and not registered with userfaultfd. Kept by ranges split off or
    /// grown from this one.
    pub fn set_thp_advice(&mut self, huge: bool) {
        registry::slot(self.0).set_thp_advice(huge);
    }

    /// The registry index, for a client that stores ranges in packed tables.
    pub fn into_raw(self) -> u32 {
        let idx = self.0;
        std::mem::forget(self);
        idx
    }

    /// Rebuilds a range from [`OwnedRange::into_raw`].
    ///
    /// # Safety
    /// `idx` must come from `into_raw` and be rebuilt once.
    pub unsafe fn from_raw(idx: u32) -> OwnedRange {
        OwnedRange(idx)
    }

    fn slot(&self) -> &'static Slot {
        registry::slot(self.0)
    }

    /// Start and length.
    pub fn extent(&self) -> (usize, usize) {
        self.slot().extent()
    }

    /// Changes how the reclaimer treats the range from its next pass (a client makes a range
    /// hybrid only where arming cannot split a huge page, for example).
    pub fn set_policy(&mut self, policy: Policy) {
        self.slot().set_policy(policy);
    }

    /// Sets the reclaim class.
    pub fn set_priority(&mut self, priority: Priority) {
        self.slot().set_priority(priority);
    }

    /// Takes the whole range back (the client uses its bytes again) and unregisters it.
    pub fn take(self) -> Taken {
        let slot = self.slot();
        let (start, len) = slot.extent();
        let found = slot.state().unmark();
        let taken = self.settle(found, start, len, start);
        self.retire_slot();
        taken
    }

    /// Takes the last `len` bytes back (a page multiple, less than the whole); the rest stays
    /// volatile, purged or armed as it was.
    ///
    /// # Panics
    /// If `len` is not a page multiple strictly inside the range (a caller bug).
    pub fn take_tail(&mut self, len: usize) -> Taken {
        let slot = self.slot();
        let word = slot.state().claim();
        let (start, total) = slot.extent();
        assert!(
            len > 0 && len < total && len % mem::page_size() == 0,
            "take_tail inside the range"
        );
        let keep = total - len;
        let found = match state::tag(word) {
            state::PURGED => Found::Purged,
            state::ARMED => Found::Armed,
            state::VOLATILE => Found::Intact,
            _ => Found::Pinned,
        };
        let taken = self.settle(found, start, total, start + keep);
        slot.len.store(keep, Release);
        slot.state().release(word);
        taken
    }

    /// Reports on `[from, start + len)` of a range unmarked (or claimed) in state `found`, and
    /// updates the counters. An armed range's pages from `from` are proved; the armed prefix
    /// shrinks to end at `from`.
    fn settle(&self, found: Found, start: usize, len: usize, from: usize) -> Taken {
        let slot = self.slot();
        let n = start + len - from;
        let pages = n / mem::page_size();
        match found {
            Found::Purged => Taken {
                pages,
                purged: pages,
                zero: true,
            },
            Found::Intact | Found::Pinned => {
                if found == Found::Intact {
                    stats::volatile_sub(self.0, n);
                }
                Taken {
                    pages,
                    ..Taken::default()
                }
            }
            Found::Armed => {
                stats::volatile_sub(self.0, n);
                let armed_end = start + slot.armed.load(Relaxed);
                let proof = match Span::new(from, armed_end.saturating_sub(from)) {
                    // SAFETY: the armed pages lie in the client's private anonymous memory,
                    // mapped while it owns the range; the range is BUSY, so no arming runs.
                    Ok(s) if !s.is_empty() => unsafe { lazy::unmark_span(s) },
                    _ => crate::Unmarked::default(),
                };
                slot.armed.store(armed_end.min(from) - start, Relaxed);
                if from == start {
                    slot.state().finish_unmark();
                }
                Taken {
                    pages,
                    purged: proof.purged,
                    zero: armed_end >= start + len && proof.purged == pages,
                }
            }
        }
    }

    /// Grows the range over adjacent bytes the client has just given up (written before, so
    /// resident). The whole range is volatile afterwards, aged from now.
    ///
    /// # Safety
    /// As for [`OwnedRange::new`], for the added bytes; `[start, start + len)` must contain the
    /// range's extent and add only bytes adjacent to it.
    pub unsafe fn grow(&mut self, start: usize, len: usize) {
        let slot = self.slot();
        let word = slot.state().claim();
        let (old_start, old_len) = slot.extent();
        debug_assert!(start <= old_start && old_start + old_len <= start + len);
        self.forget_armed();
        let counted = if state::is_purgeable(word) {
            old_len
        } else {
            0
        };
        stats::volatile_add(self.0, len - counted);
        slot.start.store(start, Relaxed);
        slot.len.store(len, Relaxed);
        slot.touch(clock::now_ns());
        slot.state().release_volatile();
        if slot.policy() != Policy::Lazy {
            reclaim::noticed_mark();
        }
    }

    /// Grows the range over `other` (adjacent to it, before or after), which is unregistered.
    /// Bytes of `other` that were purged stay unbacked but count as volatile until the merged
    /// range is purged or taken.
    pub fn absorb(&mut self, other: OwnedRange) {
        let (os, ol) = other.extent();
        other.retire();
        let (s, l) = self.extent();
        let start = s.min(os);
        // SAFETY: the added bytes were other's, which the client had given up already.
        unsafe { self.grow(start, l + ol) };
    }

    /// Unregisters the range without taking its content back (the client merges it elsewhere
    /// or unmaps it). Returns its extent. Dropping a range does the same.
    pub fn retire(self) -> (usize, usize) {
        let extent = self.unregister();
        std::mem::forget(self);
        extent
    }

    fn unregister(&self) -> (usize, usize) {
        let slot = self.slot();
        let word = slot.state().claim();
        self.forget_armed();
        let extent = slot.extent();
        if state::is_purgeable(word) {
            stats::volatile_sub(self.0, extent.1);
        }
        registry::free_slot(self.0);
        extent
    }

    /// Drops the shadow state of armed pages (they stay lazily freed in the kernel: the client
    /// treats their content as garbage anyway). The range must be claimed.
    fn forget_armed(&self) {
        let slot = self.slot();
        let armed = slot.armed.swap(0, Relaxed);
        if armed > 0 {
            let start = slot.start.load(Relaxed);
            shadow::forget(start, start + armed);
        }
    }

    fn retire_slot(self) {
        let idx = self.into_raw();
        registry::free_slot(idx);
    }
}

impl Drop for OwnedRange {
    fn drop(&mut self) {
        self.unregister();
    }
}
