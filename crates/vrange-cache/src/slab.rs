//! A slab: one vrange region holding the values of one or more entries, purged whole. It never
//! reuses space, so bytes once written stay what they were while the slab lives. A dead slab's
//! region may become a new slab (`crate::recycle`): no one can pin the dead one again. A slab
//! dropped whole (no entry left, no hold) leaves its region to the process's pool
//! (`crate::pool`), for a new slab of any cache.
//!
//! # Pins, and why a hit changes no range state
//! `state` holds the readers' and writers' pin count and two flags. `HELD`: the region is
//! pinned (unmarked) on the cache's behalf. `QUEUED`: the slab waits in the cache's idle list.
//!
//! | event | state before | what happens |
//! |---|---|---|
//! | pin (fast) | `HELD`, n | CAS to n+1: no lock, no call into vrange |
//! | pin (slow) | not `HELD` | under the region's lock: unmark the region (purged: the slab dies), then `HELD`, 1 |
//! | unpin | `HELD`, n | n−1; the last one queues the slab (sets `QUEUED`) unless queued |
//! | flush | `HELD`, 0 | under the region's lock: CAS to 0 (neither flag), then mark the region volatile |
//! | flush | `HELD`, n > 0 | CAS clearing `QUEUED`: the last unpin will queue it again |
//!
//! The region is thus pinned whenever the count is above zero (only the slow path, under the
//! lock, sets `HELD`, and the flush clears it only at a zero count, by CAS), and volatile
//! within one flush of its last unpin. vrange's reclaimer runs the flush
//! ([`vrange::reclaimer::on_flush`]) at each tick and before every purge, so an idle slab is
//! never spared a purge it should get (one that another thread's flush is marking at that
//! moment is taken by the next purge).
//!
//! While `HELD`, the slab holds a reference to itself (`Inner::me`): a pin keeps it alive,
//! so an `Entry` needs no reference count of its own, and a hit makes two atomic operations
//! on the slab, not four.
//!
//! # Holds: a value kept for long pins its own pages, not the slab
//! A pin is the hot path's lock on the whole slab, for as long as a reader looks. A value kept
//! longer (a [`crate::Held`], a raw value of the C ABI, a Python view) is a *hold* instead:
//! its page-rounded extent, listed under the region's lock and counted in no pin. The flush
//! then marks the slab volatile *around* the holds (each gap its own vrange range), so a
//! purge can take every page but the held ones; a hold released while the slab is volatile
//! marks its own pages. A slab purged around holds is dead (its other entries are lost) but
//! stays mapped, the held pages intact, until its last hold goes.

use crate::counters::Counters;
use crate::lock::Mutex;
use dashmap::DashMap;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Weak};
use vrange::{Options, Priority, VolatileRegion};

/// The class a slab's region is purged as: one below its values' on probation.
fn region_class(opts: &Options, probation: bool) -> Priority {
    if probation {
        crate::probation::below(opts.priority)
    } else {
        opts.priority
    }
}

/// The slab's content is gone (the system purged it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Purged;

/// A dead slab's region, taken for a new slab, and how much of it was written.
#[derive(Debug)]
pub(crate) struct Recycled {
    region: VolatileRegion,
    touched: usize,
    /// The dead slab's records (`Inner::records`), for an eviction to carry its read values.
    records: Vec<(u64, usize)>,
}

impl Recycled {
    /// The region, still volatile, and the dead slab's records.
    pub fn into_parts(self) -> (VolatileRegion, Vec<(u64, usize)>) {
        (self.region, self.records)
    }

    /// The dead slab's records, taken.
    pub fn take_records(&mut self) -> Vec<(u64, usize)> {
        std::mem::take(&mut self.records)
    }
}

const HELD: u32 = 1 << 31;
const QUEUED: u32 = 1 << 30;
const COUNT: u32 = QUEUED - 1;

#[derive(Debug)]
struct Inner {
    /// The region; `None` once dead (unmapped: no one can hold a pin on a dead slab).
    region: Option<VolatileRegion>,
    /// The slab's reference to itself while `HELD`.
    me: Option<Arc<Slab>>,
    /// Held extents (page-rounded offsets `start..end`, one per hold: a multiset), never
    /// marked volatile while listed.
    holds: Vec<(usize, usize)>,
    /// The values placed here, as (the key's hash, offset): how an eviction finds their
    /// entries to carry the ones read since they were written (`crate::merge`). Entries
    /// removed or moved since are found gone then.
    records: Vec<(u64, usize)>,
}

impl Inner {
    /// Marks volatile the pages of `lo..hi` (page offsets in the slab) that no hold covers.
    /// The caller holds the region's lock, and no pin is held (or can be taken without it).
    fn mark_unheld(&self, lo: usize, hi: usize) {
        let Some(r) = self.region.as_ref() else {
            return;
        };
        let mut holds: Vec<(usize, usize)> = self
            .holds
            .iter()
            .copied()
            .filter(|&(s, e)| s < hi && e > lo)
            .collect();
        holds.sort_unstable();
        let mut at = lo;
        for (s, e) in holds.into_iter().chain([(hi, hi)]) {
            if s > at {
                // SAFETY: the caller holds the lock with no pin: no reader holds a reference
                // into `at..s`, and no hold lies in it.
                let _ = unsafe { r.mark_range(at, s - at) };
            }
            at = at.max(e);
        }
    }

    /// Bytes of the pages the holds cover (overlaps once).
    fn held_bytes(&self) -> usize {
        match self.holds[..] {
            [] => return 0,
            [(s, e)] => return e - s,
            _ => {}
        }
        let mut holds = self.holds.clone();
        holds.sort_unstable();
        let (mut total, mut end) = (0, 0);
        for (s, e) in holds {
            let s = s.max(end);
            if e > s {
                total += e - s;
                end = e;
            }
        }
        total
    }
}

#[derive(Debug)]
pub(crate) struct Slab {
    start: usize,
    len: usize,
    state: AtomicU32,
    /// End of the last page values were written to (page-rounded high-water mark of the
    /// places handed out): the most of the slab that can be resident. Pages past it were
    /// never touched, so take no memory.
    touched: AtomicUsize,
    inner: Mutex<Inner>,
    dead: AtomicBool,
    /// The sequence number of its death (`Counters::slab_died`), 0 while alive.
    died: AtomicU64,
    /// Entries (in the map or being written) whose values lie here, and their bytes.
    live: AtomicUsize,
    live_bytes: AtomicUsize,
    /// Bytes of the pages holds cover (`Inner::held_bytes`, kept for statistics).
    held_bytes: AtomicUsize,
    pub priority: Priority,
    /// The slab holds values on probation (`crate::probation`): its region is one class
    /// below `priority`, and a hit moves a value out of it.
    pub probation: bool,
    /// When it was made (`vrange_sys::clock::now_ns`): the cache's own evictions take the
    /// oldest first (`crate::merge`).
    born: u64,
    shared: Arc<Shared>,
    me: Weak<Slab>,
}

impl Slab {
    /// A new slab of at least `len` bytes, pinned once for its creator; on `probation`, its
    /// region is purged as one class below `opts.priority` (`crate::probation`).
    pub fn new(
        len: usize,
        opts: Options,
        probation: bool,
        shared: &Arc<Shared>,
    ) -> vrange::Result<Arc<Slab>> {
        let region = VolatileRegion::new(
            len,
            Options {
                priority: region_class(&opts, probation),
                ..opts
            },
        )?;
        Ok(Slab::around(region, opts.priority, probation, shared, 0))
    }

    /// As [`Slab::new`], on a region of exactly `len` bytes from the pool (`crate::pool`) whose
    /// written pages lie within the first `used` bytes, if it has one; with the bytes of it
    /// that may be resident. Its old pages count as untouched until values are written there:
    /// a flush marks volatile only the pages of this slab's values, so that a purge around a
    /// hold takes no value for a stale page. (Until overwritten, they are resident, pinned and
    /// not counted: a slab fills in order, so what stays is its tail past its last value.)
    pub fn pooled(
        len: usize,
        used: usize,
        opts: Options,
        probation: bool,
        shared: &Arc<Shared>,
    ) -> Option<(Arc<Slab>, usize)> {
        let (region, resident) =
            crate::pool::take(len, used, opts.policy, region_class(&opts, probation))?;
        let slab = Slab::around(region, opts.priority, probation, shared, 0);
        Some((slab, resident))
    }

    /// A new slab on the pages of a recycled one's region (see `crate::recycle`), pinned once
    /// for its creator and purged as class `priority` (one below on `probation`). `None` if the
    /// region cannot be pinned (never for a cache's own region).
    pub fn recycled(
        recycled: Recycled,
        priority: Priority,
        probation: bool,
        shared: &Arc<Shared>,
    ) -> Option<Arc<Slab>> {
        let Recycled {
            region, touched, ..
        } = recycled;
        region.set_priority(if probation {
            crate::probation::below(priority)
        } else {
            priority
        });
        // Pages the kernel or the reclaimer took meanwhile read as zero: harmless for a slab
        // whose values are all to be written, but they no longer count as resident.
        let unmarked = region.unmark().ok()?;
        let touched = if unmarked.was_purged() { 0 } else { touched };
        Some(Slab::around(region, priority, probation, shared, touched))
    }

    /// The slab around `region` (pinned), its first `touched` bytes' pages resident.
    fn around(
        region: VolatileRegion,
        priority: Priority,
        probation: bool,
        shared: &Arc<Shared>,
        touched: usize,
    ) -> Arc<Slab> {
        shared.counters.slab_created(priority, region.len());
        shared.counters.touched(priority, touched);
        let slab = Arc::new_cyclic(|me| Slab {
            start: region.as_ptr() as usize,
            len: region.len(),
            state: AtomicU32::new(HELD | 1),
            touched: AtomicUsize::new(touched),
            inner: Mutex::new(
                vrange_sys::lock::Rank::CacheSlab,
                Inner {
                    region: Some(region),
                    me: None,
                    holds: Vec::new(),
                    records: Vec::new(),
                },
            ),
            dead: AtomicBool::new(false),
            died: AtomicU64::new(0),
            live: AtomicUsize::new(0),
            live_bytes: AtomicUsize::new(0),
            held_bytes: AtomicUsize::new(0),
            priority,
            probation,
            born: vrange_sys::clock::now_ns(),
            shared: shared.clone(),
            me: me.clone(),
        });
        slab.inner.lock().me = Some(slab.clone());
        slab
    }

    /// Takes the region of this volatile slab for a new one (`crate::recycle`): the slab dies
    /// as if purged (its entries' lookups say `Purged`). `None`, changing nothing, if a reader
    /// pins it, a hold keeps pages of it, or it is dead already.
    pub fn take_for_recycling(&self) -> Option<Recycled> {
        let taken = self.take_region()?;
        self.shared.counters.recycled(self.priority);
        Some(taken)
    }

    /// Takes the region of this volatile slab, still volatile, for the caller to evict: the
    /// slab dies as if purged. `None`, changing nothing, as [`Slab::take_for_recycling`].
    pub fn take_region(&self) -> Option<Recycled> {
        let mut inner = self.inner.lock();
        // Under the lock with the state zero, no pin exists and a new one waits for the lock,
        // then finds no region.
        if self.state.load(Acquire) != 0 || self.is_dead() || !inner.holds.is_empty() {
            return None;
        }
        let region = inner.region.take()?;
        let records = std::mem::take(&mut inner.records);
        self.die(&mut inner);
        Some(Recycled {
            region,
            touched: self.touched(),
            records,
        })
    }

    /// A value of the key hashed `hash` was placed at `off` (the caller holds a pin).
    pub fn record(&self, hash: u64, off: usize) {
        self.inner.lock().records.push((hash, off));
    }

    /// How long ago it was made.
    pub fn age(&self, now: u64) -> u64 {
        now.saturating_sub(self.born)
    }

    /// The class the slab's region is purged as (one below its values' on probation).
    pub fn purge_class(&self) -> Priority {
        if self.probation {
            crate::probation::below(self.priority)
        } else {
            self.priority
        }
    }

    pub fn start(&self) -> usize {
        self.start
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The slab as an `Arc` (`None` only while it is being freed, when no one holds a pin).
    pub fn arc(&self) -> Option<Arc<Slab>> {
        self.me.upgrade()
    }

    /// What the slab shares with its cache.
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Bytes of the slab's pages values were written to (page-rounded; see `touched`).
    pub fn touched(&self) -> usize {
        self.touched.load(Relaxed)
    }

    /// A value is written below byte `end` (the caller holds a pin): counts the pages up to
    /// it as resident. `end` lies inside the slab, so rounding it up to a page cannot overflow.
    pub fn touch(&self, end: usize) {
        debug_assert!(end <= self.len);
        let end = end.next_multiple_of(vrange::page_size()).min(self.len);
        let before = self.touched.fetch_max(end, Relaxed);
        if end > before {
            self.shared.counters.touched(self.priority, end - before);
        }
    }

    /// Whether a reader (or an insert in progress) holds a pin on the slab now.
    pub fn pinned_now(&self) -> bool {
        self.state.load(Relaxed) & COUNT != 0
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Acquire)
    }

    /// The sequence number of its death (see `Counters::deaths`), 0 while alive.
    pub fn died(&self) -> u64 {
        self.died.load(Relaxed)
    }

    pub fn live_bytes(&self) -> usize {
        self.live_bytes.load(Relaxed)
    }

    /// Whether the region is volatile as far as the cache knows (no pin, not held).
    pub fn unpinned(&self) -> bool {
        self.state.load(Relaxed) == 0
    }

    /// How long it has been volatile (`None` while held or purged).
    pub fn idle(&self) -> Option<std::time::Duration> {
        self.inner.lock().region.as_ref()?.idle()
    }

    /// Pins the slab; `Err(Purged)` if its content is gone (it is then dead for good).
    ///
    /// # Panics
    /// If the slab already has `COUNT` (2^30 − 1) pins: one more would carry into the flags,
    /// and a flush could then mark the slab volatile under its readers. Only leaked entries
    /// (`mem::forget`, raw values never released) get there; like `Arc`'s count, the limit is
    /// checked rather than trusted.
    pub fn pin(&self) -> Result<(), Purged> {
        let mut s = self.state.load(Relaxed);
        while s & HELD != 0 {
            check_count(s);
            match self.state.compare_exchange_weak(s, s + 1, Acquire, Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => s = now,
            }
        }
        let mut inner = self.inner.lock();
        if self.state.load(Acquire) & HELD == 0 {
            let Some(r) = inner.region.as_ref().filter(|_| !self.is_dead()) else {
                return Err(Purged);
            };
            // Unmark only fails for memory vrange does not own (the ranges split around
            // holds are all the region's own).
            if r.unmark().unwrap_or_default().was_purged() {
                // Volatile again around the holds, for `die` to free.
                self.mark_idle(&inner);
                self.die(&mut inner);
                return Err(Purged);
            }
            inner.me = self.me.upgrade();
            // No pin can exist without HELD, and only this lock's holder sets it.
            self.state.fetch_or(HELD, AcqRel);
        }
        // HELD stays set: clearing it takes this lock. Fast-path pins may race this one.
        let mut s = self.state.load(Relaxed);
        loop {
            check_count(s);
            match self.state.compare_exchange_weak(s, s + 1, AcqRel, Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => s = now,
            }
        }
    }

    /// Drops one pin; the last one queues the slab for the next flush.
    pub fn unpin(&self) {
        let before = self.state.fetch_sub(1, AcqRel);
        debug_assert!(before & HELD != 0 && before & COUNT != 0);
        if before & COUNT == 1 && before & QUEUED == 0 {
            let queued = self.state.fetch_or(QUEUED, AcqRel);
            if queued & QUEUED == 0 {
                self.shared.queue_idle(self.me.clone());
            }
        }
    }

    /// Marks the region volatile if no one holds a pin (the flush of the idle list).
    pub fn release_if_idle(&self) {
        let mut inner = self.inner.lock();
        let mut s = self.state.load(Acquire);
        loop {
            if s & HELD == 0 {
                return;
            }
            let next = if s & COUNT == 0 { 0 } else { s & !QUEUED };
            match self.state.compare_exchange(s, next, AcqRel, Acquire) {
                Ok(_) if next == 0 => break,
                Ok(_) => return,
                Err(now) => s = now,
            }
        }
        // The count was zero and HELD is now clear, so a reader must take the slow path,
        // which waits for this lock: no reference into the region is live but the holds'.
        self.mark_idle(&inner);
        // Dropped after the lock: it may be the last reference.
        let me = inner.me.take();
        drop(inner);
        drop(me);
    }

    /// Marks the slab dead if the reclaimer purged it while no one held it. Returns whether it
    /// did (the caller's sweep found a purge nobody had looked up yet).
    pub fn check_purged(&self) -> bool {
        if self.is_dead() || self.state.load(Relaxed) != 0 {
            return false;
        }
        let mut inner = self.inner.lock();
        match inner.region.as_ref() {
            Some(r) if self.state.load(Acquire) == 0 && r.is_purged() => {
                self.die(&mut inner);
                true
            }
            _ => false,
        }
    }

    /// Purges the slab now if no one holds it (the cache's own budget). Returns bytes freed.
    pub fn purge_now(&self) -> usize {
        let mut inner = self.inner.lock();
        let Some(r) = inner
            .region
            .as_ref()
            .filter(|_| self.state.load(Acquire) == 0 && !self.is_dead())
        else {
            return 0;
        };
        let freed = r.purge().unwrap_or(0);
        if freed > 0 {
            self.die(&mut inner);
        }
        freed
    }

    /// The content is gone: unmaps the region (no one holds a pin, and no one can take one
    /// from now on), or, while holds remain, purges what is volatile around them and unmaps
    /// it at the last hold's release. Called with the region's lock held.
    fn die(&self, inner: &mut Inner) {
        if inner.holds.is_empty() {
            inner.region = None;
        } else if let Some(r) = inner.region.as_ref() {
            let _ = r.purge();
        }
        // Nothing is left to carry (an eviction took them first).
        inner.records = Vec::new();
        if !self.dead.swap(true, AcqRel) {
            let seq = self.shared.counters.slab_died(
                self.priority,
                self.len(),
                self.touched(),
                self.live.load(Relaxed),
                self.live_bytes.load(Relaxed),
            );
            self.died.store(seq, Relaxed);
        }
    }

    /// Holds the pages of the value at `off..off + len` (the caller holds a pin, so the slab
    /// is alive and not purged): they stay unpurged, and the slab mapped, until
    /// [`Slab::release_hold`] with the same place.
    pub fn hold(&self, off: usize, len: usize) {
        let extent = self.extent(off, len);
        let mut inner = self.inner.lock();
        inner.holds.push(extent);
        self.held_bytes.store(inner.held_bytes(), Relaxed);
    }

    /// Drops one hold of the value at `off..off + len`; its pages become volatile with the
    /// slab (at once if the slab is volatile now), and a dead slab's last hold unmaps it.
    /// Returns `false`, changing nothing, if no such hold is listed.
    pub fn release_hold(&self, off: usize, len: usize) -> bool {
        let extent = self.extent(off, len);
        let mut inner = self.inner.lock();
        let Some(i) = inner.holds.iter().position(|&h| h == extent) else {
            return false;
        };
        inner.holds.swap_remove(i);
        self.held_bytes.store(inner.held_bytes(), Relaxed);
        if self.is_dead() {
            if inner.holds.is_empty() {
                inner.region = None;
            }
        } else if self.state.load(Acquire) == 0 {
            // Volatile around the holds: no pin, and a new one waits for this lock.
            inner.mark_unheld(extent.0, extent.1);
        }
        true
    }

    /// Marks the idle slab volatile (the caller holds the region's lock, and no pin is held):
    /// all of it, or, around holds, the written pages no hold covers. Pages never written are
    /// then left pinned: they take no memory, and a purge of them would lose nothing yet
    /// declare the slab, and so its held values' entries, purged.
    fn mark_idle(&self, inner: &Inner) {
        let end = if inner.holds.is_empty() {
            self.len
        } else {
            self.touched()
        };
        inner.mark_unheld(0, end);
    }

    /// The page-rounded extent of `off..off + len` (inside the slab: no overflow).
    fn extent(&self, off: usize, len: usize) -> (usize, usize) {
        let page = vrange::page_size();
        debug_assert!(off + len <= self.len);
        let lo = off - off % page;
        (lo, (off + len).next_multiple_of(page).min(self.len).max(lo))
    }

    /// Bytes of this slab no purge can take now: its written pages while pinned, else the
    /// pages its holds cover.
    pub fn pinned_bytes(&self) -> usize {
        if self.pinned_now() {
            self.touched()
        } else {
            self.held_bytes.load(Relaxed)
        }
    }

    /// Whether a hold keeps the slab mapped (possibly dead).
    pub fn has_holds(&self) -> bool {
        self.held_bytes.load(Relaxed) != 0
    }

    /// A value of `len` bytes was placed here.
    pub fn entry_added(&self, len: usize) {
        self.live.fetch_add(1, Relaxed);
        self.live_bytes.fetch_add(len, Relaxed);
    }

    /// A value of `len` bytes here left the cache (removed, replaced, dropped).
    pub fn entry_gone(&self, len: usize) {
        let _g = self.inner.lock();
        self.live.fetch_sub(1, Relaxed);
        self.live_bytes.fetch_sub(len, Relaxed);
        if self.is_dead() {
            self.shared.counters.tombstone_gone();
        }
    }

    /// The address of byte `off`.
    ///
    /// # Safety
    /// `off` must lie inside the slab; whoever reads through the pointer must hold a pin
    /// (which keeps the region mapped and its content in place).
    pub unsafe fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.len());
        (self.start + off) as *mut u8
    }
}

/// Refuses a pin that would carry the count into the flags (see `Slab::pin`).
#[inline(always)]
fn check_count(state: u32) {
    if state & COUNT == COUNT {
        too_many_pins();
    }
}

#[cold]
#[inline(never)]
fn too_many_pins() -> ! {
    panic!("vrange-cache: {COUNT} pins held on one slab (entries leaked without release?)");
}

impl Drop for Slab {
    fn drop(&mut self) {
        if !self.dead.load(Relaxed) {
            self.shared
                .counters
                .slab_freed(self.priority, self.len(), self.touched());
        }
        // The last reference: no entry uses the slab, and no pin is held (a pin keeps it).
        let touched = self.touched();
        let inner = self.inner.get_mut();
        if inner.holds.is_empty() {
            if let Some(region) = inner.region.take() {
                crate::pool::put(region, touched);
            }
        }
    }
}

/// What a cache shares with its slabs (which may outlive it in a reader's hands): the
/// statistics, and the list of slabs whose last pin was dropped since the last flush.
#[derive(Debug)]
pub(crate) struct Shared {
    pub counters: Counters,
    idle: Mutex<Vec<Weak<Slab>>>,
    flush: std::sync::OnceLock<vrange::reclaimer::FlushHook>,
    /// Values given out raw (`Entry::into_raw`) and not released yet, by exact address: how
    /// many raw pins each has, and its slab. A release must name one of these, so a second or
    /// a foreign release is refused instead of dropping another reader's pin.
    /// Sharded, so that threads getting values raw do not queue on one lock.
    raw: DashMap<usize, RawPins, foldhash::fast::RandomState>,
}

/// The raw pins outstanding on one value's address.
#[derive(Debug)]
struct RawPins {
    count: usize,
    len: usize,
    slab: Arc<Slab>,
}

impl Shared {
    /// Shared state of a new cache, with its flush hook: it lives as long as any slab (which
    /// may outlive the cache in a reader's hands), so idle slabs are always released.
    pub fn new() -> Arc<Shared> {
        let shared = Arc::new(Shared {
            counters: Counters::new(),
            idle: Mutex::new(vrange_sys::lock::Rank::CacheIdle, Vec::new()),
            flush: std::sync::OnceLock::new(),
            raw: DashMap::default(),
        });
        let weak = Arc::downgrade(&shared);
        let hook = vrange::reclaimer::on_flush(move || {
            if let Some(s) = weak.upgrade() {
                s.flush_idle();
            }
        });
        let _ = shared.flush.set(hook);
        shared
    }

    /// A slab lost its last pin: the next flush marks it volatile.
    pub fn queue_idle(&self, slab: Weak<Slab>) {
        self.idle.lock().push(slab);
    }

    /// Marks volatile every queued slab still unpinned (in the order they went idle, so that
    /// vrange ages them in that order).
    pub fn flush_idle(&self) {
        let idle = std::mem::take(&mut *self.idle.lock());
        for slab in idle.iter().filter_map(Weak::upgrade) {
            slab.release_if_idle();
        }
    }

    /// A value of `len` bytes given out raw at `addr`, held in `slab`.
    pub fn raw_given(&self, addr: usize, len: usize, slab: Arc<Slab>) {
        let mut pins = self.raw.entry(addr).or_insert(RawPins {
            count: 0,
            len,
            slab,
        });
        // A pin each; there cannot be more pins than addressable bytes.
        pins.count = pins.count.saturating_add(1);
    }

    /// Takes back one raw hold of the value at exactly `addr`, returning its slab and length
    /// for the caller to release; `None` if no value at `addr` has a raw hold outstanding.
    pub fn raw_taken(&self, addr: usize) -> Option<(Arc<Slab>, usize)> {
        let slab = {
            let mut pins = self.raw.get_mut(&addr)?;
            // Zero: another release took the last pin and is about to remove the record.
            pins.count = pins.count.checked_sub(1)?;
            (pins.slab.clone(), pins.len)
        };
        // Unless a get gave the address out raw again meanwhile.
        self.raw.remove_if(&addr, |_, p| p.count == 0);
        Some(slab)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[test]
    fn a_pin_count_at_its_limit_panics_instead_of_carrying_into_the_flags() {
        let shared = Shared::new();
        let opts = Options {
            policy: vrange::Policy::Hybrid,
            ..Options::default()
        };
        // Pinned once by its creator; then as if 2^30 - 2 entries had been leaked.
        let slab = Slab::new(64 << 10, opts, false, &shared).unwrap();
        slab.state.store(HELD | (COUNT - 1), Relaxed);
        slab.pin().unwrap();
        assert_eq!(slab.state.load(Relaxed), HELD | COUNT);
        let more = catch_unwind(AssertUnwindSafe(|| slab.pin()));
        assert!(more.is_err(), "one pin too many must panic");
        assert_eq!(
            slab.state.load(Relaxed),
            HELD | COUNT,
            "the refused pin left the count and flags alone"
        );
        slab.state.store(HELD | 1, Relaxed);
        slab.unpin();
    }
}
