//! Blocks larger than a chunk: each its own mapping, a whole number of 2 MiB blocks (so a purge
//! frees its page tables and arming never splits a huge page). A freed large block stays mapped
//! as one volatile range in a small cache, reused by a later request it fits without much waste;
//! past [`CACHE_MAX`] blocks or [`CACHE_MAX_BYTES`] the oldest are unmapped.

use crate::chunk::CHUNK;
use crate::chunkmap::{self, Owner};
use crate::config::{self, MallocMode};
use std::ptr::null_mut;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use vrange::{Content, OwnedRange, Policy, Priority, Taken};
use vrange_sys::mem;
use vrange_sys::sync::SpinLock;

/// Freed large blocks kept for reuse.
const CACHE_MAX: usize = 16;
/// Address space of freed large blocks kept for reuse (they are volatile, so this bounds
/// address space and page tables, not memory: the reclaimer purges them under pressure).
const CACHE_MAX_BYTES: usize = 1 << 30;
/// Metadata records mapped at a time.
const META_BATCH: usize = 256;

/// A large block's metadata.
pub struct Large {
    base: usize,
    len: usize,
    /// The volatile range while the block is free in the cache (0: none).
    range: u32,
    /// Cache links (newest first), or the metadata free list's.
    next: *mut Large,
    prev: *mut Large,
    /// Freed (in the cache) or unused: not a live block.
    idle: AtomicBool,
}

struct Cache {
    newest: *mut Large,
    oldest: *mut Large,
    count: usize,
    bytes: usize,
    spare_meta: *mut Large,
    meta_left: usize,
    meta_batch: *mut Large,
}

struct Guarded {
    lock: SpinLock,
    cache: std::cell::UnsafeCell<Cache>,
}

// SAFETY: `cache` and every `Large` reachable from it are only touched with `lock` held.
unsafe impl Sync for Guarded {}

static CACHE: Guarded = Guarded {
    lock: SpinLock::new(),
    cache: std::cell::UnsafeCell::new(Cache {
        newest: null_mut(),
        oldest: null_mut(),
        count: 0,
        bytes: 0,
        spare_meta: null_mut(),
        meta_left: 0,
        meta_batch: null_mut(),
    }),
};

/// Counters of large blocks (chunk blocks are counted per arena).
pub static COUNTERS: crate::stats::Counters = crate::stats::Counters::new();

/// Runs `f` with the cache locked.
fn locked<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    let _held = CACHE.lock.lock();
    // SAFETY: the lock is held.
    f(unsafe { &mut *CACHE.cache.get() })
}

/// Allocates a block of at least `size` bytes. Returns its address and what its bytes hold.
pub fn alloc(size: usize) -> Option<(usize, Taken)> {
    let len = size.checked_add(CHUNK - 1)? & !(CHUNK - 1);
    let page_shift = vrange::page_size().trailing_zeros();
    let reused = locked(|c| {
        // Best fit among blocks no more than a quarter (and at least one chunk) too large.
        let slack = (len / 4).max(CHUNK);
        let mut best: *mut Large = null_mut();
        let mut l = c.newest;
        // SAFETY: cache members are valid metadata records, under the lock.
        while let Some(b) = unsafe { l.as_ref() } {
            // SAFETY: best is null or a cache member seen earlier in this walk.
            let better = unsafe { best.as_ref() }.is_none_or(|x| b.len < x.len);
            if b.len >= len && b.len - len <= slack && better {
                best = l;
            }
            l = b.next;
        }
        // SAFETY: best is a cache member (or null), under the lock.
        let b = unsafe { best.as_mut() }?;
        c.unlink(b);
        let taken = match std::mem::take(&mut b.range) {
            0 => Taken {
                pages: b.len >> page_shift,
                ..Taken::default()
            },
            // SAFETY: the id was stored by `free` from into_raw and is consumed once here.
            id => unsafe { OwnedRange::from_raw(id) }.take(),
        };
        Some((b.base, b.len, taken))
    });
    if let Some((base, len, taken)) = reused {
        COUNTERS.allocated(len, &taken);
        return Some((base, taken));
    }
    let base = mem::map_anon(len, CHUNK).ok()?;
    // Huge pages only where the block's bytes cover one whole: the partial last one would be
    // faulted in whole at the first touch of any of its bytes (a 2.1 MiB block would cost 4).
    let huge = match config::thp() {
        config::Thp::Never => 0,
        config::Thp::Auto | config::Thp::Always => size & !(CHUNK - 1),
    };
    if huge > 0 {
        let _ = mem::advise_huge(base.as_ptr(), huge, true);
    }
    if huge < len {
        // SAFETY: `huge` is a multiple of CHUNK below `len`, so inside the fresh mapping.
        let tail = unsafe { base.as_ptr().add(huge) };
        let _ = mem::advise_huge(tail, len - huge, false);
    }
    let base = base.as_ptr() as usize;
    let meta = locked(|c| c.new_meta());
    let Some(meta) = meta else {
        // SAFETY: the mapping was just made and never handed out.
        unsafe { unmap(base, len) };
        return None;
    };
    // SAFETY: a fresh record, not yet visible to anyone.
    unsafe {
        (*meta).base = base;
        (*meta).len = len;
        (*meta).idle.store(false, Relaxed);
    }
    if !chunkmap::set(base, len, Owner::Large(meta as usize)) {
        locked(|c| c.free_meta(meta));
        // SAFETY: as above.
        unsafe { unmap(base, len) };
        return None;
    }
    crate::stats::mapped(len as i64);
    let taken = Taken {
        pages: len >> page_shift,
        purged: len >> page_shift,
        zero: true,
    };
    COUNTERS.allocated(len, &taken);
    Some((base, taken))
}

/// # Safety
/// `[base, base + len)` is a large block's mapping that nothing uses any more.
unsafe fn unmap(base: usize, len: usize) {
    if let Some(p) = std::ptr::NonNull::new(base as *mut u8) {
        // SAFETY: forwarded from the caller.
        unsafe { mem::unmap(p, len) };
    }
}

/// Whether `addr` is the start of the live block `meta` describes (not freed).
///
/// # Safety
/// `meta` comes from the chunk map (records are never freed).
pub unsafe fn is_live(meta: *mut Large, addr: usize) -> bool {
    // SAFETY: records stay valid; a racing double free is the caller's bug either way.
    let b = unsafe { &*meta };
    b.base == addr && !b.idle.load(Relaxed)
}

/// The usable size of the live block `meta` describes.
///
/// # Safety
/// `meta` comes from the chunk map for a live block.
pub unsafe fn usable(meta: *mut Large) -> usize {
    // SAFETY: a live block's record does not change until it is freed.
    unsafe { (*meta).len }
}

/// Frees a large block into the cache.
///
/// # Safety
/// `meta` comes from the chunk map for a live block, freed once.
pub unsafe fn free(meta: *mut Large) {
    // SAFETY: the block is live until this call; the record is stable.
    let (base, len) = unsafe { ((*meta).base, (*meta).len) };
    let range =
        match config::mode() {
            MallocMode::Lazy => {
                // SAFETY: the owner just gave the block up.
                let _ = unsafe { mem::purge_lazy(base as *mut u8, len) };
                0
            }
            mode => {
                let policy = if mode == MallocMode::Hybrid {
                    Policy::Hybrid
                } else {
                    Policy::Managed
                };
                // SAFETY: the block is given up whole; it stays mapped while in the cache and
                // its range is taken (or retired) before the memory is reused or unmapped.
                unsafe { OwnedRange::new(base, len, policy, Priority::Normal, Content::Dirty) }
                    .map_or(0, |mut r| {
                        // Without THP the whole block is advised small (see `alloc`), so a purge
                        // may replace it, freeing its page tables on any kernel. With THP its
                        // advice is mixed; its huge part needs no page table anyway.
                        if config::thp() == config::Thp::Never {
                            r.set_thp_advice(false);
                        }
                        r.into_raw()
                    })
            }
        };
    COUNTERS.freed(len);
    // SAFETY: the record is ours until it joins the cache.
    locked(|c| c.push(unsafe { &mut *meta }, range));
    while let Some(old) = locked(Cache::evict) {
        // SAFETY: unlinked from the cache: this thread owns the record and its mapping.
        let (base, len, range) = unsafe { ((*old).base, (*old).len, (*old).range) };
        if range != 0 {
            // SAFETY: stored by this function from into_raw; consumed once.
            unsafe { OwnedRange::from_raw(range) }.retire();
        }
        chunkmap::clear(base, len);
        // SAFETY: the block is free, unregistered and out of the chunk map.
        unsafe { unmap(base, len) };
        crate::stats::mapped(-(len as i64));
        locked(|c| c.free_meta(old));
    }
}

impl Cache {
    fn push(&mut self, b: &mut Large, range: u32) {
        b.idle.store(true, Relaxed);
        b.range = range;
        self.bytes += b.len;
        b.prev = null_mut();
        b.next = self.newest;
        // SAFETY: cache members are valid records, under the lock.
        match unsafe { self.newest.as_mut() } {
            Some(n) => n.prev = b,
            None => self.oldest = b,
        }
        self.newest = b;
        self.count += 1;
    }

    fn unlink(&mut self, b: &mut Large) {
        // SAFETY: b and its neighbours are cache members, under the lock.
        unsafe {
            match b.prev.as_mut() {
                Some(p) => p.next = b.next,
                None => self.newest = b.next,
            }
            match b.next.as_mut() {
                Some(n) => n.prev = b.prev,
                None => self.oldest = b.prev,
            }
        }
        b.next = null_mut();
        b.prev = null_mut();
        b.idle.store(false, Relaxed);
        self.count -= 1;
        self.bytes -= b.len;
    }

    /// Unlinks the oldest block if the cache is over its limits.
    fn evict(&mut self) -> Option<*mut Large> {
        if self.count <= CACHE_MAX && self.bytes <= CACHE_MAX_BYTES {
            return None;
        }
        let old = self.oldest;
        // SAFETY: the oldest member is valid (the cache is not empty), under the lock.
        self.unlink(unsafe { &mut *old });
        Some(old)
    }

    fn new_meta(&mut self) -> Option<*mut Large> {
        if let Some(m) = std::ptr::NonNull::new(self.spare_meta) {
            // SAFETY: spare records are valid and owned by the free list, under the lock.
            self.spare_meta = unsafe { m.as_ref().next };
            return Some(m.as_ptr());
        }
        if self.meta_left == 0 {
            let page = mem::page_size();
            let bytes = (META_BATCH * std::mem::size_of::<Large>()).div_ceil(page) * page;
            self.meta_batch = mem::map_anon(bytes, page).ok()?.as_ptr().cast();
            self.meta_left = META_BATCH;
        }
        let m = self.meta_batch;
        // SAFETY: within the batch mapped above (meta_left records remain).
        self.meta_batch = unsafe { m.add(1) };
        self.meta_left -= 1;
        Some(m)
    }

    fn free_meta(&mut self, m: *mut Large) {
        // SAFETY: the record is unused; it joins the free list under the lock.
        unsafe {
            (*m).range = 0;
            (*m).idle.store(true, Relaxed);
            (*m).next = self.spare_meta;
        }
        self.spare_meta = m;
    }
}

/// Takes the cache lock (before `fork`).
pub fn lock() {
    CACHE.lock.lock_for_fork();
}

/// Releases it (after `fork`).
///
/// # Safety
/// Only in a fork handler after [`lock`].
pub unsafe fn unlock() {
    // SAFETY: taken by lock(), with no live guard.
    unsafe { CACHE.lock.force_unlock() };
}
