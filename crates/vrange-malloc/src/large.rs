//! Blocks larger than a chunk: each its own mapping, a whole number of 2 MiB blocks (so a purge
//! frees its page tables and arming never splits a huge page). A freed large block stays mapped
//! as one volatile range in a small cache. A request takes the smallest cached block it fits,
//! split when much larger (the tail stays cached); when none fits, the largest cached block is
//! moved and grown (mremap: its pages move with their page tables, only the added bytes fault
//! in); a new mapping only when the cache is empty. So memory already faulted in is reused
//! before fresh pages are zeroed.
//!
//! What the cache holds is bounded as glibc's heap is: 64 MiB ([`CACHE_MAX_BYTES`], glibc's
//! largest trim threshold) plus what the live large blocks have shrunk by since their peak (the
//! free space glibc keeps below its top while blocks above it live), the peak decaying at each
//! reclaimer tick; at most [`CACHE_MAX`] blocks; a block over 64 MiB is unmapped at its free.
//! So a program's resident memory stays within its large blocks' peak plus 64 MiB, and within
//! 64 MiB of what they use once the peak has decayed (about a second).

use crate::chunk::CHUNK;
use crate::chunkmap::{self, Owner};
use crate::config::{self, MallocMode};
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use vrange::{Content, OwnedRange, Policy, Priority, Taken};
use vrange_sys::lock::{Lock, Rank};
use vrange_sys::mem;

/// Freed large blocks kept for reuse.
const CACHE_MAX: usize = 16;
/// Bytes of freed large blocks kept for reuse beyond what the program's large blocks have
/// shrunk by since their peak: 64 MiB, the most glibc keeps free at the top of its heap (its
/// trim threshold, which it raises to twice the largest block freed, up to twice its largest
/// mmap threshold of 32 MiB). Also the largest block kept: glibc maps blocks over 32 MiB on
/// their own and unmaps them at free.
const CACHE_MAX_BYTES: usize = 64 << 20;
/// Each reclaimer tick moves the peak this fraction of the way down to the live bytes (so what
/// the cache keeps past 64 MiB halves in about half a second at the default 100 ms tick).
const PEAK_DECAY: usize = 8;

/// Bytes of live large blocks.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Their peak, which decays toward them at each reclaimer tick.
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// A large block of `len` bytes was handed out.
fn note_alloc(len: usize) {
    let live = LIVE.fetch_add(len, Relaxed) + len;
    PEAK.fetch_max(live, Relaxed);
}

/// A large block of `len` bytes was freed.
fn note_free(len: usize) {
    LIVE.fetch_sub(len, Relaxed);
}

/// At each reclaimer tick (and before each purge): the peak decays toward the live bytes and
/// the blocks the cache then holds past its limit are unmapped. (A block handed out meanwhile
/// may raise the peak again; the store may lose that rise, which only makes the cache keep
/// less.)
fn decay() {
    let live = LIVE.load(Relaxed);
    let peak = PEAK.load(Relaxed).max(live);
    PEAK.store(peak - (peak - live) / PEAK_DECAY, Relaxed);
    evict_over(cache_limit());
}

/// Registers [`decay`] with the reclaimer, once.
pub fn register() {
    static HOOK: vrange_sys::lock::ForkOnce<vrange::reclaimer::FlushHook> =
        vrange_sys::lock::ForkOnce::new();
    HOOK.get_or_init(|| vrange::reclaimer::on_flush(decay));
}

/// Bytes the cache may hold: what glibc would hold free below its heap's top (the live
/// blocks' shortfall from their decaying peak) and at its top ([`CACHE_MAX_BYTES`]).
fn cache_limit() -> usize {
    let (live, peak) = (LIVE.load(Relaxed), PEAK.load(Relaxed));
    CACHE_MAX_BYTES.saturating_add(peak.saturating_sub(live))
}

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
    lock: Lock,
    cache: std::cell::UnsafeCell<Cache>,
}

// SAFETY: `cache` and every `Large` reachable from it are only touched with `lock` held.
unsafe impl Sync for Guarded {}

static CACHE: Guarded = Guarded {
    lock: Lock::new(Rank::MallocLarge),
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
///
/// From the cache first: the smallest block the request fits (split if much larger), else the
/// largest block, moved and grown to the request's size (its pages move with their page tables,
/// and only the added bytes fault in fresh); a new mapping only when the cache is empty.
pub fn alloc(size: usize) -> Option<(usize, Taken)> {
    let len = size.checked_add(CHUNK - 1)? & !(CHUNK - 1);
    let page_shift = vrange::page_size().trailing_zeros();
    if let Some((b, taken)) = locked(|c| c.take(len)) {
        // SAFETY: unlinked from the cache and not yet handed out: this thread owns the record.
        let block = unsafe { &mut *b };
        let old = block.len;
        // A block more than a quarter (and at least one chunk) too large is split; a record
        // for its tail that cannot be had leaves the block whole.
        if old >= len && old - len > (len / 4).max(CHUNK) {
            split(block, len);
        }
        if old >= len || grow(block, len, size) {
            let pages = block.len >> page_shift;
            let added = (block.len - old.min(block.len)) >> page_shift;
            let taken = Taken {
                pages,
                purged: (taken.purged + added).min(pages),
                zero: taken.zero,
            };
            COUNTERS.allocated(block.len, &taken);
            note_alloc(block.len);
            return Some((block.base, taken));
        }
    }
    let base = mem::map_anon(len, CHUNK).ok()?;
    advise(base.as_ptr(), len, size);
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
    note_alloc(len);
    Some((base, taken))
}

/// Asks for huge pages only where a block of `len` bytes at `base`, serving `size`, covers one
/// whole: the partial last one would be faulted in whole at the first touch of any of its
/// bytes (a 2.1 MiB block would cost 4).
fn advise(base: *mut u8, len: usize, size: usize) {
    let huge = match config::thp() {
        config::Thp::Never => 0,
        config::Thp::Auto | config::Thp::Always => size & !(CHUNK - 1),
    };
    // Advice failure only costs performance.
    if huge > 0 {
        let _ = mem::advise_huge(base, huge, true);
    }
    if huge < len {
        let _ = mem::advise_huge(base.wrapping_add(huge), len - huge, false);
    }
}

/// Moves `block` (the caller's, out of the cache, shorter than `len`) to a new address and
/// grows it to `len` bytes for a request of `size`. False if the move failed: the block is back
/// in the cache.
fn grow(block: &mut Large, len: usize, size: usize) -> bool {
    let (base, old) = (block.base, block.len);
    let moved = NonNull::new(base as *mut u8).and_then(|p| {
        // SAFETY: the block is the caller's, unused, with its range taken; the allocator maps
        // large blocks privately and never registers them with userfaultfd.
        unsafe { mem::move_grow(p, old, len, CHUNK) }.ok()
    });
    let Some(moved) = moved else {
        // SAFETY: the block is not live and not in the cache.
        unsafe { keep(block) };
        return false;
    };
    advise(moved.as_ptr(), len, size);
    let new_base = moved.as_ptr() as usize;
    chunkmap::clear(base, old);
    block.base = new_base;
    block.len = len;
    crate::stats::mapped((len - old) as i64);
    if !chunkmap::set(new_base, len, Owner::Large(block as *mut Large as usize)) {
        // No leaf for the new address: the block cannot be found by free, so it goes.
        // SAFETY: the block is not live, not in the cache, and out of the chunk map.
        unsafe { release(block) };
        return false;
    }
    true
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
    let len = unsafe { (*meta).len };
    COUNTERS.freed(len);
    note_free(len);
    // SAFETY: forwarded: the caller gives the block up.
    unsafe { keep(meta) };
}

/// Splits `block` after its first `len` bytes (a multiple of CHUNK below its length): the tail
/// becomes a block of its own in the cache. Without a record for the tail the block stays whole.
fn split(block: &mut Large, len: usize) {
    let Some(tail) = locked(Cache::new_meta) else {
        return;
    };
    let (base, tail_len) = (block.base + len, block.len - len);
    // SAFETY: a fresh record, not yet visible to anyone.
    unsafe {
        (*tail).base = base;
        (*tail).len = tail_len;
        (*tail).range = 0;
        (*tail).idle.store(false, Relaxed);
    }
    // The tail's entries name `block` today, so their leaves exist and this cannot fail; if it
    // did, the entries set are put back and the block stays whole.
    if !chunkmap::set(base, tail_len, Owner::Large(tail as usize)) {
        chunkmap::set(base, tail_len, Owner::Large(block as *mut Large as usize));
        locked(|c| c.free_meta(tail));
        return;
    }
    block.len = len;
    // SAFETY: the tail is a block nobody uses, with its own record in the chunk map.
    unsafe { keep(tail) };
}

/// Puts a block nobody uses into the cache as one volatile range (or unmaps it, if it is larger
/// than the cache may hold), then unmaps the oldest blocks while the cache is over its limits.
///
/// # Safety
/// `meta` is a block's record in the chunk map; the block is not live and not in the cache.
unsafe fn keep(meta: *mut Large) {
    // SAFETY: the record is stable while the caller owns the block.
    let (base, len) = unsafe { ((*meta).base, (*meta).len) };
    if len > CACHE_MAX_BYTES {
        // SAFETY: forwarded.
        unsafe { release(meta) };
        return;
    }
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
    // SAFETY: the record is ours until it joins the cache.
    locked(|c| c.push(unsafe { &mut *meta }, range));
    evict_over(cache_limit());
}

/// Unmaps the oldest blocks while the cache is over its limits.
fn evict_over(limit: usize) {
    while let Some(old) = locked(|c| c.evict(limit)) {
        // SAFETY: unlinked from the cache: this thread owns the record and its mapping.
        unsafe { release(old) };
    }
}

/// Unmaps a block nobody uses and recycles its record.
///
/// # Safety
/// `meta` is a block's record in the chunk map; the block is not live and not in the cache.
unsafe fn release(meta: *mut Large) {
    // SAFETY: the caller owns the record.
    let (base, len, range) = unsafe { ((*meta).base, (*meta).len, (*meta).range) };
    if range != 0 {
        // SAFETY: stored by `keep` from into_raw; consumed once.
        unsafe { OwnedRange::from_raw(range) }.retire();
    }
    chunkmap::clear(base, len);
    // SAFETY: the block is free, unregistered and out of the chunk map.
    unsafe { unmap(base, len) };
    crate::stats::mapped(-(len as i64));
    locked(|c| c.free_meta(meta));
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

    /// Unlinks the block a request of `len` bytes takes (the smallest it fits, else the
    /// largest) and takes its range back.
    fn take(&mut self, len: usize) -> Option<(*mut Large, Taken)> {
        let mut fits: *mut Large = null_mut();
        let mut largest: *mut Large = null_mut();
        let mut l = self.newest;
        // SAFETY: cache members are valid metadata records, under the lock.
        while let Some(b) = unsafe { l.as_ref() } {
            // SAFETY: both are null or cache members seen earlier in this walk.
            let (f, g) = unsafe { (fits.as_ref(), largest.as_ref()) };
            if b.len >= len && f.is_none_or(|x| b.len < x.len) {
                fits = l;
            }
            if g.is_none_or(|x| b.len > x.len) {
                largest = l;
            }
            l = b.next;
        }
        let pick = if fits.is_null() { largest } else { fits };
        // SAFETY: a cache member (or null), under the lock.
        let b = unsafe { pick.as_mut() }?;
        self.unlink(b);
        let taken = match std::mem::take(&mut b.range) {
            0 => Taken {
                pages: b.len >> vrange::page_size().trailing_zeros(),
                ..Taken::default()
            },
            // SAFETY: the id was stored by `keep` from into_raw and is consumed once here.
            id => unsafe { OwnedRange::from_raw(id) }.take(),
        };
        Some((pick, taken))
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
    fn evict(&mut self, limit: usize) -> Option<*mut Large> {
        if self.count <= CACHE_MAX && self.bytes <= limit {
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
