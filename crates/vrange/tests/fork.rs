//! Fork semantics (draft: documentation follows the experiments).

mod common;
use common::*;
use std::time::Duration;
use vrange::{mark_volatile, page_size, unmark, volatile_pages};

const PAGES: usize = 16;
const DEADLINE: Duration = Duration::from_secs(20);

/// `[pages, volatile, purged]` of an unmark, or all `u64::MAX` if it failed. Allocation-free.
fn unmark_words(ptr: *mut u8, len: usize) -> [u64; 3] {
    // SAFETY: callers pass their own mapping, with no reference into it.
    match unsafe { unmark(ptr, len) } {
        Ok(u) => [u.pages as u64, u.volatile as u64, u.purged as u64],
        Err(_) => [u64::MAX; 3],
    }
}

fn volatile_words(ptr: *mut u8, len: usize) -> u64 {
    volatile_pages(ptr, len).map_or(u64::MAX, |n| n as u64)
}

/// The next message from the child, or a failure naming how the child ended.
fn expect<const N: usize>(link: &Link, child: &mut Forked) -> [u64; N] {
    link.recv::<N>(DEADLINE).unwrap_or_else(|e| {
        panic!(
            "no message from the child ({e:?}); it ended with {}",
            child.wait(DEADLINE)
        )
    })
}

fn finish(mut child: Forked) {
    let exit = child.wait(DEADLINE);
    assert_eq!(exit, Exit::Code(0), "child ended with {exit}");
}

/// Number of all-zero pages in the mapping.
fn zero_pages(m: &Mapping) -> usize {
    (0..m.len / page_size())
        .filter(|&i| is_zero(m.page(i), page_size()))
        .count()
}

#[test]
fn case1_child_inherits_volatile_state_and_content() {
    let _serial = serial();
    let m = Mapping::new(PAGES * page_size());
    let (ptr, len) = (m.ptr, m.len);
    fill(ptr, len, 11);
    // SAFETY: our mapping, unreferenced.
    unsafe { mark_volatile(ptr, len).unwrap() };
    let (mut child, link) = fork_linked(|link| {
        let seen = volatile_words(ptr, len);
        let before = check(ptr, len, 11) as u64;
        let [pages, volatile, purged] = unmark_words(ptr, len);
        let after = check(ptr, len, 11) as u64;
        link.send(&[seen, before, pages, volatile, purged, after]);
        0
    });
    let [seen, before, pages, volatile, purged, after] = expect::<6>(&link, &mut child);
    finish(child);
    let n = PAGES as u64;
    assert_eq!(seen, n, "the child sees the pages volatile");
    assert_eq!(before, 1, "the child reads the original content");
    assert_eq!((pages, volatile, purged), (n, n, 0), "child's unmark");
    assert_eq!(after, 1, "the child's content is intact after unmark");

    assert_eq!(
        volatile_pages(ptr, len).unwrap(),
        PAGES,
        "still volatile here"
    );
    // SAFETY: our mapping, unreferenced.
    let r = unsafe { unmark(ptr, len).unwrap() };
    assert_eq!(
        (r.pages, r.volatile, r.purged),
        (PAGES, PAGES, 0),
        "parent's"
    );
    assert!(check(ptr, len, 11));
}

/// Pages of `[ptr, ptr + PAGES pages)` that read all zero and that hold the pattern of `seed`,
/// as seen by a forked child. Allocation-free.
fn census(ptr: *mut u8, seed: u64) -> [u64; 2] {
    let page = page_size();
    let zero = (0..PAGES).filter(|&i| is_zero(ptr.wrapping_add(i * page), page));
    let intact = (0..PAGES).filter(|&i| check_at(ptr, i * page, page, seed));
    [zero.count() as u64, intact.count() as u64]
}

#[test]
fn case2_pageout_skips_pages_still_shared_with_the_child() {
    let _serial = serial();
    let m = Mapping::new(PAGES * page_size());
    let (ptr, len) = (m.ptr, m.len);
    fill(ptr, len, 12);
    // SAFETY: our mapping, unreferenced.
    unsafe { mark_volatile(ptr, len).unwrap() };
    let (mut child, link) = fork_linked(|link| {
        link.send(&[volatile_words(ptr, len)]);
        // The parent tries to purge the shared pages now.
        if link.recv::<1>(DEADLINE).is_err() {
            return 1;
        }
        // And the child tries too: the pages are still shared.
        force_purge(ptr, len);
        let [pages, volatile, purged] = unmark_words(ptr, len);
        let [zero, intact] = census(ptr, 12);
        link.send(&[pages, volatile, purged, zero, intact]);
        0
    });
    let [seen] = expect::<1>(&link, &mut child);
    assert_eq!(seen, PAGES as u64);
    force_purge(ptr, len);
    link.send(&[1]);
    let [pages, volatile, purged, zero, intact] = expect::<5>(&link, &mut child);
    finish(child);
    let n = PAGES as u64;
    assert_eq!(
        (pages, volatile, purged, zero, intact),
        (n, n, 0, 0, n),
        "child: MADV_PAGEOUT in either process discards nothing while the pages are shared"
    );
    // SAFETY: our mapping, unreferenced.
    let r = unsafe { unmark(ptr, len).unwrap() };
    assert_eq!((r.volatile, r.purged), (PAGES, 0), "parent");
    assert!(check(ptr, len, 12));
}

#[test]
fn case2b_pageout_discards_once_the_child_is_gone() {
    let _serial = serial();
    let m = Mapping::new(PAGES * page_size());
    let (ptr, len) = (m.ptr, m.len);
    fill(ptr, len, 13);
    // SAFETY: our mapping, unreferenced.
    unsafe { mark_volatile(ptr, len).unwrap() };
    let (mut child, link) = fork_linked(|link| {
        link.send(&[volatile_words(ptr, len)]);
        0
    });
    assert_eq!(expect::<1>(&link, &mut child), [PAGES as u64]);
    force_purge(ptr, len);
    // The child still maps the pages (it may not have reached exit yet, and is not reaped):
    // nothing can be discarded. Once it is reaped, the pages are the parent's alone again.
    finish(child);
    force_purge(ptr, len);
    // SAFETY: our mapping, unreferenced.
    let r = unsafe { unmark(ptr, len).unwrap() };
    assert_eq!((r.volatile, r.purged), (PAGES, PAGES));
    assert_eq!(zero_pages(&m), PAGES);
}

#[test]
fn case3_child_write_breaks_cow_and_parent_page_alone_is_purged() {
    const WRITTEN: usize = 5;
    const MAGIC: u64 = 0x0DD_BA11_CAFE;
    let _serial = serial();
    let page = page_size();
    let m = Mapping::new(PAGES * page);
    let (ptr, len) = (m.ptr, m.len);
    fill(ptr, len, 14);
    // SAFETY: our mapping, unreferenced.
    unsafe { mark_volatile(ptr, len).unwrap() };
    let (mut child, link) = fork_linked(|link| {
        let word = ptr.wrapping_add(WRITTEN * page + 8).cast::<u64>();
        // SAFETY: our (inherited) mapping; a write into a volatile page keeps it.
        unsafe { word.write_volatile(MAGIC) };
        link.send(&[1]);
        // The parent purges now; then the child unmarks.
        if link.recv::<1>(DEADLINE).is_err() {
            return 1;
        }
        let [pages, volatile, purged] = unmark_words(ptr, len);
        // SAFETY: as above.
        let kept = unsafe { word.read_volatile() } == MAGIC;
        let rest = (0..PAGES).all(|i| {
            if i == WRITTEN {
                check_at(ptr, i * page, 8, 14) && check_at(ptr, i * page + 16, page - 16, 14)
            } else {
                check_at(ptr, i * page, page, 14)
            }
        });
        link.send(&[pages, volatile, purged, kept as u64, rest as u64]);
        0
    });
    expect::<1>(&link, &mut child);
    force_purge(ptr, len);
    link.send(&[1]);
    let [pages, volatile, purged, kept, rest] = expect::<5>(&link, &mut child);
    finish(child);
    let n = PAGES as u64;
    assert_eq!((pages, volatile, purged), (n, n, 0), "child: nothing lost");
    assert_eq!(kept, 1, "child: its write is kept");
    assert_eq!(rest, 1, "child: the rest of its content is intact");
    // SAFETY: our mapping, unreferenced.
    let r = unsafe { unmark(ptr, len).unwrap() };
    assert_eq!(
        (r.volatile, r.purged),
        (PAGES, 1),
        "parent: only the page the child copied was its alone, and was discarded"
    );
    assert!(is_zero(m.page(WRITTEN), page));
    for i in (0..PAGES).filter(|&i| i != WRITTEN) {
        assert!(check_at(ptr, i * page, page, 14), "parent page {i}");
    }
}

#[test]
fn case4_child_unmark_copies_so_parent_pages_are_purged() {
    let _serial = serial();
    let m = Mapping::new(PAGES * page_size());
    let (ptr, len) = (m.ptr, m.len);
    fill(ptr, len, 15);
    // SAFETY: our mapping, unreferenced.
    unsafe { mark_volatile(ptr, len).unwrap() };
    let (mut child, link) = fork_linked(|link| {
        let [pages, volatile, purged] = unmark_words(ptr, len);
        link.send(&[pages, volatile, purged, check(ptr, len, 15) as u64]);
        // The parent purges its pages now.
        if link.recv::<1>(DEADLINE).is_err() {
            return 1;
        }
        let still = check(ptr, len, 15) && volatile_pages(ptr, len) == Ok(0);
        link.send(&[still as u64]);
        0
    });
    let [pages, volatile, purged, ok] = expect::<4>(&link, &mut child);
    let n = PAGES as u64;
    assert_eq!(
        (pages, volatile, purged, ok),
        (n, n, 0, 1),
        "child's unmark"
    );
    force_purge(ptr, len);
    link.send(&[1]);
    assert_eq!(
        expect::<1>(&link, &mut child),
        [1],
        "child: pinned copies survive the parent's purge"
    );
    finish(child);
    // SAFETY: our mapping, unreferenced.
    let r = unsafe { unmark(ptr, len).unwrap() };
    assert_eq!(
        (r.volatile, r.purged),
        (PAGES, PAGES),
        "parent: all discarded"
    );
    assert_eq!(zero_pages(&m), PAGES);
}

#[test]
fn case5_purge_before_fork_is_reported_by_both() {
    let _serial = serial();
    let m = Mapping::new(PAGES * page_size());
    let (ptr, len) = (m.ptr, m.len);
    fill(ptr, len, 16);
    // SAFETY: our mapping, unreferenced.
    unsafe { mark_volatile(ptr, len).unwrap() };
    force_purge(ptr, len);
    let (mut child, link) = fork_linked(|link| {
        let seen = volatile_words(ptr, len);
        let [pages, volatile, purged] = unmark_words(ptr, len);
        let [zero, _] = census(ptr, 16);
        link.send(&[seen, pages, volatile, purged, zero]);
        0
    });
    let [seen, pages, volatile, purged, zero] = expect::<5>(&link, &mut child);
    finish(child);
    let n = PAGES as u64;
    assert_eq!(
        (seen, pages, volatile, purged, zero),
        (n, n, n, n, n),
        "child"
    );
    // SAFETY: our mapping, unreferenced.
    let r = unsafe { unmark(ptr, len).unwrap() };
    assert_eq!((r.volatile, r.purged), (PAGES, PAGES), "parent");
    assert_eq!(zero_pages(&m), PAGES);
}

#[test]
fn case6_pages_marked_while_shared_become_purgeable_once_unshared() {
    let _serial = serial();
    let m = Mapping::new(PAGES * page_size());
    let (ptr, len) = (m.ptr, m.len);
    fill(ptr, len, 17);
    let (mut child, link) = fork_linked(|link| {
        // Hold the pages shared until the parent has marked and tried to purge them.
        if link.recv::<1>(DEADLINE).is_err() {
            return 1;
        }
        let [pages, volatile, purged] = unmark_words(ptr, len);
        link.send(&[pages, volatile, purged, check(ptr, len, 17) as u64]);
        0
    });
    // SAFETY: our mapping, unreferenced.
    unsafe { mark_volatile(ptr, len).unwrap() };
    assert_eq!(volatile_pages(ptr, len).unwrap(), PAGES);
    force_purge(ptr, len);
    let lazy = lazy_free_kb(ptr);
    link.send(&[1]);
    let child_saw = expect::<4>(&link, &mut child);
    finish(child);
    force_purge(ptr, len);
    // SAFETY: our mapping, unreferenced.
    let r = unsafe { unmark(ptr, len).unwrap() };
    eprintln!(
        "case 6: lazy while shared {lazy} kB; child {child_saw:?}; parent {r:?}, zero {}",
        zero_pages(&m)
    );
    panic!("explore");
}
