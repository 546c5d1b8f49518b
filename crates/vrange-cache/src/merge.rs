//! Merge-based eviction at slab grain, after Segcache (Yang et al., NSDI '21): the cache's own
//! evictions (its budget, and recycling while memory is short) take whole slabs, the oldest
//! made first, but first carry the values read since they were written into a *merge slab* of
//! their class. What stays is chosen per value; what is freed is a whole slab.
//!
//! Each entry keeps a read count of two bits (`Slot::hits`): a hit adds one up to 3, and writes
//! it only while below 3, so a hot value's hits write nothing. An eviction finds the victim's
//! entries by its records (the key's hash and the value's offset: `Slab::record`), carries
//! those with a count above zero, the most read first, each with one less, up to 15/16 of a
//! slab (the budget) or half (recycling, which a miss waits for), so an eviction always frees
//! part of what it takes, and a value is carried at most once per read. The other values read as purged. A carried
//! value moves under its map shard's write lock; a lookup that found the old slab dead just
//! before looks again (`Cache::lookup`), so no lookup reports a carried value purged.
//!
//! Probation slabs carry nothing: a hit moved their values out already. The kernel's and the
//! reclaimer's purges under pressure take whole slabs, by how long each was idle, in the one
//! victim order with all other vrange memory of the process, and carry nothing: that is memory
//! going back.

use crate::counters::{class, CLASSES};
use crate::slab::Slab;
use crate::{Cache, Open, Placed, Slot, ALIGN};
use std::hash::Hash;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vrange::order::Place;

/// Probation keeps about `1/PROBATION_SHARE` of its class's bytes from the cache's own
/// evictions (3 %: quick_cache's cold share; a tenth, S3-FIFO's, did worse on ARC's P6 trace).
const PROBATION_SHARE: u64 = 33;

/// Sixteenths of a slab a budget eviction carries at most (ARC's P6 trace at 10 % of its
/// footprint: a hit ratio of 51.9 % at half, 56.7 % at 7/8, 60.0 % at 15/16).
const BUDGET_CARRY: usize = 15;

/// The highest read count an entry keeps.
const MAX_HITS: usize = 3;
/// Where an entry's read count sits in its `Slot::len_hits` word: above every length.
pub(crate) const HITS_SHIFT: u32 = 62;
/// The length's bits of `Slot::len_hits`.
pub(crate) const LEN_MASK: usize = (1 << HITS_SHIFT) - 1;
const _: () = assert!(crate::MAX_REGION <= LEN_MASK);

/// The merge slabs being filled, one per class (under the cache's budget lock).
#[derive(Default)]
pub(crate) struct Merge {
    open: [Option<Open>; CLASSES],
}

/// The first `most` of `slabs` in the order the cache's own evictions take them: the one
/// victim order ([`vrange::order`]: lowest class first, a probation slab counted a class below
/// its own, then the oldest made), except that a class's probation slabs wait after its other
/// slabs while they hold no more than `1/PROBATION_SHARE` of the class's bytes. Without that,
/// probation shrinks to the slab being filled, and a new value must be read again within one
/// slab's inserts to stay (S3-FIFO keeps its small queue at a tenth, quick_cache at 3 %).
pub(crate) fn victim_order(slabs: Vec<Arc<Slab>>, most: usize) -> Vec<Arc<Slab>> {
    let (mut probation, mut all) = ([0u64; CLASSES], [0u64; CLASSES]);
    for s in &slabs {
        let c = class(s.priority);
        all[c] += s.touched() as u64;
        if s.probation {
            probation[c] += s.touched() as u64;
        }
    }
    let now = vrange_sys::clock::now_ns();
    let mut slabs: Vec<_> = slabs
        .into_iter()
        .map(|s| {
            let c = class(s.priority);
            let waits = s.probation && probation[c] * PROBATION_SHARE <= all[c];
            ((waits, Place::new(s.purge_class() as u8, s.age(now))), s)
        })
        .collect();
    let n = slabs.len().min(most);
    if n > 0 && n < slabs.len() {
        slabs.select_nth_unstable_by_key(n - 1, |v| v.0);
    }
    slabs.truncate(n);
    slabs.sort_unstable_by_key(|v| v.0);
    slabs.into_iter().map(|(_, s)| s).collect()
}

impl Slot {
    /// A slot for `len` bytes at `off` in `slab`, read `hits` times.
    pub(crate) fn with_hits(slab: Arc<Slab>, off: usize, len: usize, hits: usize) -> Slot {
        debug_assert!(len <= LEN_MASK && hits <= MAX_HITS);
        Slot {
            slab,
            off,
            len_hits: AtomicUsize::new(len | hits << HITS_SHIFT),
        }
    }

    /// Its read count.
    pub(crate) fn hits(&self) -> usize {
        self.len_hits.load(Relaxed) >> HITS_SHIFT
    }

    /// A hit on the entry (under its map shard's read lock): counts it, writing only while
    /// below [`MAX_HITS`]. Racing hits write the same length, so a lost count is all a race
    /// costs; a carry, which rewrites the slot, holds the shard's write lock.
    #[inline(always)]
    pub(crate) fn hit(&self) {
        let w = self.len_hits.load(Relaxed);
        if w >> HITS_SHIFT < MAX_HITS {
            self.len_hits.store(w + (1 << HITS_SHIFT), Relaxed);
        }
    }
}

impl<K: Hash + Eq + Send + Sync + 'static> Cache<K> {
    /// Evicts the volatile slab `victim` for the cache's budget: carries its values read since
    /// they were written into merge slabs, then frees its region. Does nothing if a reader
    /// pinned it meanwhile.
    pub(crate) fn evict(&self, victim: &Slab, merge: &mut Merge) {
        if victim.probation {
            victim.purge_now();
            return;
        }
        let Some(taken) = victim.take_region() else {
            return;
        };
        let (region, records) = taken.into_parts();
        if region.unmark().is_ok_and(|u| !u.was_purged()) {
            self.carry_out(victim, records, merge, BUDGET_CARRY);
        }
        // SAFETY: the slab is dead and the carry done: nothing refers into the region.
        if unsafe { region.mark() }.is_ok() {
            // Counted as the cache's explicit purge, as a budget purge always was.
            let _ = region.purge();
        }
    }

    /// Carries the values of the dead slab `from` (its `records`) read since they were written
    /// into merge slabs of its class, at most `share` sixteenths of a slab of them. The caller
    /// owns `from`'s region, pinned and intact at the slab's address, and frees it afterwards.
    pub(crate) fn carry_out(
        &self,
        from: &Slab,
        records: Vec<(u64, usize)>,
        merge: &mut Merge,
        share: usize,
    ) {
        if from.probation {
            return;
        }
        let is_it = |s: &Slot, off| std::ptr::eq(Arc::as_ptr(&s.slab), from) && s.off == off;
        let shard = |hash: u64| &self.map.shards()[self.map.determine_shard(hash as usize)];
        // The values read since written, with their counts, found under the shards' read
        // locks; the most read go first.
        let mut read: Vec<(usize, usize, u64, usize)> = records
            .into_iter()
            .filter_map(|(hash, off)| {
                let table = shard(hash).read();
                let bucket = table.find(hash, |(_, v)| is_it(v.get(), off))?;
                // SAFETY: the bucket was found in this table, which the read guard keeps.
                let s = unsafe { bucket.as_ref() }.1.get();
                let hits = s.hits();
                (hits > 0).then_some((hits, s.len(), hash, off))
            })
            .collect();
        read.sort_unstable_by_key(|r| (std::cmp::Reverse(r.0), r.3));
        let most = from.len() / 16 * share;
        let open = &mut merge.open[class(from.priority)];
        let mut carried = 0usize;
        for (_, len, hash, off) in read {
            if carried + len > most {
                continue;
            }
            let Some(mut p) = self.merge_place(open, len, from.priority) else {
                break; // no memory for a merge slab: the rest read as purged
            };
            // The write lock is what makes the slot's reference exclusive below.
            let table = shard(hash).write();
            let Some(bucket) = table.find(hash, |(_, v)| is_it(v.get(), off)) else {
                continue; // removed meanwhile: the place is given up
            };
            // SAFETY: as above, under the write guard: no other reference to the slot exists.
            let slot = unsafe { bucket.as_mut() }.1.get_mut();
            let src = (from.start() + off) as *const u8;
            // SAFETY: `src..src + len` is the value's place in the caller's pinned, intact
            // region; the destination is the place's own, in a slab it holds pinned. Distinct
            // regions: no overlap.
            unsafe { std::ptr::copy_nonoverlapping(src, p.buf().as_mut_ptr(), len) };
            let hits = slot.hits().saturating_sub(1);
            let old = std::mem::replace(slot, Slot::with_hits(p.slab.clone(), p.off, len, hits));
            drop(table);
            drop(old); // `from` loses the entry (under its lock: not under the shard's)
            p.slab.record(hash, p.off);
            p.committed = true; // the slot holds the count now
            p.slab.unpin();
            self.shared.counters.carried(from.priority, len);
            carried += len;
        }
    }

    /// A pinned place for `len` bytes in the merge slab of class `priority`, a new one if the
    /// open one is full or purged. `None` if no slab can be mapped.
    fn merge_place(
        &self,
        open: &mut Option<Open>,
        len: usize,
        priority: vrange::Priority,
    ) -> Option<Placed> {
        // A value of a slab: no overflow.
        let need = len.max(1).next_multiple_of(ALIGN);
        if let Some((slab, off)) = open.as_mut().and_then(|o| o.append(need)) {
            return Some(self.placed_in(slab, off, len));
        }
        *open = None;
        // While memory is short, on the pages of the next victim, as any new slab.
        let recycled = self
            .short_for_a_slab()
            .then(|| self.recycle_oldest(priority, false, None));
        let slab = match recycled.flatten() {
            Some(slab) => slab,
            None => {
                let bytes = self.opts.slab_bytes;
                let slab = self.new_slab(bytes, bytes, priority, false).ok()?;
                self.register(&slab);
                slab
            }
        };
        let c = self.colour();
        *open = Some(Open {
            slab: slab.clone(),
            used: c + need,
        });
        Some(self.placed_in(slab, c, len))
    }
}
