//! Large blocks (over 2 MiB) on the real kernel: a freed block is reused intact, split when
//! much larger than the request, moved and grown when too small (its pages move, no new fault),
//! and the cache holds no more than the large blocks' decaying peak plus 64 MiB.
//!
//! One test: the cache is process-wide, and each stage below depends on what the one before
//! left in it, starting from an empty cache in a process of its own.

use std::time::{Duration, Instant};
use vrange_malloc::heap;
use vrange_testkit::pattern::{check, check_at, fill, is_zero};

const MIB: usize = 1 << 20;

fn alloc(size: usize) -> heap::Block {
    heap::alloc(size, 16).expect("served")
}

fn free(p: *mut u8) {
    // SAFETY: callers free live blocks of the allocator, once.
    assert!(unsafe { heap::free(p) });
}

fn mapped() -> u64 {
    vrange::stats().allocator.mapped_bytes
}

#[test]
fn large_blocks_are_reused_split_grown_and_kept_within_the_peak_plus_64_mib() {
    // Nothing may purge behind the test's back (pressure elsewhere on the machine): the stages
    // check that bytes come back intact.
    for (name, value) in [
        ("VRANGE_PSI", "off"),
        ("VRANGE_VMPRESSURE", "off"),
        ("VRANGE_HEADROOM", "off"),
    ] {
        vrange::set_option(name, value).unwrap();
    }

    // Reuse: the block just freed comes back, its bytes intact.
    let a = alloc(11 * MIB + 1);
    assert!(a.zeroed, "a new mapping is zero");
    let base = a.ptr.as_ptr();
    assert_eq!(base as usize % (2 * MIB), 0, "2 MiB-aligned");
    assert_eq!(heap::usable_size(base), Some(12 * MIB));
    fill(base, 12 * MIB, 1);
    free(base);
    let b = alloc(11 * MIB + 1);
    assert_eq!(b.ptr.as_ptr(), base, "the freed large block is reused");
    assert!(!b.zeroed);
    assert!(check(base, 12 * MIB, 1), "reused intact");
    free(base);

    // Split: a request of a quarter of the cached block takes its head; the tail, a block of
    // its own, serves the next one.
    let c = alloc(3 * MIB);
    assert_eq!(c.ptr.as_ptr(), base, "the head of the cached block");
    assert_eq!(
        heap::usable_size(base),
        Some(4 * MIB),
        "split, not handed out whole"
    );
    // SAFETY: inside the cached block's mapping, which the split keeps.
    let tail = unsafe { base.add(4 * MIB) };
    let d = alloc(3 * MIB);
    assert_eq!(
        d.ptr.as_ptr(),
        tail,
        "the split tail serves the next request"
    );
    assert_eq!(heap::usable_size(tail), Some(4 * MIB));
    assert!(
        check_at(base, 0, 8 * MIB, 1),
        "both parts of the split block intact"
    );
    fill(tail, 4 * MIB, 2);

    // Grow: with only 4 MiB blocks cached, a 10 MiB request takes the largest one, moved to an
    // address with room and grown: its bytes move with it and only the rest is new.
    free(tail);
    let e = alloc(10 * MIB);
    let moved = e.ptr.as_ptr();
    assert_ne!(moved, tail, "moved");
    assert!(!e.zeroed, "the moved pages are not zero");
    assert_eq!(heap::usable_size(moved), Some(10 * MIB));
    assert_eq!(
        heap::usable_size(tail),
        None,
        "the old address is no block any more"
    );
    assert!(
        check(moved, 4 * MIB, 2),
        "the moved block's bytes came along"
    );
    // SAFETY: inside the 10 MiB block.
    let added = unsafe { moved.add(4 * MIB) };
    assert!(is_zero(added, 6 * MIB), "the added bytes are zero");
    free(moved);
    free(base);

    // The cache's limit: after a peak of 96 MiB of live large blocks, all freed, the cache keeps
    // them (what glibc's heap would keep below its top), then gives back what is over 64 MiB as
    // the peak decays, tick by tick.
    vrange::set_option("VRANGE_POLL_MS", "10").unwrap();
    let blocks: Vec<*mut u8> = (0..12)
        .map(|i: u64| {
            let p = alloc(8 * MIB).ptr.as_ptr();
            fill(p, 8 * MIB, i);
            p
        })
        .collect();
    let at_peak = mapped();
    assert!(at_peak >= 96 * MIB as u64);
    for &p in &blocks {
        free(p);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut now = mapped();
    while now > 72 * MIB as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        now = mapped();
    }
    assert!(
        now <= 72 * MIB as u64,
        "the cache gives back what is over 64 MiB as the peak decays: {} MiB mapped, {} MiB at \
         the peak",
        now / MIB as u64,
        at_peak / MIB as u64
    );
    assert!(
        now >= 56 * MIB as u64,
        "and keeps 64 MiB: {} MiB",
        now / MIB as u64
    );

    // A block larger than the cache's 64 MiB is unmapped at its free, as glibc unmaps blocks
    // it mapped on their own.
    let before = mapped();
    let big = alloc(100 * MIB).ptr.as_ptr();
    fill(big, MIB, 3);
    free(big);
    assert!(
        mapped() <= before,
        "a 100 MiB block is not kept: {} MiB mapped, {} MiB before",
        mapped() / MIB as u64,
        before / MIB as u64
    );
    vrange::set_option("VRANGE_POLL_MS", "100").unwrap();
}
