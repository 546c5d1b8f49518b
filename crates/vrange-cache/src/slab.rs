//! A slab: one vrange region holding the values of one or more entries, purged whole. It never
//! reuses space, so bytes once written stay what they were while the slab is mapped.
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
//! never spared a purge it should get.
//!
//! While `HELD`, the slab holds a reference to itself (`Inner::me`): a pin keeps it alive,
//! so an `Entry` needs no reference count of its own, and a hit makes two atomic operations
//! on the slab, not four.

use crate::counters::Shared;
use parking_lot::Mutex;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use std::sync::{Arc, Weak};
use vrange::{Options, Priority, VolatileRegion};

/// The slab's content is gone (the system purged it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Purged;

const HELD: u32 = 1 << 31;
const QUEUED: u32 = 1 << 30;
const COUNT: u32 = QUEUED - 1;

#[derive(Debug)]
struct Inner {
    /// The region; `None` once dead (unmapped: no one can hold a pin on a dead slab).
    region: Option<VolatileRegion>,
    /// The slab's reference to itself while `HELD`.
    me: Option<Arc<Slab>>,
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
    /// Entries (in the map or being written) whose values lie here, and their bytes.
    live: AtomicUsize,
    live_bytes: AtomicUsize,
    pub priority: Priority,
    shared: Arc<Shared>,
    me: Weak<Slab>,
}

impl Slab {
    /// A new slab of at least `len` bytes, pinned once for its creator.
    pub fn new(len: usize, opts: Options, shared: &Arc<Shared>) -> vrange::Result<Arc<Slab>> {
        let region = VolatileRegion::new(len, opts)?;
        shared.slab_created(opts.priority, region.len());
        let slab = Arc::new_cyclic(|me| Slab {
            start: region.as_ptr() as usize,
            len: region.len(),
            state: AtomicU32::new(HELD | 1),
            touched: AtomicUsize::new(0),
            inner: Mutex::new(Inner {
                region: Some(region),
                me: None,
            }),
            dead: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            live_bytes: AtomicUsize::new(0),
            priority: opts.priority,
            shared: shared.clone(),
            me: me.clone(),
        });
        slab.inner.lock().me = Some(slab.clone());
        Ok(slab)
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
            self.shared.touched(self.priority, end - before);
        }
    }

    /// Whether a reader (or an insert in progress) holds a pin on the slab now.
    pub fn pinned_now(&self) -> bool {
        self.state.load(Relaxed) & COUNT != 0
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Acquire)
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
            let Some(r) = inner.region.as_ref() else {
                return Err(Purged);
            };
            // A slab is never split and unmark only fails for memory vrange does not own.
            if r.unmark().unwrap_or_default().was_purged() {
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
        if let Some(r) = inner.region.as_ref() {
            // SAFETY: the count was zero and HELD is now clear, so a reader must take the
            // slow path, which waits for this lock: no reference into the region is live.
            let _ = unsafe { r.mark() };
        }
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
            .filter(|_| self.state.load(Acquire) == 0)
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
    /// from now on). Called with the region's lock held.
    fn die(&self, inner: &mut Inner) {
        inner.region = None;
        if !self.dead.swap(true, AcqRel) {
            self.shared.slab_died(
                self.priority,
                self.len(),
                self.touched(),
                self.live.load(Relaxed),
                self.live_bytes.load(Relaxed),
            );
        }
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
            self.shared.tombstone_gone();
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
                .slab_freed(self.priority, self.len(), self.touched());
        }
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
        let slab = Slab::new(64 << 10, opts, &shared).unwrap(); // pinned once by its creator
                                                                // As if 2^30 - 2 entries had been leaked.
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
