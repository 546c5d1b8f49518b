//! Regions of slabs and large values that no entry uses any more, kept for the next slab or
//! value of their size, in every cache of the process.
//!
//! A fresh region faults in every page it is written to (the kernel zeroes it, charges it to
//! the memory cgroup and maps it): inserts of 64 KiB and 1 MiB values into a new cache ran at
//! 0.07–0.21× the peers, whose allocator hands back what the previous cache freed. So a
//! slab whose last entry went (removed, replaced, or its cache dropped) gives its region here
//! instead of unmapping it, and a new slab or large value takes one of its size first.
//!
//! A pooled region is volatile and in the lowest class (`DropFirst`): any purge takes it
//! before a value, and the reclaimer arms it when idle as any other, so the kernel may take it
//! by itself. At most [`POOL_BYTES`] of written pages are kept; past that, a region is unmapped
//! as before. Large values' regions are rounded up to a quarter of a power of two, so that a
//! value finds a pooled region of its class (the untouched tail takes no memory).
//!
//! The lock is one of vrange's fork-held locks (`vrange_sys::lock::Lock`): the pool serves
//! every cache of the process, so a fork child must not inherit it held by a thread it does not
//! have. It is taken alone and guards a fixed array: nothing allocates, marks, unmarks or
//! unmaps under it.

use vrange::{Policy, Priority, VolatileRegion};
use vrange_sys::lock::{Lock, Rank};

/// The most bytes of written pages (the most that may be resident) the pool keeps.
pub(crate) const POOL_BYTES: usize = 128 << 20;
/// The most regions it keeps (the smallest large values' regions, 64 KiB, make 128 MiB; the
/// array is 80 KiB of zero pages until used).
const REGIONS: usize = 2048;

/// Pooled regions in `regions[..count]`, the last given last, each with the bytes of it
/// written, and their sum.
struct Pool {
    regions: [Option<(VolatileRegion, usize)>; REGIONS],
    count: usize,
    touched: usize,
}

struct Guarded {
    lock: Lock,
    pool: std::cell::UnsafeCell<Pool>,
}

// SAFETY: `pool` is only touched with `lock` held (`locked`).
unsafe impl Sync for Guarded {}

static POOL: Guarded = Guarded {
    lock: Lock::new(Rank::CachePool),
    pool: std::cell::UnsafeCell::new(Pool {
        regions: [const { None }; REGIONS],
        count: 0,
        touched: 0,
    }),
};

/// Runs `f` with the pool locked.
fn locked<R>(f: impl FnOnce(&mut Pool) -> R) -> R {
    let _held = POOL.lock.lock();
    // SAFETY: the lock is held, and `f` does not take it again.
    f(unsafe { &mut *POOL.pool.get() })
}

/// The length a large value's region gets for `len` bytes: the next quarter of a power of
/// two (at most a quarter more), page-rounded; `None` past the address space.
pub(crate) fn class_len(len: usize) -> Option<usize> {
    let page = vrange_sys::mem::page_size();
    let top = usize::BITS - len.max(page).leading_zeros() - 1;
    let quarter = (1usize << top) / 4;
    len.checked_next_multiple_of(quarter.max(page))
}

/// Gives `region` (no entry uses it; `touched` bytes of it were written) to the pool, or
/// unmaps it if the pool is full.
pub(crate) fn put(region: VolatileRegion, touched: usize) {
    if touched > POOL_BYTES / 8 {
        return;
    }
    region.set_priority(Priority::DropFirst);
    // SAFETY: no entry uses the region, so nothing refers into it; it may already be
    // volatile (marking again only renews its age).
    if unsafe { region.mark() }.is_err() {
        return;
    }
    // Given back when the pool is full, to be unmapped outside the lock.
    let refused = locked(|pool| {
        if pool.count == REGIONS || pool.touched + touched > POOL_BYTES {
            return Some(region);
        }
        pool.regions[pool.count] = Some((region, touched));
        pool.count += 1;
        pool.touched += touched;
        None
    });
    drop(refused);
}

/// A pooled region of exactly `len` bytes and `policy`, pinned, in class `priority`, whose
/// written pages lie within the first `used` bytes (which its new user writes) and one page
/// more, with the bytes of it that may be resident (0 if it was purged while pooled). Stale
/// pages past `used` would stay resident and pinned while the region lives (they are never
/// marked: see `Slab::pooled`); one is allowed, since a value's colour moves its end by up
/// to a page from one user to the next.
pub(crate) fn take(
    len: usize,
    used: usize,
    policy: Policy,
    priority: Priority,
) -> Option<(VolatileRegion, usize)> {
    let page = vrange_sys::mem::page_size();
    let used = used.checked_next_multiple_of(page)?;
    let (region, touched) = locked(|pool| {
        let i = pool.regions[..pool.count].iter().rposition(|r| {
            r.as_ref().is_some_and(|(r, touched)| {
                r.len() == len && *touched <= used.saturating_add(page) && r.policy() == policy
            })
        })?;
        pool.count -= 1;
        pool.regions.swap(i, pool.count);
        let taken = pool.regions[pool.count].take()?;
        pool.touched -= taken.1;
        Some(taken)
    })?;
    region.set_priority(priority);
    // The content is not wanted: a purged region's pages read as zero and are written anew.
    let touched = match region.unmark() {
        Ok(u) if !u.was_purged() => touched,
        Ok(_) => 0,
        Err(_) => return None,
    };
    Some((region, touched))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_a_quarter() {
        let page = vrange_sys::mem::page_size();
        assert_eq!(class_len(1), Some(page));
        assert_eq!(class_len(1 << 20), Some(1 << 20));
        assert_eq!(class_len((1 << 20) + 1), Some((1 << 20) + (1 << 18)));
        assert_eq!(class_len(100_000), Some(7 * (1 << 14)));
        for len in [page + 1, 65_000, 70_000, 1_000_000, 3 << 20, (5 << 20) + 7] {
            let c = class_len(len).unwrap();
            assert!(c >= len && c - len <= len / 4 + page, "{len} → {c}");
            assert_eq!(c % page, 0);
        }
        assert_eq!(class_len(usize::MAX), None);
    }
}
