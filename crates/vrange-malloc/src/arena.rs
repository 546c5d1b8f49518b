//! Arenas: one per CPU (up to [`MAX_ARENAS`]), each a lock and lists of its chunks by their
//! largest free span. A thread allocates from the arena of the CPU it runs on (`sched_getcpu`,
//! no thread-local state, so threads of any origin and code running before TLS is set up are
//! served alike), trying the others if that one is busy; a block is freed into the arena that
//! owns its chunk. Fully free chunks beyond [`KEEP_EMPTY`] per arena go to a shared pool, where
//! any arena takes them before mapping new ones.

use crate::chunk::{Chunk, Freed, CHUNK};
use crate::chunkmap::{self, Owner};
use crate::ranges::Volatile;
use crate::stats::Counters;
use std::cell::UnsafeCell;
use std::ptr::null_mut;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use vrange::Taken;
use vrange_sys::lock::{Guard, Lock, Rank};
use vrange_sys::mem;

/// Most arenas (more CPUs share them).
pub const MAX_ARENAS: usize = 256;
/// Fully free chunks an arena keeps for itself.
const KEEP_EMPTY: usize = 2;
/// Lists by largest free span: class `k` holds chunks whose largest free span has `k` bits
/// (class 0, full chunks, is not listed).
const CLASSES: usize = 11;
/// Chunks mapped at a time (64 MiB of address space, no memory until touched).
const SEGMENT_CHUNKS: usize = 32;
/// Chunk metadata records mapped at a time.
const META_BATCH: usize = 64;

struct Lists {
    heads: [*mut Chunk; CLASSES],
    empty: usize,
}

/// One arena.
#[repr(align(128))]
pub struct Arena {
    lock: Lock,
    lists: UnsafeCell<Lists>,
    pub counters: Counters,
}

// SAFETY: `lists` and the chunks on them are only touched with `lock` held.
unsafe impl Sync for Arena {}

#[allow(clippy::declare_interior_mutable_const)] // a template for the static array below
const ARENA: Arena = Arena {
    lock: Lock::new(Rank::MallocArena),
    lists: UnsafeCell::new(Lists {
        heads: [null_mut(); CLASSES],
        empty: 0,
    }),
    counters: Counters::new(),
};

pub static ARENAS: [Arena; MAX_ARENAS] = [ARENA; MAX_ARENAS];
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The shared pool of empty chunks, the address-space segment being carved and the metadata
/// being carved, all under one lock.
struct Pool {
    empty: *mut Chunk,
    segment: usize,
    segment_left: usize,
    meta: *mut Chunk,
    meta_left: usize,
}

struct Shared {
    lock: Lock,
    pool: UnsafeCell<Pool>,
}

// SAFETY: `pool` is only touched with `lock` held.
unsafe impl Sync for Shared {}

static SHARED: Shared = Shared {
    lock: Lock::new(Rank::MallocPool),
    pool: UnsafeCell::new(Pool {
        empty: null_mut(),
        segment: 0,
        segment_left: 0,
        meta: null_mut(),
        meta_left: 0,
    }),
};

/// The chunk's owner while it sits in the pool.
const POOL: u32 = u32::MAX;

/// How many arenas are in use (the CPU count, capped).
pub fn count() -> usize {
    let n = COUNT.load(Relaxed);
    if n != 0 {
        return n;
    }
    // SAFETY: sysconf has no memory-safety preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    let n = (cpus.max(1) as usize).min(MAX_ARENAS);
    COUNT.store(n, Relaxed);
    n
}

fn class(pages: u32) -> usize {
    (32 - pages.leading_zeros()) as usize
}

/// Locks the arena of the current CPU, or another free one. Returns its index and the guard.
fn lock_some() -> (usize, Guard<'static>) {
    let n = count();
    // Unsupported maps to arena 0.
    let home = vrange_sys::process::current_cpu().map_or(0, |cpu| cpu % n);
    for i in 0..n {
        let a = (home + i) % n;
        if let Some(held) = ARENAS[a].lock.try_lock() {
            return (a, held);
        }
    }
    (home, ARENAS[home].lock.lock())
}

impl Arena {
    /// # Safety
    /// The caller holds `self.lock`.
    #[allow(clippy::mut_from_ref)] // exclusive by the lock
    unsafe fn lists(&self) -> &mut Lists {
        // SAFETY: the caller holds the lock, which makes this the only reference.
        unsafe { &mut *self.lists.get() }
    }

    /// Puts a chunk on the list its largest free span calls for (at the front: the chunk just
    /// used is the one whose memory is hottest).
    ///
    /// # Safety
    /// The lock is held; `c` belongs to this arena and is on no list.
    unsafe fn insert(&self, c: *mut Chunk) {
        // SAFETY: by the caller's contract.
        let (lists, chunk) = unsafe { (self.lists(), &mut *c) };
        let k = class(chunk.max_free);
        chunk.class = k as u32;
        chunk.prev = null_mut();
        if k == 0 {
            chunk.next = null_mut();
            return;
        }
        chunk.next = lists.heads[k];
        // SAFETY: list members are chunks of this arena, guarded by the lock the caller holds.
        if let Some(n) = unsafe { chunk.next.as_mut() } {
            n.prev = c;
        }
        lists.heads[k] = c;
        if chunk.is_empty() {
            lists.empty += 1;
        }
    }

    /// # Safety
    /// The lock is held; `c` belongs to this arena and is on the list its `class` names.
    unsafe fn remove(&self, c: *mut Chunk) {
        // SAFETY: by the caller's contract.
        let (lists, chunk) = unsafe { (self.lists(), &mut *c) };
        let k = chunk.class as usize;
        if k == 0 {
            return;
        }
        // SAFETY: list neighbours are chunks of this arena, guarded by the same lock.
        unsafe {
            match chunk.prev.as_mut() {
                Some(p) => p.next = chunk.next,
                None => lists.heads[k] = chunk.next,
            }
            if let Some(n) = chunk.next.as_mut() {
                n.prev = chunk.prev;
            }
        }
        if chunk.is_empty() {
            lists.empty -= 1;
        }
        chunk.next = null_mut();
        chunk.prev = null_mut();
        chunk.class = 0;
    }

    /// Allocates from this arena's chunks, taking a chunk from the pool or mapping one if none
    /// fits.
    ///
    /// # Safety
    /// The lock is held.
    unsafe fn alloc_locked(
        &self,
        me: u32,
        pages: usize,
        align_pages: usize,
        ranges: &mut Volatile,
    ) -> Option<(usize, Taken)> {
        for k in class(pages as u32).max(1)..CLASSES {
            // SAFETY: the lock is held.
            let mut c = unsafe { self.lists() }.heads[k];
            // A class holds chunks whose largest free span has the same bit length: in the
            // request's own class some may be too small; look at a few.
            let mut tries = 8;
            while !c.is_null() && tries > 0 {
                // SAFETY: listed chunks belong to this arena; the lock is held.
                let chunk = unsafe { &mut *c };
                let next = chunk.next;
                if (chunk.max_free as usize) < pages {
                    c = next;
                    tries -= 1;
                    continue;
                }
                // SAFETY: as above.
                unsafe { self.remove(c) };
                let got = chunk.alloc(pages, align_pages, ranges);
                // SAFETY: as above; the chunk is on no list after remove.
                unsafe { self.insert(c) };
                if got.is_some() {
                    return got;
                }
                c = next;
                tries -= 1;
            }
        }
        let c = take_chunk(me, ranges)?;
        // SAFETY: the chunk is this arena's now and on no list; the lock is held.
        let got = unsafe { &mut *c }.alloc(pages, align_pages, ranges);
        // SAFETY: as above.
        unsafe { self.insert(c) };
        got
    }
}

/// Allocates `pages` pages aligned to `align_pages` pages in some arena.
pub fn alloc(pages: usize, align_pages: usize) -> Option<(usize, Taken)> {
    let (a, _held) = lock_some();
    let arena = &ARENAS[a];
    let mut ranges = Volatile::current();
    // SAFETY: `_held` is the lock of arena `a`.
    let got = unsafe { arena.alloc_locked(a as u32, pages, align_pages, &mut ranges) };
    if let Some((_, t)) = got {
        arena
            .counters
            .allocated(t.pages << vrange::page_size().trailing_zeros(), &t);
    }
    got
}

/// Runs `f` on a live block's chunk with its arena locked.
///
/// # Safety
/// `c` must be the chunk of a live block (so its arena cannot change).
unsafe fn with_chunk<R>(c: *mut Chunk, f: impl FnOnce(&Arena, &mut Chunk) -> R) -> R {
    // SAFETY: chunk metadata is never freed; `arena` only changes while the chunk is empty.
    let a = unsafe { (*c).arena } as usize;
    let arena = &ARENAS[a];
    let _held = arena.lock.lock();
    // SAFETY: the lock of the chunk's arena is held.
    f(arena, unsafe { &mut *c })
}

/// Frees the block at `addr` in chunk `c`.
///
/// # Safety
/// `addr` must start a live block of `c`, freed once.
pub unsafe fn free(c: *mut Chunk, addr: usize) {
    // SAFETY: forwarded.
    unsafe {
        with_chunk(c, |arena, chunk| {
            let mut ranges = Volatile::current();
            arena.remove(c);
            let freed: Freed = chunk.free(chunk.page_of(addr), &mut ranges);
            arena
                .counters
                .freed(freed.pages << vrange::page_size().trailing_zeros());
            if chunk.is_empty() && arena.lists().empty >= KEEP_EMPTY {
                give_chunk(c);
            } else {
                arena.insert(c);
            }
        })
    }
}

/// Shrinks the live block at `addr` in chunk `c` to `pages` pages.
///
/// # Safety
/// `addr` must start a live block of `c` longer than `pages`.
pub unsafe fn shrink(c: *mut Chunk, addr: usize, pages: usize) {
    // SAFETY: forwarded.
    unsafe {
        with_chunk(c, |arena, chunk| {
            let mut ranges = Volatile::current();
            let before = chunk.block_pages(addr).unwrap_or(pages);
            arena.remove(c);
            chunk.shrink(chunk.page_of(addr), pages, &mut ranges);
            arena.insert(c);
            arena
                .counters
                .shrunk((before - pages) << vrange::page_size().trailing_zeros());
        })
    }
}

/// Grows the live block at `addr` in chunk `c` to `pages` pages in place, if the free span
/// after it allows. Returns whether it did.
///
/// # Safety
/// `addr` must start a live block of `c` shorter than `pages`.
pub unsafe fn grow(c: *mut Chunk, addr: usize, pages: usize) -> bool {
    // SAFETY: forwarded.
    unsafe {
        with_chunk(c, |arena, chunk| {
            let mut ranges = Volatile::current();
            let before = chunk.block_pages(addr).unwrap_or(pages);
            arena.remove(c);
            let grown = chunk.grow(chunk.page_of(addr), pages, &mut ranges);
            arena.insert(c);
            if grown {
                let more = (pages - before) << vrange::page_size().trailing_zeros();
                arena.counters.grown(more);
            }
            grown
        })
    }
}

/// A chunk for arena `me`: from the pool, or newly mapped.
fn take_chunk(me: u32, ranges: &mut Volatile) -> Option<*mut Chunk> {
    let _held = SHARED.lock.lock();
    // SAFETY: the pool lock is held.
    let pool = unsafe { &mut *SHARED.pool.get() };
    let c = if pool.empty.is_null() {
        new_chunk(pool, me, ranges)
    } else {
        let c = pool.empty;
        // SAFETY: pooled chunks are owned by the pool, under its lock.
        pool.empty = unsafe { (*c).next };
        Some(c)
    };
    if let Some(c) = c {
        // SAFETY: the chunk has left the pool (or is new): nobody else refers to it.
        unsafe {
            (*c).arena = me;
            (*c).next = null_mut();
        }
    }
    c
}

/// Hands an empty chunk (already off its arena's lists) to the pool.
fn give_chunk(c: *mut Chunk) {
    let _held = SHARED.lock.lock();
    // SAFETY: the pool lock is held; the chunk is empty, so no free can reach it.
    unsafe {
        let pool = &mut *SHARED.pool.get();
        (*c).arena = POOL;
        (*c).next = pool.empty;
        pool.empty = c;
    }
}

/// Maps a chunk (carving address-space segments) and its metadata.
fn new_chunk(pool: &mut Pool, me: u32, ranges: &mut Volatile) -> Option<*mut Chunk> {
    if pool.segment_left == 0 {
        let len = SEGMENT_CHUNKS * CHUNK;
        let base = mem::map_anon(len, CHUNK).ok()?;
        let _ = mem::advise_huge(base.as_ptr(), len, ranges.huge);
        crate::stats::mapped(len as i64);
        pool.segment = base.as_ptr() as usize;
        pool.segment_left = SEGMENT_CHUNKS;
    }
    if pool.meta_left == 0 {
        let bytes = META_BATCH * std::mem::size_of::<Chunk>();
        let page = mem::page_size();
        pool.meta = mem::map_anon(bytes.div_ceil(page) * page, page)
            .ok()?
            .as_ptr()
            .cast();
        pool.meta_left = META_BATCH;
    }
    let c = pool.meta;
    let base = pool.segment;
    if !chunkmap::set(base, CHUNK, Owner::Chunk(c as usize)) {
        return None;
    }
    // SAFETY: the metadata slot is fresh zeroed memory (a valid Chunk: integers, null pointers
    // and atomics), handed out once.
    unsafe { &mut *c }.init(base, vrange::page_size().trailing_zeros(), me, ranges);
    // SAFETY: still inside the metadata batch mapped above.
    pool.meta = unsafe { c.add(1) };
    pool.meta_left -= 1;
    pool.segment += CHUNK;
    pool.segment_left -= 1;
    Some(c)
}
