//! Address → owner of every 2 MiB block the allocator maps: a chunk's metadata, or a large
//! block's. `free` asks it whether a pointer is ours; foreign pointers (glibc's) miss.
//!
//! Two levels keyed by `addr >> 21` over the 47-bit user address space: a static top table and
//! 64 KiB leaves mapped on demand and never unmapped. Lookups are lock-free and never allocate.

use crate::chunk::CHUNK;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicPtr, AtomicUsize};
use vrange_sys::mem;

const ADDR_BITS: u32 = 47;
const KEY_BITS: u32 = ADDR_BITS - CHUNK.trailing_zeros();
const LEAF_BITS: u32 = 13;
const TOP: usize = 1 << (KEY_BITS - LEAF_BITS);
const LEAF: usize = 1 << LEAF_BITS;

/// What an entry points to (the low bit of the stored word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// A chunk of an arena (`*mut Chunk`).
    Chunk(usize),
    /// A large block (`*mut Large`).
    Large(usize),
}

const LARGE_BIT: usize = 1;

static TOP_TABLE: [AtomicPtr<AtomicUsize>; TOP] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; TOP];
static GROW: vrange_sys::lock::Lock =
    vrange_sys::lock::Lock::new(vrange_sys::lock::Rank::MallocChunkMap);

#[inline]
fn key(addr: usize) -> Option<(usize, usize)> {
    if addr >> ADDR_BITS != 0 {
        return None;
    }
    let k = addr / CHUNK;
    Some((k >> LEAF_BITS, k & (LEAF - 1)))
}

/// The entry of `addr`, if its leaf exists. Inlined into `free`: for a pointer of the system
/// allocator it is one load of the top table.
#[inline]
fn lookup(addr: usize) -> Option<&'static AtomicUsize> {
    let (hi, lo) = key(addr)?;
    let leaf = TOP_TABLE[hi].load(Acquire);
    if leaf.is_null() {
        return None;
    }
    // SAFETY: leaves are LEAF zero-initialised atomics, mapped once and never unmapped; lo < LEAF.
    Some(unsafe { &*leaf.add(lo) })
}

/// The entry of `addr`, its leaf mapped if need be (None: the address is out of range or the
/// leaf could not be mapped).
fn entry(addr: usize) -> Option<&'static AtomicUsize> {
    if let Some(e) = lookup(addr) {
        return Some(e);
    }
    let (hi, lo) = key(addr)?;
    let leaf = GROW.with(|| {
        let mut leaf = TOP_TABLE[hi].load(Acquire);
        if leaf.is_null() {
            let bytes = LEAF * std::mem::size_of::<AtomicUsize>();
            if let Ok(fresh) = mem::map_anon(bytes, mem::page_size()) {
                leaf = fresh.as_ptr().cast();
                TOP_TABLE[hi].store(leaf, Release);
            }
        }
        leaf
    });
    if leaf.is_null() {
        return None;
    }
    // SAFETY: as in `lookup`.
    Some(unsafe { &*leaf.add(lo) })
}

/// The owner of the 2 MiB block holding `addr`. Async-signal-safe.
#[inline]
pub fn get(addr: usize) -> Option<Owner> {
    let v = lookup(addr)?.load(Acquire);
    match v {
        0 => None,
        v if v & LARGE_BIT != 0 => Some(Owner::Large(v & !LARGE_BIT)),
        v => Some(Owner::Chunk(v)),
    }
}

/// Records `owner` for every 2 MiB block of `[start, start + len)`. False if a leaf could not be
/// mapped (nothing is recorded then).
pub fn set(start: usize, len: usize, owner: Owner) -> bool {
    let word = match owner {
        Owner::Chunk(p) => p,
        Owner::Large(p) => p | LARGE_BIT,
    };
    let mut addr = start;
    while addr < start + len {
        let Some(e) = entry(addr) else {
            clear(start, addr - start);
            return false;
        };
        e.store(word, Release);
        addr += CHUNK;
    }
    true
}

/// Forgets the owner of every 2 MiB block of `[start, start + len)`.
pub fn clear(start: usize, len: usize) {
    let mut addr = start;
    while addr < start + len {
        if let Some(e) = lookup(addr) {
            e.store(0, Relaxed);
        }
        addr += CHUNK;
    }
}
