//! A slab: one vrange region holding the values of one or more entries, purged whole. It is
//! pinned while any reader or writer holds it and volatile otherwise; it never reuses space, so
//! bytes once written stay what they were until the slab is dropped.
//!
//! Pinning counts holders in `pins`. Only the thread holding the region's lock moves the count away from
//! zero (and unmarks the region first) or, seeing it at zero, marks the region volatile; a
//! count above zero is raised without the lock. So the region is pinned whenever `pins > 0`,
//! and a reader never sees it purged under it.

use crate::counters::Shared;
use parking_lot::Mutex;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use std::sync::Arc;
use vrange::{Options, Priority, VolatileRegion};

/// The slab's content is gone (the system purged it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Purged;

#[derive(Debug)]
pub(crate) struct Slab {
    start: usize,
    len: usize,
    pins: AtomicU32,
    /// Pins held by values given out raw (`Entry::into_raw`), to refuse a double release.
    pub raw: AtomicU32,
    /// The region; `None` once dead (unmapped: no one can hold a pin on a dead slab).
    region: Mutex<Option<VolatileRegion>>,
    dead: AtomicBool,
    /// Entries (in the map or being written) whose values lie here, and their bytes.
    live: AtomicUsize,
    live_bytes: AtomicUsize,
    pub priority: Priority,
    shared: Arc<Shared>,
}

impl Slab {
    /// A new slab of at least `len` bytes, pinned once for its creator.
    pub fn new(len: usize, opts: Options, shared: &Arc<Shared>) -> vrange::Result<Arc<Slab>> {
        let region = VolatileRegion::new(len, opts)?;
        shared.slab_created(opts.priority, region.len());
        Ok(Arc::new(Slab {
            start: region.as_ptr() as usize,
            len: region.len(),
            pins: AtomicU32::new(1),
            raw: AtomicU32::new(0),
            region: Mutex::new(Some(region)),
            dead: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            live_bytes: AtomicUsize::new(0),
            priority: opts.priority,
            shared: shared.clone(),
        }))
    }

    pub fn start(&self) -> usize {
        self.start
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Acquire)
    }

    pub fn live_bytes(&self) -> usize {
        self.live_bytes.load(Relaxed)
    }

    /// Whether no one holds it pinned (a candidate for a purge of the cache's own budget).
    pub fn unpinned(&self) -> bool {
        self.pins.load(Relaxed) == 0
    }

    /// How long it has been volatile (`None` while pinned or purged).
    pub fn idle(&self) -> Option<std::time::Duration> {
        self.region.lock().as_ref()?.idle()
    }

    /// Pins the slab; `Err(Purged)` if its content is gone (it is then dead for good).
    pub fn pin(&self) -> Result<(), Purged> {
        let mut p = self.pins.load(Relaxed);
        while p != 0 {
            match self.pins.compare_exchange_weak(p, p + 1, Acquire, Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => p = now,
            }
        }
        let mut region = self.region.lock();
        let Some(r) = region.as_ref() else {
            return Err(Purged);
        };
        if self.pins.load(Acquire) == 0 {
            // A slab is never split and unmark only fails for memory vrange does not own.
            let report = r.unmark().unwrap_or_default();
            if report.was_purged() {
                self.die(&mut region);
                return Err(Purged);
            }
        }
        self.pins.fetch_add(1, AcqRel);
        Ok(())
    }

    /// Drops one pin; the last makes the slab volatile again.
    pub fn unpin(&self) {
        if self.pins.fetch_sub(1, AcqRel) != 1 {
            return;
        }
        let region = self.region.lock();
        if let Some(r) = region.as_ref().filter(|_| self.pins.load(Acquire) == 0) {
            // SAFETY: no holder is left (`pins` is zero and only the holder of the region's
            // lock, which this thread is, can raise it from zero), so no reference into the
            // region is live.
            let _ = unsafe { r.mark() };
        }
    }

    /// Marks the slab dead if the reclaimer purged it while no one held it. Returns whether it
    /// did (the caller's sweep found a purge nobody had looked up yet).
    pub fn check_purged(&self) -> bool {
        if self.is_dead() || self.pins.load(Relaxed) != 0 {
            return false;
        }
        let mut region = self.region.lock();
        match region.as_ref() {
            Some(r) if self.pins.load(Acquire) == 0 && r.is_purged() => {
                self.die(&mut region);
                true
            }
            _ => false,
        }
    }

    /// Purges the slab now if no one holds it (the cache's own budget). Returns bytes freed.
    pub fn purge_now(&self) -> usize {
        let mut region = self.region.lock();
        let Some(r) = region.as_ref().filter(|_| self.pins.load(Acquire) == 0) else {
            return 0;
        };
        let freed = r.purge().unwrap_or(0);
        if freed > 0 {
            self.die(&mut region);
        }
        freed
    }

    /// The content is gone: unmaps the region (no one holds a pin, and no one can take one
    /// from now on). Called with the region's lock held.
    fn die(&self, region: &mut Option<VolatileRegion>) {
        *region = None;
        if !self.dead.swap(true, AcqRel) {
            self.shared.slab_died(
                self.priority,
                self.len(),
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
        let _g = self.region.lock();
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

impl Drop for Slab {
    fn drop(&mut self) {
        if !self.dead.load(Relaxed) {
            self.shared.slab_freed(self.priority, self.len());
        }
    }
}
