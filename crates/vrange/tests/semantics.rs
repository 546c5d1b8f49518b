//! The defined behaviour of repeated, partial and overlapping calls, and of writes into
//! volatile memory (the semantics table in docs/DESIGN.md).

mod common;
use common::{force_purge, pin_cpu, Mapping};
use vrange::{mark_volatile, page_size, unmark, volatile_pages, Region};
use vrange_testkit::pattern::{check, check_at, fill, is_zero};

fn mark(m: &Mapping, first: usize, pages: usize) -> usize {
    // SAFETY: test-owned memory; the mapping is ours and unreferenced.
    unsafe { mark_volatile(m.page(first), pages * page_size()).unwrap() }
}

fn pin(m: &Mapping, first: usize, pages: usize) -> vrange::Unmarked {
    // SAFETY: test-owned memory; ours.
    unsafe { unmark(m.page(first), pages * page_size()).unwrap() }
}

#[test]
fn remarking_keeps_a_purge_until_the_next_unmark() {
    let m = Mapping::new(8 * page_size());
    fill(m.ptr, m.len, 10);
    mark(&m, 0, 8);
    force_purge(m.page(2), page_size());
    // Marking again must not forget that page 2 was lost.
    assert_eq!(mark(&m, 0, 8), 8 * page_size());
    assert_eq!(pin(&m, 0, 8).purged, 1);
    // Reported once: a second unmark finds everything pinned.
    assert_eq!(
        pin(&m, 0, 8),
        vrange::Unmarked {
            pages: 8,
            volatile: 0,
            purged: 0
        }
    );
}

#[test]
fn unmarking_pinned_memory_reports_intact() {
    let m = Mapping::new(4 * page_size());
    fill(m.ptr, m.len, 11);
    assert_eq!(
        pin(&m, 0, 4),
        vrange::Unmarked {
            pages: 4,
            volatile: 0,
            purged: 0
        }
    );
    assert!(check(m.ptr, m.len, 11));
}

#[test]
fn a_pin_overlapping_any_purged_page_reports_purged() {
    let m = Mapping::new(16 * page_size());
    fill(m.ptr, m.len, 12);
    mark(&m, 0, 8);
    mark(&m, 8, 8);
    force_purge(m.page(7), page_size());
    // Overlaps the first marked range by one purged page only.
    let r = pin(&m, 7, 2);
    assert_eq!((r.volatile, r.purged), (2, 1));
    // The rest of each range is still volatile; partial unmarks leave it so.
    assert_eq!(volatile_pages(m.ptr, m.len).unwrap(), 14);
    assert_eq!(pin(&m, 0, 16).purged, 0);
    assert!(check_at(m.ptr, 0, 7 * page_size(), 12));
    assert!(is_zero(m.page(7), page_size()));
    assert!(check_at(m.ptr, 8 * page_size(), 8 * page_size(), 12));
}

#[test]
fn a_write_into_a_volatile_page_keeps_the_page_and_the_write() {
    let m = Mapping::new(4 * page_size());
    fill(m.ptr, m.len, 13);
    mark(&m, 0, 4);
    // SAFETY: test-owned memory; writing into our own volatile page.
    unsafe { m.page(1).add(100).write(0xAB) };
    force_purge(m.ptr, m.len);
    let r = pin(&m, 0, 4);
    assert_eq!(
        r.purged, 3,
        "the written page survived, the others were discarded"
    );
    // SAFETY: test-owned memory; ours.
    assert_eq!(unsafe { m.page(1).add(100).read() }, 0xAB);
    assert!(check_at(m.ptr, page_size(), 100 & !7, 13));
}

#[test]
fn volatile_memory_reads_its_original_bytes_until_purged() {
    let m = Mapping::new(32 * page_size());
    fill(m.ptr, m.len, 14);
    mark(&m, 0, 32);
    for _ in 0..3 {
        assert!(
            check(m.ptr, m.len, 14),
            "no marker or bookkeeping is written into user pages"
        );
    }
    force_purge(m.ptr, m.len);
    assert!(is_zero(m.ptr, m.len));
    assert_eq!(pin(&m, 0, 32).purged, 32);
}

#[test]
fn zero_pages_lose_nothing_and_are_reported_intact() {
    let m = Mapping::new(8 * page_size());
    // Pages 0..4 untouched, 4..8 written then zeroed: all content is zero.
    // SAFETY: test-owned memory; ours.
    unsafe { m.page(4).write_bytes(0, 4 * page_size()) };
    mark(&m, 0, 8);
    force_purge(m.ptr, m.len);
    let r = pin(&m, 0, 8);
    assert_eq!((r.volatile, r.purged), (8, 0));
    assert!(is_zero(m.ptr, m.len));
}

#[test]
fn zero_length_does_nothing() {
    let m = Mapping::new(page_size());
    // SAFETY: test-owned memory; ours.
    unsafe {
        assert_eq!(mark_volatile(m.ptr, 0), Ok(0));
        assert_eq!(unmark(m.ptr, 0).unwrap(), vrange::Unmarked::default());
        // madvise accepts a zero length anywhere aligned, even unmapped.
        assert_eq!(mark_volatile(std::ptr::null_mut(), 0), Ok(0));
    }
    assert_eq!(volatile_pages(m.ptr, m.len).unwrap(), 0);
}

#[test]
fn region_drop_forgets_its_state() {
    pin_cpu();
    let region = Region::new(64 * page_size()).unwrap();
    let addr = region.as_ptr() as usize;
    // SAFETY: test-owned memory; no reference into the region.
    unsafe { region.mark_volatile(0, region.len()).unwrap() };
    drop(region);
    assert_eq!(
        volatile_pages(addr as *const u8, 64 * page_size()).unwrap(),
        0
    );
}

#[test]
fn huge_sparse_range_crosses_table_leaves() {
    // 4 GiB spans several 1 GiB leaves of the page-state table; only a few pages are touched.
    pin_cpu();
    let region = Region::new(4 << 30).unwrap();
    let touched: Vec<usize> = (0..16).map(|i| i * (256 << 20) + 4096 * i).collect();
    for &off in &touched {
        // SAFETY: test-owned memory; inside the region.
        unsafe { region.as_ptr().add(off).write(0x5A) };
    }
    // SAFETY: test-owned memory; no reference into the region.
    unsafe { region.mark_volatile(0, region.len()).unwrap() };
    force_purge(region.as_ptr(), region.len());
    let r = region.unmark(0, region.len()).unwrap();
    assert_eq!(r.pages, (4 << 30) / page_size());
    assert_eq!(
        r.purged,
        touched.len(),
        "exactly the pages that held data are lost"
    );
}

#[test]
fn regression_reused_address_inherits_no_stale_purge_after_forget() {
    // Memory unmapped while volatile, then mapped again at the same address: without forget()
    // the stale witness reads zero in the fresh page and a later unmark reports a false purge.
    let page = page_size();
    let first = Mapping::new(4 * page);
    fill(first.ptr, first.len, 30);
    mark(&first, 0, 4);
    let addr = first.ptr;
    drop(first); // Mapping's drop calls vrange::forget before munmap
    let again = vrange_sys::mem::map_anon(4 * page, page).unwrap();
    if again.as_ptr() == addr {
        // SAFETY: test-owned memory; fresh memory of ours.
        let r = unsafe { unmark(again.as_ptr(), 4 * page).unwrap() };
        assert_eq!((r.volatile, r.purged), (0, 0));
    }
    assert_eq!(volatile_pages(addr, 4 * page).unwrap(), 0);
    // SAFETY: test-owned memory; ours.
    unsafe { vrange_sys::mem::unmap(again, 4 * page) };
}
