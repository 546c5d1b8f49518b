//! Recycling: while the memory cgroup is short, a new slab takes over the pages of the slab
//! the cache's own eviction would take first instead of mapping fresh ones.
//!
//! A cache growing into its container's limit would otherwise purge its oldest slab (the
//! pages go back to the kernel) and then fault a new slab in: every page zeroed, charged to
//! the memory cgroup and mapped again, for memory that was resident a moment before. Short
//! means a new slab would pass the cache's budget, or leave the memory cgroup less free than
//! the `VRANGE_HEADROOM` threshold ([`vrange::short::Room::short_for`]). Then the victim is the
//! one a budget eviction would choose: first in the one victim order ([`vrange::order`]), a
//! probation slab counted a class below its own, then the oldest made; its values read since
//! they were written are carried into a merge slab (`crate::merge`), the others' lookups say
//! `Purged`, and its region, pinned again, becomes the new slab. Memory goes back to the
//! system only when someone else needs it: the reclaimer still purges the cache's volatile
//! slabs on pressure, in one order with all other vrange memory of the process.
//!
//! Choosing a victim scans every slab, so a scan keeps the oldest sixteenth (at least
//! [`BATCH`]) as candidates for the recycles that follow; a candidate pinned or purged since
//! is skipped.

use crate::slab::Slab;
use crate::Cache;
use std::hash::Hash;
use std::sync::{Arc, Weak};
use vrange::Priority;

/// Sixteenths of a slab a recycle carries at most (see `Cache::carry_out`): half, against
/// the budget's 15/16, because a miss waits for it. In the cache scenario (cost 0) carrying
/// nothing served 217 k requests/s at a 51.6 % hit rate, half 206 k at 54.8 %, 15/16 202 k
/// at 54.9 %.
const RECYCLE_CARRY: usize = 8;

/// Candidates one scan keeps: at least this many, and a sixteenth of the slabs (a scan
/// reads every slab, which took a ninth of a busy cache's time at 32 per scan of 1,900).
const BATCH: usize = 32;
/// The share of the slabs one scan keeps as candidates, `1/SHARE`.
const SHARE: usize = 16;

/// The candidates of the last scan, the oldest last.
#[derive(Debug)]
pub(crate) struct Candidates(crate::lock::Mutex<Vec<Weak<Slab>>>);

impl Default for Candidates {
    fn default() -> Candidates {
        Candidates(crate::lock::Mutex::new(
            vrange_sys::lock::Rank::CacheCandidates,
            Vec::new(),
        ))
    }
}

impl<K: Hash + Eq + Send + Sync + 'static> Cache<K> {
    /// A new slab (pinned once) for class `priority`, on the pages of the slab this cache's
    /// own eviction takes first, if memory is short and there is one.
    pub(crate) fn recycled_slab(&self, priority: Priority, probation: bool) -> Option<Arc<Slab>> {
        if self.short_for_a_slab() {
            self.recycle_oldest(priority, probation, Some(&mut *self.budget_lock.lock()))
        } else {
            None
        }
    }

    /// Whether a new slab would leave memory short.
    pub(crate) fn short_for_a_slab(&self) -> bool {
        // A recent reading that says short is trusted (reading the cgroup's files took a
        // fifteenth of a busy cache's time, once per slab): at worst the cache recycles for
        // three of the reclaimer's ticks (at least a second) after memory stopped being short,
        // which gives nothing back late. One that says otherwise is not: the cache would grow
        // on it.
        let bytes = self.opts.slab_bytes as u64;
        vrange::reclaimer::recent_room().is_some_and(|r| r.short_for(bytes))
            || vrange::reclaimer::room().is_some_and(|r| r.short_for(bytes))
    }

    /// A new slab on the pages of the slab the cache's own eviction takes first, if there is
    /// one; with `merge`, the victim's read values are carried out first (a merge slab's own
    /// recycling, under the eviction's lock, carries nothing: its victim's values are lost).
    pub(crate) fn recycle_oldest(
        &self,
        priority: Priority,
        probation: bool,
        merge: Option<&mut crate::merge::Merge>,
    ) -> Option<Arc<Slab>> {
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
            let Some(victim) = victim else {
                continue;
            };
            let Some(mut recycled) = victim.take_for_recycling() else {
                continue;
            };
            let records = recycled.take_records();
            let slab = Slab::recycled(recycled, priority, probation, &self.shared)?;
            // Pages proved intact (a purged region counts none touched): the values read since
            // they were written go on before the new slab's writes.
            if let Some(merge) = merge.filter(|_| slab.touched() > 0) {
                self.carry_out(&victim, records, merge, RECYCLE_CARRY);
            }
            self.register(&slab);
            return Some(slab);
        }
    }

    /// The sixteenth of the slabs (at least [`BATCH`]) a budget purge would take first (the
    /// first last): unpinned, without holds, the size of a slab (values with a region of their
    /// own are not recycled).
    fn oldest_slabs(&self) -> Vec<Weak<Slab>> {
        let len = self.opts.slab_bytes;
        let most = BATCH.max(self.slabs.len() / SHARE);
        let keep = |s: &Slab| s.len() == len && s.unpinned() && !s.has_holds();
        let oldest = self.in_victim_order(keep, most);
        // Popped from the end: the first in the order goes first.
        oldest
            .into_iter()
            .rev()
            .map(|s| Arc::downgrade(&s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::{Cache, Miss, Options, Priority};

    const VALUE: usize = 4000;

    fn quiet() {
        for (k, v) in [
            ("VRANGE_PSI", "off"),
            ("VRANGE_VMPRESSURE", "0"),
            ("VRANGE_HEADROOM", "0"),
            ("VRANGE_BUDGET", "0"),
            ("VRANGE_ARM_DELAY_MS", "3600000"),
        ] {
            vrange::set_option(k, v).expect(k);
        }
    }

    /// Eight slabs of 16 values each, all volatile (flushed).
    fn cache() -> Cache<u64> {
        let c = Cache::new(Options {
            slab_bytes: 64 << 10,
            probation: false,
            ..Options::default()
        });
        for k in 0..8 * 16 {
            c.insert(k, &[k as u8; VALUE], Priority::Normal).unwrap();
        }
        c.shared.flush_idle();
        c
    }

    #[test]
    fn a_recycled_slabs_entries_read_purged_and_the_others_stay() {
        let _s = vrange_testkit::serial();
        quiet();
        let c = cache();
        let slab = c
            .recycle_oldest(Priority::Normal, false, Some(&mut *c.budget_lock.lock()))
            .expect("a victim");
        assert_eq!(slab.len(), 64 << 10);
        assert_eq!(c.stats().classes[Priority::Normal as usize].recycled, 1);
        // One slab's sixteen entries are gone (which one depends on the order the flush marked
        // them in: the tests here run beside each other); every other value reads right.
        let mut purged = 0;
        for k in 0..8 * 16u64 {
            match c.lookup(&k) {
                Ok(v) => assert_eq!(*v, [k as u8; VALUE][..], "key {k}"),
                Err(Miss::Purged) => purged += 1,
                Err(Miss::Absent) => panic!("key {k} absent"),
            }
        }
        assert_eq!(purged, 16, "one slab's entries");
        slab.unpin();
    }

    #[test]
    fn a_recycled_slab_carries_its_read_values() {
        let _s = vrange_testkit::serial();
        quiet();
        let c = cache();
        // A quarter of every slab's values read once.
        for k in (0..8 * 16u64).filter(|k| k % 4 == 0) {
            assert_eq!(
                *c.get(&k).expect("a value"),
                [k as u8; VALUE][..],
                "key {k}"
            );
        }
        c.shared.flush_idle();
        c.recycle_oldest(Priority::Normal, false, Some(&mut *c.budget_lock.lock()))
            .expect("a victim")
            .unpin();
        let stats = c.stats().classes[Priority::Normal as usize];
        assert!(stats.carried >= 3, "the victim's read values: {stats:?}");
        let mut purged = 0;
        for k in 0..8 * 16u64 {
            match c.lookup(&k) {
                Ok(v) => assert_eq!(*v, [k as u8; VALUE][..], "key {k}"),
                Err(Miss::Purged) => {
                    assert!(k % 4 != 0, "read key {k} was not carried");
                    purged += 1;
                }
                Err(Miss::Absent) => panic!("key {k} absent"),
            }
        }
        // The oldest slab's unread values (15 or 16 fit, behind its colour), and no other.
        assert!((11..=12).contains(&purged), "{purged} purged");
    }

    #[test]
    fn a_slab_pinned_after_it_was_chosen_is_not_recycled() {
        let _s = vrange_testkit::serial();
        quiet();
        let c = cache();
        // The first recycle scans, takes the oldest and keeps the next seven as candidates.
        c.recycle_oldest(Priority::Normal, false, Some(&mut *c.budget_lock.lock()))
            .expect("a victim")
            .unpin();
        // Readers pin every value there is, the candidates' slabs included.
        let held: Vec<_> = (0..8 * 16).filter_map(|k| Some((k, c.get(&k)?))).collect();
        assert_eq!(held.len(), 7 * 16);
        assert!(
            c.recycle_oldest(Priority::Normal, false, Some(&mut *c.budget_lock.lock()))
                .is_none(),
            "a pinned slab was recycled"
        );
        for (k, v) in &held {
            assert_eq!(**v, [*k as u8; VALUE][..], "key {k}");
        }
    }
}
