//! Helpers shared by the integration tests: deterministic content and forced purges.
#![allow(dead_code)]

use vrange::sys::{mem, procfs};

/// The word `fill` writes at word index `i`: never zero, distinct per seed and position, so
/// that lost pages (zero) and misplaced pages are both visible.
pub fn pattern(seed: u64, i: usize) -> u64 {
    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64)).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1
}

/// Fills `[ptr, ptr + len)` with `pattern(seed, word index from ptr)`.
pub fn fill(ptr: *mut u8, len: usize, seed: u64) {
    for i in 0..len / 8 {
        // SAFETY (test): ptr..ptr+len is the test's own mapping.
        unsafe { (ptr as *mut u64).add(i).write(pattern(seed, i)) };
    }
}

/// Whether `[base + off, base + off + len)` still holds what `fill(base, _, seed)` wrote.
pub fn check_at(base: *const u8, off: usize, len: usize, seed: u64) -> bool {
    (off / 8..(off + len) / 8).all(|i| {
        // SAFETY (test): the test's own mapping.
        unsafe { (base as *const u64).add(i).read_volatile() == pattern(seed, i) }
    })
}

/// Whether `[ptr, ptr + len)` holds exactly what `fill(ptr, len, seed)` wrote.
pub fn check(ptr: *const u8, len: usize, seed: u64) -> bool {
    check_at(ptr, 0, len, seed)
}

/// Whether every byte of the range is zero.
pub fn is_zero(ptr: *const u8, len: usize) -> bool {
    // SAFETY (test): the test's own mapping.
    (0..len / 8).all(|i| unsafe { (ptr as *const u64).add(i).read_volatile() } == 0)
}

/// Forces the kernel to reclaim the range now: clean lazy pages are discarded.
pub fn force_purge(ptr: *mut u8, len: usize) {
    mem::reclaim_now(ptr, len).expect("MADV_PAGEOUT");
}

/// LazyFree kB of the mapping containing `ptr`.
pub fn lazy_free_kb(ptr: *const u8) -> u64 {
    procfs::smaps_of(ptr as usize)
        .unwrap()
        .expect("mapped")
        .lazy_free_kb
}

/// A private anonymous mapping owned by a test, unmapped on drop.
pub struct Mapping {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Mapping {
    pub fn new(len: usize) -> Mapping {
        Mapping::aligned(len, mem::page_size(), false)
    }

    pub fn aligned(len: usize, align: usize, huge: bool) -> Mapping {
        let ptr = mem::map_anon(len, align).expect("mmap").as_ptr();
        mem::advise_huge(ptr, len, huge).ok();
        Mapping { ptr, len }
    }

    pub fn page(&self, i: usize) -> *mut u8 {
        self.ptr.wrapping_add(i * mem::page_size())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY (test): the mapping is owned by this value.
        unsafe { mem::unmap(std::ptr::NonNull::new(self.ptr).unwrap(), self.len) };
    }
}
