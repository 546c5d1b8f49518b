//! Fork semantics of volatile memory, as Linux 6.18 implements them. Every statement below is
//! checked by a test here (MADV_PAGEOUT, `force_purge`, standing in for reclaim) or in
//! `pressure.rs` (real reclaim in a memory cgroup).
//!
//! # What each process's unmark reports
//! vrange's page states live in private memory, so a fork child inherits them: right after the
//! fork both processes see the same pages volatile (`volatile_pages`), read the same content,
//! and each unmark reports on that process's own view of each page; unmarking in one process
//! never changes the other's states.
//!
//! | case | sequence                                                        | parent's unmark       | child's unmark                |
//! |------|-----------------------------------------------------------------|-----------------------|-------------------------------|
//! | 1    | mark, fork, no purge                                            | 0 purged, intact      | 0 purged, intact              |
//! | 2    | mark, fork, MADV_PAGEOUT in parent and child while shared       | 0 purged, intact      | 0 purged, intact              |
//! | 2b   | mark, fork, child exits (reaped), MADV_PAGEOUT in parent        | all purged (zero)     | —                             |
//! | 3    | mark, fork, child writes page k, MADV_PAGEOUT in parent         | page k purged only    | 0 purged, its write kept      |
//! | 4    | mark, fork, child unmarks, MADV_PAGEOUT in parent               | all purged (zero)     | 0 purged, survives the purge  |
//! | 5    | mark, MADV_PAGEOUT, fork                                        | all purged (zero)     | all purged (zero)             |
//! | 6    | fork, mark in parent while shared, MADV_PAGEOUT, child reaped, MADV_PAGEOUT | all purged (zero) | nothing volatile, intact |
//! | —    | mark, fork, real memory pressure (pressure.rs)                  | the same pages purged in both |                       |
//! | —    | fork, mark in parent while shared, real pressure (pressure.rs) | purged (zero), no memory freed | nothing volatile, intact |
//!
//! # The kernel behaviour behind it
//! - A page marked before the fork stays lazy-free across it, now mapped copy-on-write by both
//!   processes, with clean page-table entries in both.
//! - **MADV_PAGEOUT skips every page that is mapped by more than one process**, whichever
//!   process calls it (mm/madvise.c `madvise_cold_or_pageout_pte_range`:
//!   `folio_maybe_mapped_shared()`, `folio_mapcount() != 1` before 6.15): a forced purge
//!   discards nothing while the page is shared, and both unmarks report it intact (case 2).
//!   The sharing ends when either process writes the page (copy-on-write gives the writer a
//!   private dirty copy; unmark's witness write is such a write), unmaps it, or exits and is
//!   reaped. From then on the remaining mapping is the other process's alone and still
//!   lazy-free, so a forced purge there discards it (cases 2b, 3, 4). In other words,
//!   unmarking (or writing) in one process leaves the other's copy volatile and purgeable.
//! - **Real reclaim does discard shared lazy-free pages**: it unmaps the page from every
//!   process (rmap walk in mm/rmap.c `try_to_unmap_one`) and, as no entry is dirty, discards
//!   it, so both processes lose it at once and both report it purged
//!   (`pressure.rs::cgroup_pressure_discards_pages_shared_after_fork`: identical purge counts,
//!   chunk for chunk).
//! - A purge before the fork is inherited: both processes map nothing there and both report
//!   the pages purged (case 5).
//! - **Marking pages that are still shared (fork first, then mark) works**, contrary to a
//!   reading of madvise(2) that MADV_FREE leaves shared pages alone: `madvise_free_pte_range`
//!   skips a shared folio only if the folio itself is flagged dirty or in the swap cache, which
//!   an anonymous page that never left memory is not (its dirtiness lives in the page-table
//!   entries). The folio becomes lazy-free (smaps LazyFree counts it) and the marking process's
//!   entries are cleaned; the other process's entries keep the dirty bit fork copied. While
//!   shared, MADV_PAGEOUT skips it; once the other process is gone, a forced purge discards it
//!   and the marking process reports it purged (case 6). Under real pressure while still
//!   shared, reclaim unmaps the page from one process after the other (rmap order) and stops
//!   at the first dirty entry, the other process's: it maps that entry back, keeps the page
//!   and makes it ordinary anonymous memory again. Clean entries unmapped before that are
//!   gone. Observed: the marking process (the parent) is visited first, so it loses its view
//!   of every page (reads zero, reported purged), the other process loses nothing, and no
//!   memory is freed (`pressure.rs::cgroup_pressure_on_pages_marked_while_shared`: 16384 of
//!   16384 pages lost by the marker, none by the other process, usage unchanged). So marking
//!   memory still shared with a fork child can give up the data without giving memory back.
//!
//! Whatever the kernel does, each unmark stays exact: a page is reported intact only if its
//! witness word proves it is, and every page reported purged reads zero.
//!
//! # How the tests fork
//! Directly from the multi-threaded test process. The child only reads and writes the mapping,
//! calls `unmark`/`volatile_pages`/`force_purge` (no allocation, no locks) and talks over a
//! pipe ([`Link`]); a panic is caught and becomes `_exit(2)`. The parent always reaps the child
//! and fails with how it ended (exit code or signal) if a message is missing; every wait has a
//! deadline. The tests run one at a time ([`serial`]): a fork by a concurrent test would share
//! this test's pages and change what MADV_PAGEOUT does to them.

mod common;
use common::{force_purge, force_purge_all, Mapping};
use std::time::Duration;
use vrange::{mark_volatile, page_size, unmark, volatile_pages};
use vrange_testkit::fork::{fork_linked, Forked, Link};
use vrange_testkit::pattern::{check, check_at, fill, is_zero};
use vrange_testkit::proc::Exit;
use vrange_testkit::procfs::lazy_free_kb;
use vrange_testkit::serial;

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
        // Alive until the parent's purge of the shared pages is done: a purge that races the
        // child's exit can find a page unmapped by the child but still referenced by its
        // unfinished teardown, and the kernel then keeps that page as ordinary anonymous memory
        // (it is never discarded, and reported intact: the report stays exact).
        i32::from(link.recv::<1>(DEADLINE).is_err())
    });
    assert_eq!(expect::<1>(&link, &mut child), [PAGES as u64]);
    force_purge(ptr, len);
    // The child still maps the pages: nothing can be discarded. Once it is reaped, the pages
    // are the parent's alone again.
    link.send(&[1]);
    finish(child);
    force_purge_all(ptr, len);
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
    assert_eq!(
        lazy_free_kb(ptr),
        (len / 1024) as u64,
        "MADV_FREE made the shared pages lazy-free (our page-table entries clean)"
    );
    link.send(&[1]);
    assert_eq!(
        expect::<4>(&link, &mut child),
        [PAGES as u64, 0, 0, 1],
        "child: nothing volatile, content intact despite the parent's purge attempt"
    );
    finish(child);
    // The pages are ours alone now, and still lazy-free.
    force_purge(ptr, len);
    // SAFETY: our mapping, unreferenced.
    let r = unsafe { unmark(ptr, len).unwrap() };
    assert_eq!((r.volatile, r.purged), (PAGES, PAGES));
    assert_eq!(zero_pages(&m), PAGES);
}
