//! Deterministic purges on the real kernel: MADV_PAGEOUT discards clean lazy pages at once,
//! and unmark must report exactly those.

mod common;
use common::{force_purge, pin_cpu, Mapping};
use vrange::{mark_volatile, page_size, unmark, Region};
use vrange_testkit::pattern::{check, check_at, fill, is_zero};
use vrange_testkit::procfs::lazy_free_kb;
use vrange_testkit::serial;

#[test]
fn forced_purge_is_reported_exactly() {
    // One at a time: the kernel merges neighbouring test mappings into one VMA, whose smaps
    // counters (LazyFree) would then include another test's pages.
    let _serial = serial();
    let page = page_size();
    let m = Mapping::new(64 * page);
    fill(m.ptr, m.len, 1);
    // SAFETY: test-owned memory; the mapping is ours and unreferenced.
    unsafe { mark_volatile(m.ptr, m.len).unwrap() };
    // Purge every third page only.
    let purged: Vec<usize> = (0..64).filter(|i| i % 3 == 0).collect();
    for &i in &purged {
        force_purge(m.page(i), page);
    }
    for &i in &purged {
        assert!(is_zero(m.page(i), page), "purged page {i} reads zero");
    }
    // SAFETY: test-owned memory; ours.
    let report = unsafe { unmark(m.ptr, m.len).unwrap() };
    assert_eq!(report.pages, 64);
    assert_eq!(report.volatile, 64);
    assert_eq!(report.purged, purged.len());
    for i in (0..64).filter(|i| i % 3 != 0) {
        assert!(
            check_at(m.ptr, i * page, page, 1),
            "intact page {i} kept its bytes"
        );
    }
}

#[test]
fn without_pressure_nothing_is_lost_or_refaulted() {
    // One at a time: the kernel merges neighbouring test mappings into one VMA, whose smaps
    // counters (LazyFree) would then include another test's pages.
    let _serial = serial();
    let m = Mapping::new(256 * page_size());
    fill(m.ptr, m.len, 2);
    let faults = || {
        // SAFETY: getrusage writes into the struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: ru is a valid rusage.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        ru.ru_minflt
    };
    // SAFETY: test-owned memory; ours.
    unsafe { mark_volatile(m.ptr, m.len).unwrap() };
    assert!(
        check(m.ptr, m.len, 2),
        "reading volatile memory returns the original bytes"
    );
    let before = faults();
    // SAFETY: test-owned memory; ours.
    let report = unsafe { unmark(m.ptr, m.len).unwrap() };
    let after = faults();
    assert_eq!(report.purged, 0);
    assert!(check(m.ptr, m.len, 2));
    assert_eq!(
        after - before,
        0,
        "unmark without pressure faults nothing in"
    );
}

#[test]
fn unmark_pins_pages_against_forced_reclaim() {
    // One at a time: the kernel merges neighbouring test mappings into one VMA, whose smaps
    // counters (LazyFree) would then include another test's pages.
    let _serial = serial();
    let m = Mapping::new(128 * page_size());
    fill(m.ptr, m.len, 3);
    // SAFETY: test-owned memory; ours.
    unsafe { mark_volatile(m.ptr, m.len).unwrap() };
    assert!(
        lazy_free_kb(m.ptr) >= (m.len as u64 / 1024) - 31 * 4,
        "marked pages are lazy-free"
    );
    // SAFETY: test-owned memory; ours.
    assert_eq!(unsafe { unmark(m.ptr, m.len).unwrap() }.purged, 0);
    assert_eq!(
        lazy_free_kb(m.ptr),
        0,
        "unmarked pages are no longer lazy-free"
    );
    force_purge(m.ptr, m.len);
    assert!(
        check(m.ptr, m.len, 3),
        "pinned data survives a forced reclaim"
    );
}

#[test]
fn region_thp_purge_and_pin() {
    // One at a time: the kernel merges neighbouring test mappings into one VMA, whose smaps
    // counters (LazyFree) would then include another test's pages.
    let _serial = serial();
    pin_cpu();
    let region = Region::new(8 << 20).unwrap();
    fill(region.as_ptr(), region.len(), 4);
    // SAFETY: test-owned memory; no reference into the region.
    unsafe { region.mark_volatile(0, 4 << 20).unwrap() };
    force_purge(region.as_ptr(), 2 << 20);
    let report = region.unmark(0, region.len()).unwrap();
    assert_eq!(report.volatile, (4 << 20) / page_size());
    assert_eq!(report.purged, (2 << 20) / page_size());
    assert!(is_zero(region.as_ptr(), 2 << 20));
    assert!(
        check_at(region.as_ptr(), 2 << 20, 6 << 20, 4),
        "the rest is intact"
    );
    assert_eq!(region.volatile_pages(0, region.len()).unwrap(), 0);
}
