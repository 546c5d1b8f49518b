//! Deterministic page contents: a test fills memory with [`fill`] and later tells the pages it
//! kept ([`check`], [`check_at`]; part of it refilled with [`fill_at`]) from the ones the kernel took back (all zero, [`is_zero`])
//! and from corrupted ones (neither). Allocation-free, so forked children may use it.

// Safe functions over raw pointers, as they were in each crate's tests: the caller passes its
// own mapping. Marking them `unsafe` would put an unsafe block around every check of every
// test without making one of them safer.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

/// The word `fill` writes at word index `i`: never zero, distinct per seed and position, so
/// that lost pages (zero) and misplaced pages are both visible.
pub fn pattern(seed: u64, i: usize) -> u64 {
    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64)).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1
}

/// Fills `[ptr, ptr + len)` with `pattern(seed, word index from ptr)`.
pub fn fill(ptr: *mut u8, len: usize, seed: u64) {
    fill_at(ptr, 0, len, seed);
}

/// Fills `[base + off, base + off + len)` with what `fill(base, _, seed)` writes there: part
/// of a region refilled on its own, and checked with [`check_at`].
pub fn fill_at(base: *mut u8, off: usize, len: usize, seed: u64) {
    for i in off / 8..(off + len) / 8 {
        // SAFETY: test-owned memory; base+off..base+off+len is the test's own mapping.
        unsafe { (base as *mut u64).add(i).write(pattern(seed, i)) };
    }
}

/// Whether `[base + off, base + off + len)` still holds what `fill(base, _, seed)` wrote.
pub fn check_at(base: *const u8, off: usize, len: usize, seed: u64) -> bool {
    (off / 8..(off + len) / 8).all(|i| {
        // SAFETY: test-owned memory; the test's own mapping.
        unsafe { (base as *const u64).add(i).read_volatile() == pattern(seed, i) }
    })
}

/// Whether `[ptr, ptr + len)` holds exactly what `fill(ptr, len, seed)` wrote.
pub fn check(ptr: *const u8, len: usize, seed: u64) -> bool {
    check_at(ptr, 0, len, seed)
}

/// Whether every byte of the range is zero.
pub fn is_zero(ptr: *const u8, len: usize) -> bool {
    // SAFETY: test-owned memory; the test's own mapping.
    (0..len / 8).all(|i| unsafe { (ptr as *const u64).add(i).read_volatile() } == 0)
}
