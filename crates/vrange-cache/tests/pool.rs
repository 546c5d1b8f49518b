//! The pool of regions no entry uses, against the real kernel: a new cache writes its values
//! into the pages the last one left (without a page fault), values read right, and a purge
//! takes a pooled region before any value.

mod common;

use common::quiet_reclaimer as quiet;
use vrange::Priority;
use vrange_cache::{Cache, Options};
use vrange_sys::process::page_faults;

const MIB: usize = 1 << 20;

/// Inserts `n` values of `len` bytes (key `k`'s bytes all `k`) into a new cache, and returns it
/// with the minor faults the inserts took.
fn filled(n: u64, len: usize) -> (Cache<u64>, u64) {
    let c: Cache<u64> = Cache::new(Options {
        probation: false,
        ..Options::default()
    });
    let before = page_faults().minor;
    for k in 0..n {
        c.insert_with(k, len, Priority::Normal, |buf| buf.fill(k as u8))
            .unwrap();
    }
    let faults = page_faults().minor - before;
    (c, faults)
}

fn check(c: &Cache<u64>, n: u64, len: usize) {
    for k in 0..n {
        let v = c.get(&k).unwrap_or_else(|| panic!("key {k} missing"));
        assert_eq!(v.len(), len);
        assert!(v.iter().all(|&b| b == k as u8), "key {k} read wrong");
    }
}

#[test]
fn a_new_cache_writes_into_the_pages_the_last_one_left() {
    let _s = vrange_testkit::serial();
    quiet();
    let page = vrange_sys::mem::page_size();
    for (n, len) in [(8u64, MIB), (64, 64 << 10), (256, 4000)] {
        // The first cache may find pooled regions of other tests too.
        let (first, fresh) = filled(n, len);
        check(&first, n, len);
        drop(first);
        let (second, pooled) = filled(n, len);
        check(&second, n, len);
        let pages = (n as usize * len / page) as u64;
        println!(
            "{n} values of {len} bytes: {fresh} faults into fresh regions, {pooled} into pooled \
             ones ({pages} pages written)"
        );
        assert!(
            pooled < pages / 8,
            "pooled regions are resident: {pooled} faults for {pages} pages"
        );
    }
}

#[test]
fn a_purge_takes_pooled_regions_before_values() {
    let _s = vrange_testkit::serial();
    quiet();
    let (kept, _) = filled(4, MIB);
    let (gone, _) = filled(4, MIB);
    drop(gone);
    // The purge of 4 MiB, the least anyone could need, takes the pooled regions (DropFirst)
    // and not the values of the live cache (Normal).
    let freed = vrange::purge(4 * MIB);
    assert!(freed >= 4 * MIB, "freed {freed}");
    check(&kept, 4, MIB);
    // Pooled regions purged meanwhile are taken again as zero pages: values still read right.
    let (again, _) = filled(4, MIB);
    check(&again, 4, MIB);
}

#[test]
fn a_pooled_slabs_old_pages_are_not_a_hold_s_neighbours() {
    let _s = vrange_testkit::serial();
    quiet();
    // A slab written through, left to the pool.
    let (full, _) = filled(64, 4000);
    drop(full);
    // Two values in one page of a slab on that region; one of them held.
    let c: Cache<u64> = Cache::new(Options {
        probation: false,
        ..Options::default()
    });
    c.insert(1, &[1u8; 100], Priority::Normal).unwrap();
    c.insert(2, &[2u8; 100], Priority::Normal).unwrap();
    let held = c.get(&1).expect("fresh").hold();
    // A purge of everything: the held page stays, and the region's old pages are not this
    // slab's to lose (they were never marked volatile), so the other value lives too.
    vrange::purge(usize::MAX);
    assert_eq!(&held[..], &[1u8; 100][..]);
    drop(held);
    assert_eq!(&c.get(&2).expect("not purged")[..], &[2u8; 100][..]);
}
