//! The one table of library-owned regions: which region holds an address, of which kind, and
//! what that kind keeps about it, by one lookup, for every call that takes an address (the
//! classic call, `region_containing`, freeing by address, priorities) and for the fault paths.
//!
//! | kind | found by | what the kind keeps, reached from the lookup |
//! |---|---|---|
//! | managed, lazy, hybrid, shared (`VolatileRegion`, `vrange_alloc`) | the page → range owner map (`registry`) | the range's slot: state, policy, class, the region's extent; shared regions' header and descriptor |
//! | scratch (`ScratchRegion`) | the extent table | nothing |
//! | refill (`RefillRegion`), filled by the refill thread | the extent table | the entry's state: `refill::Filler` (fill function, buffer, blocks filled) |
//! | refill, filled on the faulting thread | the extent table | the entry's state: `refill_here::Here` (fill function, fill buffers) |
//!
//! The owner map has an entry per page, which suits regions made of ranges that split and
//! merge; scratch regions may reserve a TiB, so they and refill regions (never split) are
//! extents in a fixed table of atomics instead (`crate::extents`: its protocol, model-checked):
//! lock-free and async-signal-safe to read, one relaxed load when empty. Recording and
//! removing take this module's lock (held across fork; a fork child forgets the readers its
//! parent's threads had inside a region).

use crate::extents::{Entered, Entry, Kind, Table};
use crate::registry::{self, Slot};
use crate::span::Span;
use crate::sync::atomic::Ordering::Relaxed;
use crate::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize};
use crate::Error;
use vrange_sys::lock::{Lock, Rank};

/// Regions the extent table holds at most (scratch and refill together).
const EXTENTS: usize = 256;

/// How many scratch regions a process may hold at once: they are meant to be few, large and
/// long-lived (reserve a TiB once rather than many small ones).
pub const MAX_SCRATCH_REGIONS: usize = 64;
/// How many refill regions filled on the faulting thread may live at once (each has fill
/// buffers of its own; a SIGBUS handler walks the table).
pub const MAX_FILLED_HERE_REGIONS: usize = 64;

/// How many regions of `kind` may live at once (refill regions filled by the refill thread: as
/// many as the table has room for).
fn most(kind: Kind) -> usize {
    match kind {
        Kind::Scratch => MAX_SCRATCH_REGIONS,
        Kind::RefillHere => MAX_FILLED_HERE_REGIONS,
        Kind::Refill => EXTENTS,
    }
}

#[allow(clippy::declare_interior_mutable_const)] // only to initialise the table below
const FREE: Entry = Entry {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    kind: AtomicU8::new(0),
    state: AtomicPtr::new(std::ptr::null_mut()),
    users: AtomicUsize::new(0),
};
static ENTRIES: [Entry; EXTENTS] = [FREE; EXTENTS];
static LIVE: AtomicUsize = AtomicUsize::new(0);
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Serialises recording and removing (never held while waiting for readers).
static LOCK: Lock = Lock::with_child_hook(Rank::Regions, Some(after_fork_child));

fn table() -> Table<'static> {
    Table {
        entries: &ENTRIES,
        live: &LIVE,
        high: &HIGH,
    }
}

/// What holds a span.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owner {
    /// A region of ranges; the slot of the range holding the span's first page.
    Ranges(u32, &'static Slot),
    /// A scratch or refill region: its entry and kind.
    Extent(&'static Entry, Kind),
}

/// Records a new region of `kind` keeping `state` (see [`Entry::state`]).
/// `Error::Os(ENOMEM)` when the table is full or the process holds the most regions of `kind`
/// it may (`state` stays the caller's).
pub(crate) fn record(kind: Kind, start: usize, len: usize, state: *mut ()) -> Result<(), Error> {
    let _held = LOCK.lock();
    if totals(kind).0 >= most(kind) as u64 {
        return Err(Error::Os(libc::ENOMEM));
    }
    table()
        .record(kind, start, len, state)
        .map(drop)
        .ok_or(Error::Os(libc::ENOMEM))
}

/// Removes the region of `kind` that is exactly `[start, start + len)`, once no thread is
/// inside it (a fill running there is waited for, with no lock held). Returns what its kind
/// kept; `None` if there was no such region (a second caller for the same region finds none).
pub(crate) fn remove(kind: Kind, start: usize, len: usize) -> Option<*mut ()> {
    let t = table();
    let entry = {
        let _held = LOCK.lock();
        let e = t.exactly(kind, start, len)?;
        t.unpublish(e, len).then_some(e)?
    };
    t.drain(entry);
    let _held = LOCK.lock();
    Some(t.free(entry))
}

/// The live region of `kind` that is exactly `[start, start + len)`.
pub(crate) fn exactly(kind: Kind, start: usize, len: usize) -> Option<&'static Entry> {
    table().exactly(kind, start, len)
}

/// Enters the extent-table region holding `addr` (see `crate::extents::Table::enter`): it
/// stays recorded, and what its kind keeps stays alive, until the guard drops.
/// Async-signal-safe.
pub(crate) fn enter(addr: usize) -> Option<Entered<'static>> {
    table().enter(addr)
}

/// Calls `f(start, len)` for every live region of `kind`.
pub(crate) fn each(kind: Kind, mut f: impl FnMut(usize, usize)) {
    for (e, start, len) in table().published() {
        if e.kind() == Some(kind) {
            f(start, len);
        }
    }
}

/// Regions of `kind` and their bytes, for `stats()`.
pub(crate) fn totals(kind: Kind) -> (u64, u64) {
    let mut totals = (0, 0);
    each(kind, |_, len| {
        totals = (totals.0 + 1, totals.1 + len as u64)
    });
    totals
}

/// The region of ranges containing `span`, as the slot of its first range. Checks that the
/// span stays inside one region.
pub(crate) fn ranges_of(span: Span) -> Result<Option<(u32, &'static Slot)>, Error> {
    let Some((idx, slot)) = registry::owner_of(span.start) else {
        if registry::any_owned(span.start, span.end) {
            return Err(Error::Straddles);
        }
        return Ok(None);
    };
    let (rs, rl) = slot.region();
    if span.end > rs + rl {
        return Err(Error::Straddles);
    }
    Ok(Some((idx, slot)))
}

/// What holds `span`: `None` for memory no region of the library holds. Async-signal-safe.
///
/// # Errors
/// [`Error::Straddles`] for a span crossing a region's boundary.
pub(crate) fn find(span: Span) -> Result<Option<Owner>, Error> {
    if let Some((idx, slot)) = ranges_of(span)? {
        return Ok(Some(Owner::Ranges(idx, slot)));
    }
    for (entry, start, len) in table().published() {
        let end = start + len;
        if span.start < end && start < span.end {
            if span.start < start || span.end > end {
                return Err(Error::Straddles);
            }
            return Ok(entry.kind().map(|k| Owner::Extent(entry, k)));
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
    table()
        .published()
        .find(|(_, start, len)| (*start..start + len).contains(&addr))
        .map(|(_, start, len)| (start, len))
}

/// In a fork child (under the lock): the readers inside regions were the parent's threads.
fn after_fork_child() {
    for e in &ENTRIES {
        e.users.store(0, Relaxed);
    }
}
