//! The one-pin proof of a whole 2 MiB huge page (`huge_proof`): every way the kernel can take
//! a huge page apart between mark and unmark, one at a time and then raced.
//!
//! A naive check ("one PMD maps the block at unmark, so its first witness speaks for it") is
//! wrong in one case: the kernel splits the huge page, discards some of its pages, and
//! khugepaged (here MADV_COLLAPSE) builds a new huge page with zeros where they were. The
//! `split_purged_in_part_and_collapsed` case is that one; it uses the fast path and must still
//! count the lost page.

mod common;
use common::{force_purge, pin_cpu, quiet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use vrange::{page_size, stats, Huge, Region};
use vrange_sys::mem::{self, HUGE_PAGE};
use vrange_sys::pagemap;
use vrange_testkit::pattern::{check_at, fill, is_zero};

/// Whether one PMD maps each 2 MiB block of `[ptr, ptr + len)`.
fn all_huge(ptr: *mut u8, len: usize) -> bool {
    let mut covered = 0;
    let asked = pagemap::huge_runs(ptr as usize, ptr as usize + len, |s, e| covered += e - s);
    asked.expect("PAGEMAP_SCAN") && covered == len
}

/// A region of `blocks` huge pages, written with pattern `seed`; `None` (skipped) when the
/// kernel has no huge pages for it.
fn huge_region(blocks: usize, seed: u64) -> Option<Region> {
    pin_cpu();
    let region = Region::with_huge(blocks * HUGE_PAGE, Huge::Always).unwrap();
    fill(region.as_ptr(), region.len(), seed);
    if !pagemap::has_pagemap_scan() {
        vrange_testkit::skip_lacking(
            "PAGEMAP_SCAN (Linux 6.7)",
            !vrange::features().pagemap_scan,
            "huge pages cannot be proved intact by their runs",
        );
        return None;
    }
    if !all_huge(region.as_ptr(), region.len()) {
        vrange_testkit::skip("the kernel gave the region no huge pages");
        return None;
    }
    Some(region)
}

/// Pages of the block at `off` that read zero, and whether the others hold pattern `seed`.
fn zero_pages(region: &Region, off: usize, len: usize, seed: u64) -> (usize, bool) {
    let page = page_size();
    let mut zero = 0;
    let mut intact = true;
    for p in (off..off + len).step_by(page) {
        if is_zero(region.as_ptr().wrapping_add(p), page) {
            zero += 1;
        } else {
            intact &= check_at(region.as_ptr(), p, page, seed);
        }
    }
    (zero, intact)
}

#[test]
fn one_pin_proves_each_kind_of_block() {
    quiet();
    let _serial = vrange_testkit::serial();
    let Some(region) = huge_region(5, 11) else {
        return;
    };
    let base = region.as_ptr();
    let page = page_size();
    let pages = HUGE_PAGE / page;
    // SAFETY: test-owned memory; no reference into the region.
    unsafe { region.mark_volatile(0, region.len()).unwrap() };
    // Block 0: untouched. Block 1: discarded whole. Block 2: split, one page discarded.
    // Block 3: split, one page discarded, collapsed again. Block 4: collapsed, nothing lost.
    force_purge(base.wrapping_add(HUGE_PAGE), HUGE_PAGE);
    force_purge(base.wrapping_add(2 * HUGE_PAGE + 7 * page), page);
    force_purge(base.wrapping_add(3 * HUGE_PAGE + 300 * page), page);
    assert!(!all_huge(base.wrapping_add(2 * HUGE_PAGE), 2 * HUGE_PAGE));
    mem::collapse_huge(base.wrapping_add(3 * HUGE_PAGE), 2 * HUGE_PAGE).expect("MADV_COLLAPSE");
    assert!(
        all_huge(base.wrapping_add(3 * HUGE_PAGE), 2 * HUGE_PAGE),
        "collapsed blocks are huge again"
    );

    let before = stats().huge_proofs;
    let report = region.unmark(0, region.len()).unwrap();
    let proofs = stats().huge_proofs - before;
    let expected = [0, pages, 1, 1, 0];
    for (b, &want) in expected.iter().enumerate() {
        let (zero, intact) = zero_pages(&region, b * HUGE_PAGE, HUGE_PAGE, 11);
        assert_eq!(zero, want, "block {b}: pages lost");
        assert!(intact, "block {b}: a page neither zero nor intact");
    }
    assert_eq!(report.volatile, 5 * pages);
    assert_eq!(report.purged, pages + 2, "exact count of lost pages");
    // Blocks 0, 3 and 4 are one PMD at unmark. Block 2 is split; block 1 too: reclaim
    // discards a huge page by splitting its PMD (not the folio), so the pin faults in one
    // 4 KiB page under an empty table and the block goes page by page.
    assert_eq!(proofs, 3, "blocks proven with one pin");
}

#[test]
fn partial_unmarks_and_zero_blocks_go_page_by_page() {
    quiet();
    let _serial = vrange_testkit::serial();
    let Some(region) = huge_region(2, 12) else {
        return;
    };
    let page = page_size();
    // Block 1 all zero: nothing to prove, no pin.
    // SAFETY: test-owned memory; no reference into it.
    unsafe { std::ptr::write_bytes(region.as_ptr().add(HUGE_PAGE), 0, HUGE_PAGE) };
    // SAFETY: as above.
    unsafe { region.mark_volatile(0, region.len()).unwrap() };
    let before = stats().huge_proofs;
    // Part of block 0 first: no whole block in the span.
    let r = region.unmark(page, 100 * page).unwrap();
    assert_eq!((r.volatile, r.purged), (100, 0));
    let r = region.unmark(0, region.len()).unwrap();
    assert_eq!((r.volatile, r.purged), (2 * HUGE_PAGE / page - 100, 0));
    // Block 0 was whole in the second span; block 1 had no witness to pin.
    assert_eq!(stats().huge_proofs - before, 1);
    let (zero, intact) = zero_pages(&region, 0, HUGE_PAGE, 12);
    assert_eq!((zero, intact), (0, true));
}

/// Race test, not a benchmark: a worker marks and unmarks whole huge pages and checks every
/// answer against the content, while an adversary on the other CPU pages out whole blocks and
/// single pages (splitting the huge pages) and collapses blocks again.
#[test]
fn race_against_split_pageout_and_collapse() {
    quiet();
    let _serial = vrange_testkit::serial();
    const BLOCKS: usize = 8;
    const ROUNDS: usize = 400;
    let Some(region) = huge_region(BLOCKS, 0) else {
        return;
    };
    let region = Arc::new(region);
    let page = page_size();
    let stop = Arc::new(AtomicBool::new(false));
    let moves = Arc::new(AtomicUsize::new(0));
    let adversary = {
        let (region, stop, moves) = (region.clone(), stop.clone(), moves.clone());
        std::thread::spawn(move || {
            let mut rng = 0x9E37_79B9_7F4A_7C15u64;
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let block = region
                    .as_ptr()
                    .wrapping_add((rng as usize % BLOCKS) * HUGE_PAGE);
                let _ = match rng >> 60 {
                    0..=5 => mem::reclaim_now(block, HUGE_PAGE),
                    6..=11 => {
                        let p =
                            block.wrapping_add((rng >> 20) as usize % (HUGE_PAGE / page) * page);
                        mem::reclaim_now(p, page)
                    }
                    _ => mem::collapse_huge(block, HUGE_PAGE),
                };
                moves.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let before = stats().huge_proofs;
    let (mut purged, mut wrong) = (0, 0);
    for round in 0..ROUNDS {
        let seed = 100 + round as u64;
        fill(region.as_ptr(), region.len(), seed);
        // SAFETY: test-owned memory; no reference into the region.
        unsafe { region.mark_volatile(0, region.len()).unwrap() };
        // Let the adversary act on volatile memory for a moment; half the rounds also discard
        // from this CPU, where the marks' per-CPU batch is.
        std::thread::sleep(std::time::Duration::from_micros(200));
        if round % 2 == 0 {
            let b = round / 2 % BLOCKS;
            force_purge(
                region
                    .as_ptr()
                    .wrapping_add(b * HUGE_PAGE + (round % 512) * page),
                page,
            );
        }
        let r = region.unmark(0, region.len()).unwrap();
        let (zero, intact) = zero_pages(&region, 0, region.len(), seed);
        if r.purged != zero || !intact {
            wrong += 1;
            eprintln!(
                "round {round}: reported {} purged, {zero} pages read zero, intact {intact}",
                r.purged
            );
        }
        purged += r.purged;
    }
    stop.store(true, Ordering::Relaxed);
    adversary.join().unwrap();
    let proofs = stats().huge_proofs - before;
    println!(
        "{ROUNDS} rounds of {BLOCKS} huge pages: {purged} pages purged, {proofs} blocks proven \
         with one pin, {} adversary moves, {wrong} wrong answers",
        moves.load(Ordering::Relaxed)
    );
    assert_eq!(wrong, 0, "unmark answers contradicted the content");
    assert!(purged > 0, "nothing was purged: the race was not exercised");
    assert!(
        proofs > 0,
        "no block was proven with one pin: the fast path was not exercised"
    );
    assert!(
        (proofs as usize) < ROUNDS * BLOCKS,
        "every block was one PMD at unmark: the adversary never split one in time"
    );
}
