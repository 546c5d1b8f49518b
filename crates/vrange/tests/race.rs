//! Race test, not a benchmark: worker threads mark, unmark and verify while a purger thread
//! forces reclaim (MADV_PAGEOUT) over the same memory in a loop. Every unmark answer is checked
//! against the content: a page reported intact must hold its pattern, and the purged count of
//! a range must equal the number of its pages that read zero. Deterministic in what it checks,
//! not in which pages the kernel happens to discard.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use vrange::{page_size, Huge, Region};
use vrange_testkit::pattern::{check_at, fill, is_zero};

const CHECKS: usize = 1_000_000;

struct Outcome {
    checks: usize,
    purged: usize,
    wrong: usize,
}

/// One worker: owns `pages` pages at `base`; each round writes a fresh pattern, marks the whole
/// slice, and unmarks it either page by page or in random sub-ranges, checking every answer.
fn worker(region: &Region, first_page: usize, pages: usize, rounds: usize, seed: u64) -> Outcome {
    let page = page_size();
    let off = first_page * page;
    let base = region.as_ptr().wrapping_add(off);
    let mut out = Outcome {
        checks: 0,
        purged: 0,
        wrong: 0,
    };
    let mut rng = seed | 1;
    for round in 0..rounds {
        let s = seed.wrapping_mul(1000).wrapping_add(round as u64);
        fill(base, pages * page, s);
        // SAFETY: test-owned memory; this worker owns its slice and holds no reference into it.
        unsafe { region.mark_volatile(off, pages * page).unwrap() };
        let mut p = 0;
        while p < pages {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let n = if round % 2 == 0 {
                1
            } else {
                1 + (rng as usize % 16).min(pages - p - 1)
            };
            let r = region.unmark(off + p * page, n * page).unwrap();
            let zero = (p..p + n)
                .filter(|&q| is_zero(base.wrapping_add(q * page), page))
                .count();
            let intact = (p..p + n)
                .filter(|&q| check_at(base, q * page, page, s))
                .count();
            // Exact: purged pages read zero, every other page holds its pattern.
            if r.purged != zero || zero + intact != n {
                out.wrong += 1;
            }
            out.purged += r.purged;
            out.checks += n;
            p += n;
        }
    }
    out
}

fn run(huge: Huge, label: &str) {
    let threads = 2;
    let pages_per_thread = 512;
    let page = page_size();
    let region = Arc::new(Region::with_huge(threads * pages_per_thread * page, huge).unwrap());
    let rounds = CHECKS.div_ceil(threads * pages_per_thread);
    let stop = Arc::new(AtomicBool::new(false));
    let passes = Arc::new(AtomicUsize::new(0));
    let purger = {
        let (region, stop, passes) = (region.clone(), stop.clone(), passes.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Plain MADV_PAGEOUT: which pages it catches does not matter here.
                let _ = vrange_sys::mem::reclaim_now(region.as_ptr(), region.len());
                passes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let region = region.clone();
            std::thread::spawn(move || {
                worker(
                    &region,
                    t * pages_per_thread,
                    pages_per_thread,
                    rounds,
                    7 + t as u64,
                )
            })
        })
        .collect();
    let outcomes: Vec<Outcome> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    purger.join().unwrap();
    let checks: usize = outcomes.iter().map(|o| o.checks).sum();
    let purged: usize = outcomes.iter().map(|o| o.purged).sum();
    let wrong: usize = outcomes.iter().map(|o| o.wrong).sum();
    println!(
        "{label}: {checks} page checks, {purged} purged, {wrong} wrong, {} purger passes",
        passes.load(Ordering::Relaxed)
    );
    assert!(checks >= CHECKS);
    assert_eq!(wrong, 0, "{label}: unmark answers contradicted the content");
    assert!(
        purged > 0,
        "{label}: the purger never purged anything; the race was not exercised"
    );
}

#[test]
fn race_4k_pages() {
    run(Huge::Never, "4 KiB");
}

#[test]
fn race_thp() {
    run(Huge::Always, "THP");
}
