//! Probation: scan resistance at slab grain, after S3-FIFO (Yang et al., SOSP 2023).
//!
//! A key inserted for the first time goes into a *probation* slab, whose region is purged as
//! one class below the value's own ([`below`]): in the global order, every value never read
//! since its insert goes before any read one of its class (an old read value is kept over a
//! young unread one). A value's first hit moves it (one copy) into an ordinary slab of its
//! class; that is S3-FIFO's move from its small queue to its main queue.
//!
//! A probation value purged unread leaves a tombstone; the lookup that finds it (a second
//! request for the key) remembers the key in the [`Ghosts`], and the key's next insert skips
//! probation: S3-FIFO's ghost queue. A scan's keys, requested once, thus never displace
//! the values being read.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::OnceLock;
use vrange::Priority;

/// The class a probation slab of class `p` is purged as: one below (`DropFirst` has none
/// below it, so there probation orders only by age).
pub(crate) fn below(p: Priority) -> Priority {
    match p {
        Priority::DropFirst | Priority::Low => Priority::DropFirst,
        Priority::Normal => Priority::Low,
        Priority::DropLast => Priority::Normal,
    }
}

/// Slots of the ghost filter: keys between the lookup that found them purged on probation
/// and their next insert (usually the regeneration that follows at once). 32 KiB, allocated
/// at the first such lookup.
const GHOSTS: usize = 4096;

/// Hashes of keys whose probation value was purged unread and then requested again. One
/// slot per hash (a later key in the same slot replaces an earlier one: a lost ghost only
/// sends its key through probation once more). Lock-free: the insert path reads one word.
#[derive(Debug, Default)]
pub(crate) struct Ghosts {
    slots: OnceLock<Box<[AtomicU64]>>,
}

impl Ghosts {
    fn slot(&self, hash: u64) -> Option<&AtomicU64> {
        // GHOSTS is a power of two: the mask keeps the index inside.
        self.slots.get().map(|s| &s[(hash as usize) & (GHOSTS - 1)])
    }

    /// The key hashed `hash` was requested again after its probation value was purged.
    pub fn remember(&self, hash: u64) {
        let slots = self
            .slots
            .get_or_init(|| (0..GHOSTS).map(|_| AtomicU64::new(0)).collect());
        // 0 marks an empty slot: a key hashing to 0 is remembered as 1 (and so is one
        // hashing to 1; a false admission costs only a skipped probation).
        slots[(hash as usize) & (GHOSTS - 1)].store(hash.max(1), Relaxed);
    }

    /// Whether any key was ever remembered (before the first, inserts need not hash their key
    /// for [`Ghosts::take`]).
    pub fn any(&self) -> bool {
        self.slots.get().is_some()
    }

    /// Whether the key hashed `hash` was remembered; forgets it.
    pub fn take(&self, hash: u64) -> bool {
        let Some(slot) = self.slot(hash) else {
            return false;
        };
        let h = hash.max(1);
        slot.load(Relaxed) == h && slot.compare_exchange(h, 0, Relaxed, Relaxed).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ghost_is_taken_once() {
        let g = Ghosts::default();
        assert!(!g.take(42), "nothing remembered before the first ghost");
        assert!(!g.any());
        g.remember(42);
        assert!(g.any());
        assert!(!g.take(43));
        assert!(g.take(42));
        assert!(!g.take(42), "taken once");
        g.remember(0);
        assert!(g.take(0), "a hash of 0 is remembered too");
    }

    #[test]
    fn a_later_key_in_the_same_slot_replaces_the_earlier() {
        let g = Ghosts::default();
        g.remember(7);
        g.remember(7 + GHOSTS as u64);
        assert!(!g.take(7));
        assert!(g.take(7 + GHOSTS as u64));
    }

    #[test]
    fn each_class_has_its_probation_below_it() {
        assert_eq!(below(Priority::DropLast), Priority::Normal);
        assert_eq!(below(Priority::Normal), Priority::Low);
        assert_eq!(below(Priority::Low), Priority::DropFirst);
        assert_eq!(below(Priority::DropFirst), Priority::DropFirst);
    }
}
