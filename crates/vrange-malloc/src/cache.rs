//! A per-CPU cache of the blocks freed last: the hot path of a program that frees and
//! allocates blocks of the same size in a loop, at the cost of an atomic or two.
//!
//! A freed block of at most [`MAX_BLOCK`] goes into a slot of its CPU's cache (a
//! compare-and-swap of one word holding its address and page count), without touching its
//! chunk, its arena's lock or the core's ranges; an allocation of the same page count on that
//! CPU takes it back the same way. A cached block is **not volatile**: it is the bounded,
//! documented amount of free memory vrange-malloc keeps resident outside the reclaimer's
//! reach, at most [`SLOTS`] blocks of at most [`MAX_BLOCK`] per CPU (8 MiB), and for at most
//! one reclaimer tick (`VRANGE_POLL_MS`, 100 ms): every tick, and before every purge, the
//! reclaimer's flush hook frees each cached block for real (then it is volatile like any free
//! span). A free that finds its CPU's slots taken frees for real at once.
//!
//! Double frees stay caught: caching a block sets a `CACHED` bit in its chunk tag (a plain
//! load and store; see [`Chunk::mark_cached`]), and a second free of it finds the bit set. Only hybrid and managed modes cache
//! (lazy mode has no reclaimer to flush the cache, and its frees must reach the kernel).
//!
//! Written by hand (no crate): it runs inside malloc and free, where nothing may allocate or
//! take a lock.

use crate::arena;
use crate::chunk::{Chunk, CHUNK};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicU64, AtomicUsize};

/// Blocks cached per CPU.
pub const SLOTS: usize = 4;
/// The largest block cached.
pub const MAX_BLOCK: usize = CHUNK;

#[repr(align(128))]
struct CpuCache {
    /// `address | pages` of a cached block (pages < the page size, addresses page-aligned);
    /// 0: empty.
    slots: [AtomicUsize; SLOTS],
    /// Allocations served from the cache, and their bytes; frees taken into it.
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    puts: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // a template for the static array below
const EMPTY: CpuCache = CpuCache {
    slots: [const { AtomicUsize::new(0) }; SLOTS],
    hits: AtomicU64::new(0),
    hit_bytes: AtomicU64::new(0),
    puts: AtomicU64::new(0),
};

static CACHES: [CpuCache; arena::MAX_ARENAS] = [EMPTY; arena::MAX_ARENAS];
/// Cached blocks freed for real by [`flush`] (the arena counts those frees again).
static FLUSHED: AtomicU64 = AtomicU64::new(0);

fn home() -> &'static CpuCache {
    let n = arena::count();
    let cpu = vrange_sys::process::current_cpu().unwrap_or(0);
    // One arena per CPU is the rule: a division here cost a tenth of the pair.
    &CACHES[if cpu < n { cpu } else { cpu % n }]
}

/// Adds to a statistics counter without a locked instruction. A thread preempted between the
/// load and the store may lose another's update on the same CPU's cache: the counters are for
/// reports, and a locked add per counter cost a fifth of the malloc+free pair.
#[inline]
fn bump(counter: &AtomicU64, by: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(by), Relaxed);
}

/// Takes a cached block of exactly `pages` pages from this CPU's cache: its address.
#[inline]
pub fn take(pages: usize) -> Option<usize> {
    let cache = home();
    for slot in &cache.slots {
        let v = slot.load(Relaxed);
        if v != 0
            && v & (vrange::page_size() - 1) == pages
            && slot.compare_exchange(v, 0, Acquire, Relaxed).is_ok()
        {
            let addr = v & !(vrange::page_size() - 1);
            uncache(addr);
            bump(&cache.hits, 1);
            bump(&cache.hit_bytes, (pages * vrange::page_size()) as u64);
            return Some(addr);
        }
    }
    None
}

/// Offers a block just marked cached (see [`Chunk::mark_cached`]) to this CPU's cache; `false`
/// when every slot is taken (the caller frees it for real).
#[inline]
pub fn put(addr: usize, pages: usize) -> bool {
    let cache = home();
    let v = addr | pages;
    for slot in &cache.slots {
        if slot.load(Relaxed) == 0 && slot.compare_exchange(0, v, AcqRel, Relaxed).is_ok() {
            bump(&cache.puts, 1);
            return true;
        }
    }
    false
}

/// Clears the cached mark of the block at `addr` (it leaves the cache).
fn uncache(addr: usize) {
    if let Some(crate::chunkmap::Owner::Chunk(c)) = crate::chunkmap::get(addr) {
        // SAFETY: chunk metadata is never freed; a cached block is a live block of its chunk.
        unsafe { &*(c as *const Chunk) }.clear_cached(addr);
    }
}

/// Frees every cached block for real (the reclaimer's flush hook). Any thread.
pub fn flush() {
    for cache in &CACHES[..arena::count()] {
        for slot in &cache.slots {
            let v = slot.swap(0, AcqRel);
            if v == 0 {
                continue;
            }
            let addr = v & !(vrange::page_size() - 1);
            if let Some(crate::chunkmap::Owner::Chunk(c)) = crate::chunkmap::get(addr) {
                // SAFETY: chunk metadata is never freed; the block is live, cached once, and
                // just left the cache: this is its one real free.
                unsafe {
                    (*(c as *const Chunk)).clear_cached(addr);
                    arena::free(c as *mut Chunk, addr);
                }
                FLUSHED.fetch_add(1, Relaxed);
            }
        }
    }
}

/// Bytes cached now (counted as free, not volatile, in the statistics).
pub fn bytes() -> u64 {
    let page = vrange::page_size();
    CACHES[..arena::count()]
        .iter()
        .flat_map(|c| c.slots.iter())
        .map(|s| ((s.load(Relaxed) & (page - 1)) * page) as u64)
        .sum()
}

/// Adds the cache's counters to the allocator's: allocations it served (intact memory, no
/// fault) and frees it took; its blocks are free, not live.
pub fn add_to(s: &mut vrange::AllocatorStats) {
    for c in &CACHES[..arena::count()] {
        s.allocations += c.hits.load(Relaxed);
        s.reused_intact_bytes += c.hit_bytes.load(Relaxed);
        s.frees += c.puts.load(Relaxed);
    }
    s.frees = s.frees.saturating_sub(FLUSHED.load(Relaxed));
    s.allocated_bytes = s.allocated_bytes.saturating_sub(bytes());
}

/// Registers the flush with the reclaimer, once.
pub fn register() {
    static HOOK: vrange_sys::lock::ForkOnce<vrange::reclaimer::FlushHook> =
        vrange_sys::lock::ForkOnce::new();
    HOOK.get_or_init(|| vrange::reclaimer::on_flush(flush));
}
