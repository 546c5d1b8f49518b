//! Recycling: while memory is short, a new slab takes over the pages of the cache's own least
//! recently used slab instead of mapping fresh ones.
//!
//! A cache growing into its container's limit would otherwise purge its oldest slab (the
//! pages go back to the kernel) and then fault a new slab in: every page zeroed, charged to
//! the memory cgroup and mapped again, for memory that was resident a moment before. Short
//! means a new slab would pass the cache's budget, or leave the memory cgroup less free than
//! the `VRANGE_HEADROOM` threshold ([`vrange::reclaimer::room_left`]). Then the victim is the
//! one a budget purge would choose (lowest class first, probation a class below its own,
//! least recently used first); it dies as if purged (its entries' lookups say `Purged`), and
//! its region, pinned again, becomes the new slab. Memory goes back to the system only when
//! someone else needs it: the reclaimer still purges the cache's volatile slabs on pressure,
//! in one order with all other vrange memory of the process.
//!
//! Choosing a victim scans every slab, so a scan keeps the [`BATCH`] oldest as candidates for
//! the recycles that follow; a candidate pinned or purged since is skipped.

use crate::counters::class;
use crate::slab::Slab;
use crate::Cache;
use std::hash::Hash;
use std::sync::{Arc, Weak};
use vrange::Priority;

/// Candidates one scan keeps.
const BATCH: usize = 32;

/// The candidates of the last scan, the oldest last.
#[derive(Debug, Default)]
pub(crate) struct Candidates(parking_lot::Mutex<Vec<Weak<Slab>>>);

impl<K: Hash + Eq + Send + Sync + 'static> Cache<K> {
    /// A new slab (pinned once) for class `priority`, on the pages of this cache's least
    /// recently used unpinned slab, if memory is short and there is one.
    pub(crate) fn recycled_slab(&self, priority: Priority, probation: bool) -> Option<Arc<Slab>> {
        if !self.short_of_memory() {
            return None;
        }
        let mut scanned = false;
        loop {
            let next = self.candidates.0.lock().pop();
            let victim = match next {
                Some(w) => w.upgrade(),
                None if scanned => return None,
                None => {
                    scanned = true;
                    *self.candidates.0.lock() = self.oldest_slabs();
                    continue;
                }
            };
            let Some(recycled) = victim.and_then(|v| v.take_for_recycling()) else {
                continue;
            };
            let slab = Slab::recycled(recycled, priority, probation, &self.shared)?;
            self.register(&slab);
            return Some(slab);
        }
    }

    /// Whether a new slab would pass the cache's budget or the memory cgroup's headroom.
    fn short_of_memory(&self) -> bool {
        let slab = self.opts.slab_bytes as u64;
        self.opts
            .budget
            .is_some_and(|b| self.shared.resident().saturating_add(slab) > b as u64)
            || vrange::reclaimer::room_left().is_some_and(|room| room < slab)
    }

    /// The [`BATCH`] slabs a budget purge would take first (oldest last): unpinned, without
    /// holds, the size of a slab (values with a region of their own are not recycled).
    fn oldest_slabs(&self) -> Vec<Weak<Slab>> {
        let len = self.opts.slab_bytes;
        let mut slabs: Vec<_> = self
            .slabs
            .iter()
            .filter_map(|s| s.value().upgrade())
            .filter(|s| s.len() == len && s.unpinned() && !s.is_dead() && !s.has_holds())
            .filter_map(|s| Some((class(s.purge_class()), std::cmp::Reverse(s.idle()?), s)))
            .collect();
        let n = slabs.len().min(BATCH);
        if n > 0 {
            slabs.select_nth_unstable_by_key(n - 1, |v| (v.0, v.1));
        }
        slabs.truncate(n);
        // Popped from the end: the oldest goes first.
        slabs.sort_unstable_by_key(|v| std::cmp::Reverse((v.0, v.1)));
        slabs.iter().map(|(_, _, s)| Arc::downgrade(s)).collect()
    }
}
