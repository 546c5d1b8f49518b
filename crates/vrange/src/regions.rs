//! The one table of library-owned regions: which kind of region holds an address, by one
//! lookup, for the classic call, `region_containing` and freeing by address.
//!
//! | kind | found by | per-kind state |
//! |---|---|---|
//! | managed, lazy, hybrid, shared (`VolatileRegion`, `vrange_alloc`) | the page → range owner map (`registry`): each range's slot knows its region's extent | the range slots |
//! | scratch (`ScratchRegion`) | the extent table below | none |
//! | refill (`RefillRegion`) | the extent table below | `refill`'s entry (fill function, block) |
//!
//! The owner map has an entry per page, which suits regions made of ranges that split and
//! merge; scratch regions may reserve a TiB, so they (and refill regions, never split) are
//! extents in a table of atomics instead: lock-free, nothing allocated, async-signal-safe, one
//! relaxed load when empty.

use crate::registry::{self, Slot};
use crate::span::Span;
use crate::Error;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU8, AtomicUsize};

/// Regions the extent table holds at most (scratch and refill together).
const EXTENTS: usize = 256;

/// Kinds of region in the extent table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Extent {
    Scratch = 1,
    Refill = 2,
}

/// What holds a span.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owner {
    /// A region of ranges; the slot of the range holding the span's first page.
    Ranges(&'static Slot),
    /// A scratch or refill region.
    Extent(Extent),
}

struct Entry {
    /// Start of the region; 0 when the entry is free. Claimed by a compare-exchange.
    start: AtomicUsize,
    /// Its length; 0 until the region is fully recorded (readers skip it until then).
    len: AtomicUsize,
    kind: AtomicU8,
}

#[allow(clippy::declare_interior_mutable_const)] // only to initialise the table below
const EMPTY: Entry = Entry {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    kind: AtomicU8::new(0),
};
static TABLE: [Entry; EXTENTS] = [EMPTY; EXTENTS];
/// Live entries: lets a lookup skip the table with one load when there are none.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// One past the highest entry ever claimed: lookups read no further.
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// Records a new region of `kind`. `Error::Os(ENOMEM)` when the table is full.
pub(crate) fn record(kind: Extent, start: usize, len: usize) -> Result<(), Error> {
    for (i, e) in TABLE.iter().enumerate() {
        if e.start.compare_exchange(0, start, AcqRel, Relaxed).is_ok() {
            e.kind.store(kind as u8, Relaxed);
            HIGH.fetch_max(i + 1, AcqRel);
            e.len.store(len, Release);
            LIVE.fetch_add(1, Relaxed);
            return Ok(());
        }
    }
    Err(Error::Os(libc::ENOMEM))
}

/// Removes the region of `kind` that is exactly `[start, start + len)`; whether there was one
/// (a second caller for the same region finds none).
pub(crate) fn unrecord(kind: Extent, start: usize, len: usize) -> bool {
    for e in &TABLE[..HIGH.load(Acquire)] {
        if e.start.load(Acquire) == start
            && e.kind.load(Relaxed) == kind as u8
            && e.len.load(Acquire) == len
        {
            if e.len.compare_exchange(len, 0, AcqRel, Relaxed).is_err() {
                return false; // freed by another thread meanwhile: the caller's race
            }
            e.start.store(0, Release);
            LIVE.fetch_sub(1, Relaxed);
            return true;
        }
    }
    false
}

/// The live regions of the extent table: (kind, start, len).
fn extents() -> impl Iterator<Item = (Extent, usize, usize)> {
    let high = if LIVE.load(Relaxed) == 0 {
        0
    } else {
        HIGH.load(Acquire)
    };
    TABLE[..high].iter().filter_map(|e| {
        let start = e.start.load(Acquire);
        let len = e.len.load(Acquire);
        let kind = match e.kind.load(Relaxed) {
            1 => Extent::Scratch,
            2 => Extent::Refill,
            _ => return None,
        };
        (start != 0 && len != 0).then_some((kind, start, len))
    })
}

/// Whether `[start, start + len)` is exactly a live region of `kind`.
pub(crate) fn is_exactly(kind: Extent, start: usize, len: usize) -> bool {
    extents().any(|(k, s, l)| k == kind && s == start && l == len)
}

/// Regions of `kind` and their bytes, for `stats()`.
pub(crate) fn totals(kind: Extent) -> (u64, u64) {
    extents()
        .filter(|(k, _, _)| *k == kind)
        .fold((0, 0), |(n, bytes), (_, _, len)| {
            (n + 1, bytes + len as u64)
        })
}

/// The region containing `span`, as the slot of its first range. Checks that the span stays
/// inside one region.
pub(crate) fn ranges_of(span: Span) -> Result<Option<(u32, &'static Slot)>, Error> {
    let Some((idx, slot)) = registry::owner_of(span.start) else {
        if registry::any_owned(span.start, span.end) {
            return Err(Error::Straddles);
        }
        return Ok(None);
    };
    let rs = slot.region_start.load(Relaxed);
    if span.end > rs + slot.region_len.load(Relaxed) {
        return Err(Error::Straddles);
    }
    if !slot.header.load(Relaxed).is_null() && span.len() != slot.len.load(Relaxed) {
        return Err(Error::Partial);
    }
    Ok(Some((idx, slot)))
}

/// What holds `span`: `None` for memory no region of the library holds. Async-signal-safe.
///
/// # Errors
/// [`Error::Straddles`] for a span crossing a region's boundary; [`Error::Partial`] for part
/// of a shared region.
pub(crate) fn find(span: Span) -> Result<Option<Owner>, Error> {
    if let Some((_, slot)) = ranges_of(span)? {
        return Ok(Some(Owner::Ranges(slot)));
    }
    for (kind, start, len) in extents() {
        let end = start + len;
        if span.start < end && start < span.end {
            if span.start < start || span.end > end {
                return Err(Error::Straddles);
            }
            return Ok(Some(Owner::Extent(kind)));
        }
    }
    Ok(None)
}

/// The start and length of the library-owned region holding `addr`, of any kind.
/// Async-signal-safe.
pub(crate) fn containing(addr: usize) -> Option<(usize, usize)> {
    let page = vrange_sys::mem::page_size();
    if let Some((_, slot)) = registry::owner_of(addr & !(page - 1)) {
        return Some(slot.region());
    }
    extents()
        .find(|(_, start, len)| (*start..start + len).contains(&addr))
        .map(|(_, start, len)| (start, len))
}
