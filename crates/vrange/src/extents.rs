//! The extent table's lock-free protocol: regions recorded as (kind, start, length) with what
//! their kind keeps, found by address without a lock (from a SIGBUS handler too), and removed
//! only once no thread is inside them.
//!
//! Writers (record, unpublish, free) are serialised by the caller (`crate::regions` holds a
//! lock); readers never lock:
//!
//! | step | writer | a reader that races it |
//! |---|---|---|
//! | record | claims a free entry (`start` 0 → start), writes `kind` and `state`, then `len` (Release) | skips the entry until `len` is set; then sees `kind` and `state` |
//! | enter | — | `users` + 1, then reads `len` again by a read-modify-write (and `start`): still published, or it leaves |
//! | unpublish | `len` → 0 (a compare-exchange), then waits until `users` is 0 | either reads `len` 0 and leaves, or its read came first in `len`'s order and its count is seen |
//!
//! The reader's second read of `len` is an atomic add of 0, not a load: a read-modify-write reads
//! the latest value in the location's modification order, and the unpublishing exchange that
//! comes after it in that order reads what it wrote and so synchronizes with it: the reader's
//! count, made before, is seen by the writer's wait. Plain loads would need a single total
//! order over both locations (sequential consistency), which the model checker does not model
//! and the proof would rest on.
//! | free | takes `state`, clears `start` (Release): the entry is free | — |
//!
//! This file depends only on `crate::sync`, so that the loom model (`tests/loom_regions.rs`)
//! compiles it against loom's atomics.

use crate::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use crate::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize};
use crate::sync::backoff;

/// The kinds of region kept in the extent table (regions of ranges are found through the page
/// owner map instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A scratch region (MAP_DROPPABLE): keeps nothing.
    Scratch = 1,
    /// A refill region filled by the refill thread.
    Refill = 2,
    /// A refill region filled on the faulting thread.
    RefillHere = 3,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Scratch, Kind::Refill, Kind::RefillHere];

    /// The kind stored as `bits` (0: none).
    fn from_bits(bits: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u8 == bits)
    }
}

/// One region of the table.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Start of the region; 0 when the entry is free. Claimed by a compare-exchange.
    pub(crate) start: AtomicUsize,
    /// Its length; 0 until the region is fully recorded and again once it is unpublished.
    pub(crate) len: AtomicUsize,
    /// Its [`Kind`].
    pub(crate) kind: AtomicU8,
    /// What its kind keeps: `Box::into_raw` of the kind's own type, or null. Owned by the
    /// entry from record to free.
    pub(crate) state: AtomicPtr<()>,
    /// Readers inside the region ([`Table::enter`]).
    pub(crate) users: AtomicUsize,
}

impl Entry {
    /// A free entry (the crate's table is a static of constants; the tests and the loom model
    /// build theirs).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn new() -> Entry {
        Entry {
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            kind: AtomicU8::new(0),
            state: AtomicPtr::new(std::ptr::null_mut()),
            users: AtomicUsize::new(0),
        }
    }

    /// Its kind, while it is recorded.
    pub(crate) fn kind(&self) -> Option<Kind> {
        Kind::from_bits(self.kind.load(Relaxed))
    }

    /// Its start and length if it is published now.
    pub(crate) fn extent(&self) -> Option<(usize, usize)> {
        let len = self.len.load(Acquire);
        let start = self.start.load(Acquire);
        (start != 0 && len != 0).then_some((start, len))
    }

    /// What its kind keeps (see [`Entry::state`]).
    pub(crate) fn state(&self) -> *mut () {
        self.state.load(Acquire)
    }
}

/// A table of entries and its two counters.
#[derive(Clone, Copy)]
pub(crate) struct Table<'a> {
    pub(crate) entries: &'a [Entry],
    /// Live entries: lets a lookup skip the table with one load when there are none.
    pub(crate) live: &'a AtomicUsize,
    /// One past the highest entry ever claimed: lookups read no further.
    pub(crate) high: &'a AtomicUsize,
}

/// A reader inside a published region: the region is not unpublished past this guard.
pub(crate) struct Entered<'a> {
    pub(crate) entry: &'a Entry,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        // Release: what the reader did inside happens before the writer's wait sees it gone.
        self.entry.users.fetch_sub(1, Release);
    }
}

impl<'a> Table<'a> {
    /// Records a region of `kind` at `start..start + len` keeping `state`. `None` when the table
    /// is full. Writers only (see the module documentation).
    pub(crate) fn record(
        &self,
        kind: Kind,
        start: usize,
        len: usize,
        state: *mut (),
    ) -> Option<&'a Entry> {
        for (i, e) in self.entries.iter().enumerate() {
            if e.start.compare_exchange(0, start, AcqRel, Relaxed).is_ok() {
                e.kind.store(kind as u8, Relaxed);
                e.state.store(state, Relaxed);
                self.high.fetch_max(i + 1, AcqRel);
                e.len.store(len, Release);
                self.live.fetch_add(1, Relaxed);
                return Some(e);
            }
        }
        None
    }

    /// The published entries: (entry, start, len).
    pub(crate) fn published(&self) -> impl Iterator<Item = (&'a Entry, usize, usize)> {
        let high = if self.live.load(Relaxed) == 0 {
            0
        } else {
            self.high.load(Acquire).min(self.entries.len())
        };
        self.entries[..high]
            .iter()
            .filter_map(|e| e.extent().map(|(s, l)| (e, s, l)))
    }

    /// The published entry of `kind` that is exactly `start..start + len`.
    pub(crate) fn exactly(&self, kind: Kind, start: usize, len: usize) -> Option<&'a Entry> {
        self.published()
            .find(|(e, s, l)| *s == start && *l == len && e.kind() == Some(kind))
            .map(|(e, _, _)| e)
    }

    /// Enters the published region holding `addr`: until the guard drops, it is not
    /// unpublished (a writer waits). Async-signal-safe: atomics only.
    pub(crate) fn enter(&self, addr: usize) -> Option<Entered<'a>> {
        let (entry, start, len) = self
            .published()
            .find(|(_, s, l)| addr >= *s && addr - *s < *l)?;
        entry.users.fetch_add(1, Relaxed);
        // A read-modify-write (see the module documentation): either it reads the cleared
        // length and this leaves, or the writer's exchange reads what it wrote and the writer
        // sees the count above.
        let still = entry.len.fetch_add(0, AcqRel);
        if still != len || entry.start.load(Acquire) != start {
            entry.users.fetch_sub(1, Release);
            return None;
        }
        Some(Entered { entry, start, len })
    }

    /// Unpublishes `entry` if it is still published with `len` (a second caller for the same
    /// region finds it gone): lookups skip it from now on. Writers only; the entry stays
    /// claimed until [`Table::free`], after [`Table::drain`].
    pub(crate) fn unpublish(&self, entry: &Entry, len: usize) -> bool {
        entry.len.compare_exchange(len, 0, AcqRel, Relaxed).is_ok()
    }

    /// Waits until no reader is inside `entry` (unpublished). Takes no lock: readers inside
    /// may be running a program's code.
    pub(crate) fn drain(&self, entry: &Entry) {
        let mut round = 0;
        while entry.users.load(Acquire) != 0 {
            backoff(&mut round);
        }
    }

    /// Frees `entry` (unpublished and drained): returns what its kind kept. Writers only.
    pub(crate) fn free(&self, entry: &Entry) -> *mut () {
        let state = entry.state.swap(std::ptr::null_mut(), Acquire);
        entry.kind.store(0, Relaxed);
        entry.start.store(0, Release);
        self.live.fetch_sub(1, Relaxed);
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_find_enter_and_remove() {
        let entries: &'static [Entry] = Box::leak((0..3).map(|_| Entry::new()).collect());
        let live: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let high: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let t = Table {
            entries,
            live,
            high,
        };
        let state = 0x1000 as *mut ();
        let a = t.record(Kind::Refill, 0x10000, 0x4000, state).unwrap();
        t.record(Kind::Scratch, 0x20000, 0x1000, std::ptr::null_mut())
            .unwrap();
        assert_eq!(a.kind(), Some(Kind::Refill));
        assert!(t.exactly(Kind::Refill, 0x10000, 0x4000).is_some());
        assert!(t.exactly(Kind::Scratch, 0x10000, 0x4000).is_none(), "kind");
        assert!(t.exactly(Kind::Refill, 0x10000, 0x3000).is_none(), "length");
        {
            let inside = t.enter(0x13fff).expect("inside the region");
            assert_eq!((inside.start, inside.len), (0x10000, 0x4000));
            assert_eq!(inside.entry.state(), state);
            assert!(t.enter(0x14000).is_none(), "past its end");
            assert_eq!(a.users.load(Relaxed), 1);
        }
        assert_eq!(a.users.load(Relaxed), 0, "left on drop");
        assert!(t.unpublish(a, 0x4000));
        assert!(!t.unpublish(a, 0x4000), "once");
        assert!(t.enter(0x10000).is_none(), "unpublished: not found");
        t.drain(a);
        assert_eq!(t.free(a), state, "the state goes back to the remover");
        assert_eq!(t.published().count(), 1);
        // The freed entry is claimed again.
        let b = t.record(Kind::RefillHere, 0x30000, 0x1000, state).unwrap();
        assert!(std::ptr::eq(a, b));
        t.record(Kind::Scratch, 0x40000, 0x1000, state).unwrap();
        assert!(
            t.record(Kind::Scratch, 0x50000, 0x1000, state).is_none(),
            "full"
        );
    }
}
