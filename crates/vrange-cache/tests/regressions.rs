//! Regression tests of defects users hit (issue 20, issue 19 section 4), each named after what
//! broke, against the real kernel: purges are forced with `vrange::purge`.

mod common;

use common::{check, quiet_reclaimer, value};
use proptest::prelude::*;
use vrange::Priority;
use vrange_cache::{Cache, Error, Options, MAX_SLAB_BYTES};

fn cache() -> Cache<&'static str> {
    quiet_reclaimer();
    Cache::new(Options::default())
}

#[test]
fn a_second_raw_release_does_not_drop_another_readers_pin() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c = cache();
    c.insert("a", &value(1, 0, 100), Priority::Normal).unwrap();
    c.insert("b", &value(2, 0, 100), Priority::Normal).unwrap();
    let (va, la) = c.get("a").unwrap().into_raw();
    let (vb, _) = c.get("b").unwrap().into_raw();
    c.release_raw(vb).unwrap();
    assert_eq!(
        c.release_raw(vb),
        Err(Error::NotRegion),
        "a second release of the same value must be refused"
    );
    vrange::purge(usize::MAX);
    // SAFETY: `va` is still pinned (its raw release has not happened) for `la` bytes.
    let a = unsafe { std::slice::from_raw_parts(va, la) };
    assert!(check(a, 1, 0), "the live value was purged under its reader");
    c.release_raw(va).expect("the real release of `a` succeeds");
}

#[test]
fn a_raw_release_of_an_address_inside_a_value_is_refused() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c = cache();
    c.insert("a", &value(1, 0, 100), Priority::Normal).unwrap();
    c.insert("b", &value(2, 0, 100), Priority::Normal).unwrap();
    let (va, la) = c.get("a").unwrap().into_raw();
    let (vb, _) = c.get("b").unwrap().into_raw();
    // SAFETY: pointer arithmetic inside the value only (not read).
    let inside = unsafe { vb.add(1) };
    assert_eq!(c.release_raw(inside), Err(Error::NotRegion));
    assert_eq!(c.release_raw(std::ptr::null()), Err(Error::NotRegion));
    let other = cache();
    assert_eq!(
        other.release_raw(va),
        Err(Error::NotRegion),
        "another cache's value is refused"
    );
    c.release_raw(vb).unwrap();
    vrange::purge(usize::MAX);
    // SAFETY: `va` is still pinned for `la` bytes.
    assert!(check(unsafe { std::slice::from_raw_parts(va, la) }, 1, 0));
    c.release_raw(va).unwrap();
    assert_eq!(c.release_raw(va), Err(Error::NotRegion));
}

#[test]
fn a_value_got_twice_raw_is_released_twice() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c = cache();
    c.insert("a", &value(1, 0, 100), Priority::Normal).unwrap();
    let (v1, _) = c.get("a").unwrap().into_raw();
    let (v2, len) = c.get("a").unwrap().into_raw();
    assert_eq!(v1, v2);
    c.release_raw(v1).unwrap();
    vrange::purge(usize::MAX);
    // SAFETY: one raw pin of the value is left.
    assert!(check(unsafe { std::slice::from_raw_parts(v2, len) }, 1, 0));
    c.release_raw(v2).unwrap();
    assert_eq!(c.release_raw(v2), Err(Error::NotRegion));
}

#[test]
fn insert_with_a_length_near_usize_max_is_refused_not_handed_a_huge_slice() {
    let _s = vrange_testkit::serial();
    let c = cache();
    c.insert("first", b"x", Priority::Normal).unwrap();
    for len in [
        usize::MAX,
        usize::MAX - 10,
        usize::MAX - 4096,
        MAX_SLAB_BYTES + 1,
    ] {
        let mut called = false;
        let r = c.insert_with("k", len, Priority::Normal, |_| called = true);
        assert_eq!(r, Err(Error::Overflow), "len {len}");
        assert!(
            !called,
            "the fill closure must not see a place for {len} bytes"
        );
    }
    let r = c.get_or_insert_with("k", usize::MAX - 10, Priority::Normal, |_| {});
    assert_eq!(r.unwrap_err(), Error::Overflow);
    assert_eq!(&c.get("first").unwrap()[..], b"x");
}

#[test]
fn an_impossible_slab_size_is_refused_at_creation() {
    for slab_bytes in [1 << 62, usize::MAX, MAX_SLAB_BYTES + 1] {
        let r = Cache::<u64>::try_new(Options {
            slab_bytes,
            ..Options::default()
        });
        assert_eq!(r.err(), Some(Error::Overflow), "slab_bytes {slab_bytes}");
    }
    let c = Cache::<u64>::try_new(Options {
        slab_bytes: 1 << 20,
        ..Options::default()
    })
    .unwrap();
    assert_eq!(c.options().slab_bytes, 1 << 20);
}

#[test]
fn resident_bytes_count_written_pages_not_whole_slabs() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c = cache();
    c.insert("a", &[1u8; 17], Priority::Normal).unwrap();
    c.insert("b", &[2u8; 17], Priority::Normal).unwrap();
    let s = c.stats();
    let page = vrange::page_size() as u64;
    assert_eq!(s.value_bytes(), 34);
    assert_eq!(
        s.resident_bytes(),
        page,
        "34 bytes of values touch one page, not the 256 KiB slab"
    );
    assert_eq!(s.mapped_bytes(), 256 << 10, "the slab's address space");
    assert_eq!(s.overhead_bytes(), page - 34);
    // A large value with a region of its own: its pages, not more.
    c.insert("big", &vec![3u8; 1 << 20], Priority::Low).unwrap();
    let s = c.stats();
    let low = &s.classes[1];
    assert!(
        low.resident_bytes >= 1 << 20 && low.resident_bytes <= (1 << 20) + page,
        "{low:?}"
    );
    // Purged: nothing of it counts.
    vrange::purge(usize::MAX);
    let s = c.stats();
    assert_eq!(s.resident_bytes(), 0, "{s:?}");
    assert_eq!(s.mapped_bytes(), 0, "{s:?}");
}

#[test]
fn stats_show_the_bytes_held_values_pin() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c: Cache<u64> = Cache::new(Options::default());
    let page = vrange::page_size() as u64;
    // 20 KiB values share 256 KiB slabs: two slabs' worth.
    for i in 0..20u64 {
        c.insert(i, &value(i, 0, 20 << 10), Priority::Normal)
            .unwrap();
    }
    assert_eq!(c.stats().pinned_bytes(), 0, "nothing held");
    let held = c.get(&0).unwrap();
    let s = c.stats();
    assert!(
        s.pinned_bytes() >= 20 << 10 && s.pinned_bytes() < s.resident_bytes(),
        "one held value pins its slab's written pages, not the other slab: {s:?}"
    );
    assert_eq!(s.pinned_bytes() % page, 0);
    let (raw, _) = c.get(&19).unwrap().into_raw();
    assert_eq!(
        c.stats().pinned_bytes(),
        c.stats().resident_bytes(),
        "a value of each slab held: both pinned"
    );
    drop(held);
    c.release_raw(raw).unwrap();
    assert_eq!(c.stats().pinned_bytes(), 0, "all let go");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// No length too large for the address space reaches the fill closure: it is refused
    /// with `Overflow` before any size arithmetic can wrap, whatever the slab size.
    #[test]
    fn huge_lengths_never_reach_the_fill_closure(
        shift in 48u32..=64,
        minus in 0usize..70_000,
        slab_bytes in prop_oneof![Just(64usize << 10), Just(256 << 10), Just(1 << 20)],
    ) {
        let c: Cache<u64> = Cache::new(Options { slab_bytes, ..Options::default() });
        c.insert(0, b"seed", Priority::Normal).unwrap();
        // Above what any process can map: from just past 128 TiB to usize::MAX.
        let top = if shift == 64 { usize::MAX } else { 1usize << shift };
        let len = top.saturating_sub(minus).max(MAX_SLAB_BYTES + 1);
        let r = c.insert_with(1, len, Priority::Normal, |buf| {
            // Reaching here with a huge length is the bug; touch the last byte to prove the
            // place is real if it ever is.
            assert_eq!(buf.len(), len);
            buf[len - 1] = 1;
        });
        prop_assert_eq!(r, Err(Error::Overflow), "len {}", len);
        prop_assert_eq!(&c.get(&0).unwrap()[..], b"seed");
    }
}
