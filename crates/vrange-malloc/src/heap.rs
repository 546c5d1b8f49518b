//! The allocator's entry points, shared by the `#[global_allocator]` type and the LD_PRELOAD
//! shim: they serve requests at or above the threshold and say "not mine" (`None`, `false`)
//! for everything else, which the caller sends to the system allocator.

use crate::chunk::{Chunk, CHUNK};
use crate::chunkmap::{self, Owner};
use crate::config::{self, MallocMode};
use crate::large::{self, Large};
use crate::{arena, cache, stats};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU8};
use vrange_sys::process;

/// A block handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub ptr: NonNull<u8>,
    /// Every byte reads as zero (fresh or purged memory): `calloc` need not clear it.
    pub zeroed: bool,
}

/// 0: not set up, 1: setting up, 2: ready.
static READY: AtomicU8 = AtomicU8::new(0);
/// Whether the summary at exit is prepared (`VRANGE_MALLOC_STATS`).
static SUMMARY: AtomicBool = AtomicBool::new(false);

/// Reads the settings (the allocator's and the core's: a malformed one is reported now), once,
/// and with `VRANGE_MALLOC_STATS` prepares the summary at exit: what the shim does at load, so
/// that the threshold and the mode apply from the first request. Nothing is registered with
/// vrange here: that waits for the first request the allocator serves ([`init`]), so a
/// program that makes none (most small programs: their blocks are smaller than the threshold)
/// starts nothing of vrange's.
pub fn read_settings() {
    config::init();
    if config::stats_at_exit() && !SUMMARY.swap(true, AcqRel) {
        stats::keep_stderr();
        let _ = process::at_exit(at_exit);
    }
}

/// Sets the allocator up, once: the settings, and its hooks in vrange (statistics, the flush
/// of its caches). Called by every allocation at or above the default threshold; one load
/// after the first.
#[inline]
pub fn init() {
    if READY.load(Acquire) != 2 {
        set_up();
    }
}

#[cold]
fn set_up() {
    if READY.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
        // Another thread is setting up; the settings it reads apply from then on.
        return;
    }
    read_settings();
    vrange::register_allocator(report);
    if caching() {
        cache::register();
    }
    large::register();
    READY.store(2, Release);
}

extern "C" fn at_exit() {
    stats::print_summary();
}

/// The allocator's counters now: every arena's, the large blocks', the cache's. Exact when no
/// thread allocates or frees meanwhile.
pub fn report() -> vrange::AllocatorStats {
    let mut s = vrange::AllocatorStats::default();
    for a in &arena::ARENAS[..arena::count()] {
        a.counters.add_to(&mut s);
    }
    large::COUNTERS.add_to(&mut s);
    cache::add_to(&mut s);
    s.mapped_bytes = stats::mapped_bytes();
    s.free_bytes = s.mapped_bytes.saturating_sub(s.allocated_bytes);
    s
}

/// Whether a request of `size` bytes aligned to `align` is the allocator's to serve.
#[inline]
pub fn serves(size: usize, align: usize) -> bool {
    size >= config::threshold() && align <= CHUNK && config::mode() != MallocMode::Off
}

/// Whether a request of `size` bytes may be the allocator's: false below the threshold (one
/// load and one comparison), where [`alloc`] declines at once.
#[inline]
pub fn may_serve(size: usize) -> bool {
    size >= config::threshold()
}

/// Allocates `size` bytes aligned to `align` (a power of two), or `None` when the request is
/// not the allocator's (see [`serves`]) or memory is exhausted.
///
/// Inlined into the shim's `malloc` so that a request below the threshold, most of a
/// program's, is declined with one load and one comparison, before any register is saved for
/// the rest. (Before the settings are read, the threshold is its default: a request declined
/// then goes to the system allocator, which is always right.)
#[inline]
pub fn alloc(size: usize, align: usize) -> Option<Block> {
    if !may_serve(size) {
        return None;
    }
    alloc_at_threshold(size, align)
}

#[inline(never)]
fn alloc_at_threshold(size: usize, align: usize) -> Option<Block> {
    // May wait for an arena's lock (its tries assert no order): debug builds assert here that
    // no higher lock is held, whichever path the request takes.
    vrange_sys::lock::Witness::check_may_wait(vrange_sys::lock::Rank::MallocArena);
    init();
    if !serves(size, align) {
        return None;
    }
    let page = vrange::page_size();
    let pages = size.checked_add(page - 1)? / page;
    if align <= page && pages * page <= cache::MAX_BLOCK && caching() {
        if let Some(addr) = cache::take(pages) {
            return Some(Block {
                ptr: NonNull::new(addr as *mut u8)?,
                zeroed: false,
            });
        }
    }
    let (addr, taken) = if pages > CHUNK / page {
        large::alloc(size)?
    } else {
        arena::alloc(pages, (align / page).max(1))?
    };
    Some(Block {
        ptr: NonNull::new(addr as *mut u8)?,
        zeroed: taken.zero,
    })
}

/// Whether `ptr` is a live block of this allocator (or inside memory it maps). Lock-free.
#[inline]
pub fn owns(ptr: *const u8) -> bool {
    chunkmap::get(ptr as usize).is_some()
}

/// Frees `ptr` if it is the allocator's; `false` (nothing done) otherwise. A pointer into the
/// allocator's memory that is not a live block (a double free, an interior pointer) aborts the
/// process with a message, as glibc does, rather than corrupt the heap.
///
/// # Safety
/// If the allocator's, `ptr` must be a live block it handed out, freed once.
#[inline]
pub unsafe fn free(ptr: *mut u8) -> bool {
    let addr = ptr as usize;
    match chunkmap::get(addr) {
        None => false,
        // SAFETY: forwarded.
        Some(owner) => unsafe { free_owned(addr, owner) },
    }
}

/// Frees the allocator's `addr`, whose 2 MiB block `owner` owns. Out of line, so that `free`
/// of a system allocator's pointer is a table lookup and nothing more.
///
/// # Safety
/// As [`free`].
#[inline(never)]
unsafe fn free_owned(addr: usize, owner: Owner) -> bool {
    // As in `alloc_at_threshold`.
    vrange_sys::lock::Witness::check_may_wait(vrange_sys::lock::Rank::MallocArena);
    match owner {
        Owner::Chunk(c) => {
            // SAFETY: chunk metadata is never freed; a live block's tags are stable.
            let chunk = unsafe { &*(c as *const Chunk) };
            let Some(pages) = chunk.block_pages(addr) else {
                invalid_free();
            };
            if caching() {
                // Marked first, so that a second free of a cached block is caught.
                if !chunk.mark_cached(addr) {
                    invalid_free();
                }
                if pages * vrange::page_size() <= cache::MAX_BLOCK && cache::put(addr, pages) {
                    return true;
                }
                chunk.clear_cached(addr);
            }
            // SAFETY: forwarded: a live block of this chunk.
            unsafe { arena::free(c as *mut Chunk, addr) };
            // Outside every allocator lock: see `vrange::reclaimer::catch_up`.
            vrange::reclaimer::catch_up();
            true
        }
        Owner::Large(m) => {
            // SAFETY: the chunk map names a large block's record, which is never freed.
            if !unsafe { large::is_live(m as *mut Large, addr) } {
                invalid_free();
            }
            // SAFETY: forwarded: a live large block.
            unsafe { large::free(m as *mut Large) };
            vrange::reclaimer::catch_up();
            true
        }
    }
}

/// Whether freed blocks go through the per-CPU cache: in the modes with a reclaimer to flush it.
#[inline]
fn caching() -> bool {
    matches!(config::mode(), MallocMode::Hybrid | MallocMode::Managed)
}

#[cold]
fn invalid_free() -> ! {
    let msg = b"vrange-malloc: free(): invalid pointer (double free or not a block start)\n";
    // SAFETY: writes a static message to fd 2, then ends the process.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::abort()
    }
}

/// The usable size of a live block of the allocator (`None`: not the allocator's).
pub fn usable_size(ptr: *const u8) -> Option<usize> {
    let addr = ptr as usize;
    match chunkmap::get(addr)? {
        Owner::Chunk(c) => {
            // SAFETY: chunk metadata is never freed; a live block's tags are stable.
            let pages = unsafe { &*(c as *const Chunk) }.block_pages(addr)?;
            Some(pages * vrange::page_size())
        }
        // SAFETY: the chunk map names a live block's record.
        Owner::Large(m) => Some(unsafe { large::usable(m as *mut Large) }),
    }
}

/// Resizes a live block of the allocator in place if it can: shrinking gives whole pages back
/// (as long as the block stays at or above the threshold), growing succeeds within the usable
/// size or into the free span that follows the block in its chunk. Returns `false` when the
/// caller must move the block.
///
/// # Safety
/// `ptr` must be a live block of the allocator.
pub unsafe fn resize_in_place(ptr: *mut u8, size: usize) -> bool {
    let addr = ptr as usize;
    let Some(usable) = usable_size(ptr) else {
        return false;
    };
    let page = vrange::page_size();
    let pages = size.div_ceil(page).max(1);
    if size > usable {
        // Into a free neighbour in the same chunk, if there is one.
        return match chunkmap::get(addr) {
            Some(Owner::Chunk(c)) if pages <= CHUNK / page => {
                // SAFETY: a live block of this chunk, shorter than `pages`.
                unsafe { arena::grow(c as *mut Chunk, addr, pages) }
            }
            _ => false,
        };
    }
    if let Some(Owner::Chunk(c)) = chunkmap::get(addr) {
        if size >= config::threshold() && pages < usable / page {
            // SAFETY: a live block of this chunk, longer than `pages`.
            unsafe { arena::shrink(c as *mut Chunk, addr, pages) };
        }
    }
    // A large block keeps its mapping when shrunk (the caller may grow it again); a block
    // shrunk below the threshold keeps its pages, as moving it would cost a copy.
    true
}
