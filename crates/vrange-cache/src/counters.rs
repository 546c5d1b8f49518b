//! The cache's statistics. Gauges and rare events are plain atomics; the counters of the hot
//! path (hits, misses) are striped over cache lines so that threads on different CPUs do not
//! bounce one line on every lookup.

use crossbeam_utils::CachePadded;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use vrange::Priority;

/// Reclaim classes, in purge order.
pub(crate) const CLASSES: usize = 4;
const STRIPES: usize = 8;

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
    resident: AtomicU64,
    slabs: AtomicU64,
    inserts: AtomicU64,
    purged_lookups: AtomicU64,
    purged_entries: AtomicU64,
    purged_bytes: AtomicU64,
}

/// Counters shared by a cache and its slabs (which may outlive it in a reader's hands).
#[derive(Debug, Default)]
pub(crate) struct Shared {
    hot: [CachePadded<Hot>; STRIPES],
    classes: [Class; CLASSES],
    tombstones: AtomicU64,
    dropped_tombstones: AtomicU64,
}

fn stripe() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) });
    STRIPE.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Relaxed) % STRIPES);
        }
        s.get()
    })
}

fn dec(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n)));
}

impl Shared {
    pub fn hit(&self, p: Priority) {
        self.hot[stripe()].hits[class(p)].fetch_add(1, Relaxed);
    }

    pub fn miss(&self) {
        self.hot[stripe()].misses.fetch_add(1, Relaxed);
    }

    pub fn inserted(&self, p: Priority) {
        self.classes[class(p)].inserts.fetch_add(1, Relaxed);
    }

    pub fn purged_lookup(&self, p: Priority) {
        self.classes[class(p)].purged_lookups.fetch_add(1, Relaxed);
    }

    pub fn slab_created(&self, p: Priority, len: usize) {
        let c = &self.classes[class(p)];
        c.resident.fetch_add(len as u64, Relaxed);
        c.slabs.fetch_add(1, Relaxed);
    }

    /// A live slab was freed (its last entry and holder gone).
    pub fn slab_freed(&self, p: Priority, len: usize) {
        let c = &self.classes[class(p)];
        dec(&c.resident, len as u64);
        dec(&c.slabs, 1);
    }

    /// A slab's content was found purged: its entries stay in the map as tombstones until
    /// looked up, removed or swept.
    pub fn slab_died(&self, p: Priority, len: usize, entries: usize, bytes: usize) {
        let c = &self.classes[class(p)];
        dec(&c.resident, len as u64);
        dec(&c.slabs, 1);
        c.purged_entries.fetch_add(entries as u64, Relaxed);
        c.purged_bytes.fetch_add(bytes as u64, Relaxed);
        self.tombstones.fetch_add(entries as u64, Relaxed);
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
            purged_entries: c.purged_entries.load(Relaxed),
            purged_bytes: c.purged_bytes.load(Relaxed),
            resident_bytes: c.resident.load(Relaxed),
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
    /// Entries whose memory the system purged (found by a lookup or by the cache's sweep).
    pub purged_entries: u64,
    /// Their value bytes.
    pub purged_bytes: u64,
    /// Bytes of slabs holding values of this class that are not known to be purged (what the
    /// cache holds in memory, overhead included).
    pub resident_bytes: u64,
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

    /// Bytes the cache holds in memory (slabs not known to be purged).
    pub fn resident_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.resident_bytes).sum()
    }

    /// Value bytes of the live entries.
    pub fn value_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.value_bytes).sum()
    }

    /// Value bytes the system purged.
    pub fn purged_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.purged_bytes).sum()
    }

    /// Resident bytes not holding a live value: page rounding, the open slabs' free tails,
    /// and space of removed or replaced values in slabs still in use.
    pub fn overhead_bytes(&self) -> u64 {
        self.resident_bytes().saturating_sub(self.value_bytes())
    }
}
