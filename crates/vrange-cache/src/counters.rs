//! The cache's statistics, and nothing of its slabs: the slabs count here, through what the
//! cache shares with them (`slab::Shared`, which also holds the idle list and the raw values).
//! Gauges and rare events are plain atomics. The counters of the hot path (hits, misses) have a
//! cache line per thread for the first 64 threads, which count with a plain load and store (no
//! locked instruction: a hit makes as few as it can), and one shared line, counted with
//! `fetch_add`, for later threads.

use crossbeam_utils::CachePadded;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use vrange::Priority;

/// Reclaim classes, in purge order.
pub(crate) const CLASSES: usize = 4;
/// Threads with a line of their own; one more line is shared by the rest.
const OWN_LINES: usize = 64;

pub(crate) const PRIORITIES: [Priority; CLASSES] = [
    Priority::DropFirst,
    Priority::Low,
    Priority::Normal,
    Priority::DropLast,
];

pub(crate) fn class(p: Priority) -> usize {
    p as usize
}

#[derive(Debug, Default)]
struct Hot {
    hits: [AtomicU64; CLASSES],
    misses: AtomicU64,
}

#[derive(Debug, Default)]
struct Class {
    /// Bytes of the live slabs' pages values were written to (`Slab::touched`).
    resident: AtomicU64,
    /// Bytes of the live slabs' regions (address space).
    mapped: AtomicU64,
    slabs: AtomicU64,
    inserts: AtomicU64,
    purged_lookups: AtomicU64,
    promoted: AtomicU64,
    recycled: AtomicU64,
    carried: AtomicU64,
    carried_bytes: AtomicU64,
    purged_entries: AtomicU64,
    purged_bytes: AtomicU64,
}

/// A cache's counters, kept with what it shares with its slabs (`slab::Shared`), which may
/// outlive it in a reader's hands.
#[derive(Debug)]
pub(crate) struct Counters {
    hot: Box<[CachePadded<Hot>]>,
    classes: [Class; CLASSES],
    tombstones: AtomicU64,
    dropped_tombstones: AtomicU64,
    /// Slabs that died so far: the sequence number of the latest death.
    deaths: AtomicU64,
}

/// This thread's line: its own (below `OWN_LINES`) or the shared one. Threads are numbered
/// once, in the order they first count, and numbers are never reused, so no two live threads
/// own one line.
fn line() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static LINE: Cell<usize> = const { Cell::new(usize::MAX) });
    LINE.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Relaxed).min(OWN_LINES));
        }
        s.get()
    })
}

fn count(a: &AtomicU64, line: usize) {
    if line < OWN_LINES {
        // Only this thread writes its line; readers may see a count a hit late.
        a.store(a.load(Relaxed) + 1, Relaxed);
    } else {
        a.fetch_add(1, Relaxed);
    }
}

fn dec(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n)));
}

impl Counters {
    pub fn new() -> Counters {
        Counters {
            hot: (0..=OWN_LINES).map(|_| CachePadded::default()).collect(),
            classes: Default::default(),
            tombstones: AtomicU64::new(0),
            dropped_tombstones: AtomicU64::new(0),
            deaths: AtomicU64::new(0),
        }
    }

    pub fn hit(&self, p: Priority) {
        let line = line();
        count(&self.hot[line].hits[class(p)], line);
    }

    pub fn miss(&self) {
        let line = line();
        count(&self.hot[line].misses, line);
    }

    pub fn inserted(&self, p: Priority) {
        self.classes[class(p)].inserts.fetch_add(1, Relaxed);
    }

    pub fn promoted(&self, p: Priority) {
        self.classes[class(p)].promoted.fetch_add(1, Relaxed);
    }

    /// A slab of class `p` gave its pages to a new slab (`crate::recycle`).
    pub fn recycled(&self, p: Priority) {
        self.classes[class(p)].recycled.fetch_add(1, Relaxed);
    }

    /// A value of `bytes` was carried out of an evicted slab of class `p` (`crate::merge`):
    /// it was counted purged when its slab died, and is not.
    pub fn carried(&self, p: Priority, bytes: usize) {
        let c = &self.classes[class(p)];
        c.carried.fetch_add(1, Relaxed);
        c.carried_bytes.fetch_add(bytes as u64, Relaxed);
        dec(&c.purged_entries, 1);
        dec(&c.purged_bytes, bytes as u64);
    }

    pub fn purged_lookup(&self, p: Priority) {
        self.classes[class(p)].purged_lookups.fetch_add(1, Relaxed);
    }

    pub fn slab_created(&self, p: Priority, len: usize) {
        let c = &self.classes[class(p)];
        c.mapped.fetch_add(len as u64, Relaxed);
        c.slabs.fetch_add(1, Relaxed);
    }

    /// `n` more bytes of a live slab's pages were written to.
    pub fn touched(&self, p: Priority, n: usize) {
        self.classes[class(p)].resident.fetch_add(n as u64, Relaxed);
    }

    /// A live slab was freed (its last entry and holder gone).
    pub fn slab_freed(&self, p: Priority, len: usize, touched: usize) {
        let c = &self.classes[class(p)];
        dec(&c.mapped, len as u64);
        dec(&c.resident, touched as u64);
        dec(&c.slabs, 1);
    }

    /// A slab's content was found purged: its entries stay in the map as tombstones until
    /// looked up, removed or swept.
    /// A slab of class `p` died with `entries` live entries of `bytes`; returns its death's
    /// sequence number (from 1).
    pub fn slab_died(
        &self,
        p: Priority,
        len: usize,
        touched: usize,
        entries: usize,
        bytes: usize,
    ) -> u64 {
        let c = &self.classes[class(p)];
        dec(&c.mapped, len as u64);
        dec(&c.resident, touched as u64);
        dec(&c.slabs, 1);
        c.purged_entries.fetch_add(entries as u64, Relaxed);
        c.purged_bytes.fetch_add(bytes as u64, Relaxed);
        self.tombstones.fetch_add(entries as u64, Relaxed);
        self.deaths.fetch_add(1, Relaxed) + 1
    }

    /// The sequence number of the latest slab death (0: none yet).
    pub fn deaths(&self) -> u64 {
        self.deaths.load(Relaxed)
    }

    pub fn tombstone_gone(&self) {
        dec(&self.tombstones, 1);
    }

    pub fn tombstones(&self) -> u64 {
        self.tombstones.load(Relaxed)
    }

    pub fn tombstones_dropped(&self, n: u64) {
        self.dropped_tombstones.fetch_add(n, Relaxed);
    }

    pub fn resident(&self) -> u64 {
        self.classes.iter().map(|c| c.resident.load(Relaxed)).sum()
    }

    /// Per-class figures (without the gauges the cache computes from its slabs).
    pub fn class_stats(&self, i: usize) -> ClassStats {
        let c = &self.classes[i];
        ClassStats {
            priority: PRIORITIES[i],
            hits: self.hot.iter().map(|h| h.hits[i].load(Relaxed)).sum(),
            inserts: c.inserts.load(Relaxed),
            purged_lookups: c.purged_lookups.load(Relaxed),
            promoted: c.promoted.load(Relaxed),
            recycled: c.recycled.load(Relaxed),
            carried: c.carried.load(Relaxed),
            carried_bytes: c.carried_bytes.load(Relaxed),
            purged_entries: c.purged_entries.load(Relaxed),
            purged_bytes: c.purged_bytes.load(Relaxed),
            resident_bytes: c.resident.load(Relaxed),
            mapped_bytes: c.mapped.load(Relaxed),
            slabs: c.slabs.load(Relaxed),
            ..ClassStats::default()
        }
    }

    pub fn misses(&self) -> u64 {
        self.hot.iter().map(|h| h.misses.load(Relaxed)).sum()
    }

    pub fn dropped_tombstones(&self) -> u64 {
        self.dropped_tombstones.load(Relaxed)
    }
}

/// The figures of one reclaim class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// The class.
    pub priority: Priority,
    /// Lookups that returned a value of this class.
    pub hits: u64,
    /// Values inserted.
    pub inserts: u64,
    /// Lookups that found the value purged (each such entry is then dropped).
    pub purged_lookups: u64,
    /// Values moved off probation by their first hit (see the crate's "Probation").
    pub promoted: u64,
    /// Slabs whose pages a new slab took over while memory was short (see the crate's
    /// "Recycling"); their entries count in `purged_entries`.
    pub recycled: u64,
    /// Values read since they were written that the cache's own evictions (its budget,
    /// recycling) carried into a new slab instead of dropping (see the crate's "Eviction").
    pub carried: u64,
    /// Their value bytes.
    pub carried_bytes: u64,
    /// Entries whose memory the system purged (found by a lookup or by the cache's sweep).
    pub purged_entries: u64,
    /// Their value bytes.
    pub purged_bytes: u64,
    /// The most of this class's memory that can be resident: bytes of the pages values were
    /// written to (rounded up to pages, overhead included) in slabs not known to be purged.
    /// An upper bound, not a measurement: the kernel may have taken a lazily freed slab the
    /// cache has not looked at since (it counts until a lookup or a sweep finds it purged),
    /// and a page can have been swapped out. Pages of a slab never written take no memory
    /// and do not count.
    pub resident_bytes: u64,
    /// Address space of the slabs not known to be purged (whole slabs, written or not): what
    /// `resident_bytes` meant before it counted only written pages. Not memory use.
    pub mapped_bytes: u64,
    /// Bytes no purge can take now: the written pages of every slab an [`crate::Entry`] (or
    /// an insert in progress) pins, which is the whole slab, and the pages under each value
    /// kept as a [`crate::Held`] (or raw, or a Python view), which is only the value's own
    /// pages. Held pages of a slab purged around them count here until released.
    pub pinned_bytes: u64,
    /// Value bytes of live entries in those slabs.
    pub value_bytes: u64,
    /// Slabs (regions) of this class.
    pub slabs: u64,
}

/// A cache's statistics (`Cache::stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Entries held (purged ones not yet looked up excluded).
    pub entries: u64,
    /// Lookups of keys that were never inserted, were removed, or whose purge was already
    /// reported (or swept).
    pub misses: u64,
    /// Per class, lowest first (`DropFirst`, `Low`, `Normal`, `DropLast`).
    pub classes: [ClassStats; CLASSES],
    /// Purged entries dropped unseen because too many accumulated (lookups of them now miss).
    pub dropped_purged: u64,
}

impl Stats {
    /// Lookups that returned a value.
    pub fn hits(&self) -> u64 {
        self.classes.iter().map(|c| c.hits).sum()
    }

    /// Lookups that found the value purged.
    pub fn purged_lookups(&self) -> u64 {
        self.classes.iter().map(|c| c.purged_lookups).sum()
    }

    /// The most the cache can hold in memory: written pages of slabs not known to be purged
    /// (see [`ClassStats::resident_bytes`]).
    pub fn resident_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.resident_bytes).sum()
    }

    /// Address space of the slabs not known to be purged (see [`ClassStats::mapped_bytes`]).
    pub fn mapped_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.mapped_bytes).sum()
    }

    /// Resident bytes of slabs pinned by held values now (see [`ClassStats::pinned_bytes`]).
    pub fn pinned_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.pinned_bytes).sum()
    }

    /// Value bytes of the live entries.
    pub fn value_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.value_bytes).sum()
    }

    /// Value bytes the system purged.
    pub fn purged_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.purged_bytes).sum()
    }

    /// Resident bytes not holding a live value: page rounding (of the written part of each
    /// slab) and space of removed or replaced values in slabs still in use. The open slabs'
    /// unwritten tails are mapped but not resident, so they do not count.
    pub fn overhead_bytes(&self) -> u64 {
        self.resident_bytes().saturating_sub(self.value_bytes())
    }
}
