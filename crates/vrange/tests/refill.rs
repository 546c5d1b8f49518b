//! Refill regions on the real kernel: every byte read is what the fill function makes, blocks
//! are made on first touch and again after the system took them back (forced with
//! MADV_DONTNEED, and by real pressure in a memory cgroup a quarter of the region's size,
//! without an OOM kill, the fills near the limit recycling the oldest blocks: moved into place
//! where the kernel moves pages, copied with moves off or for pages shared with a fork child),
//! threads touching blocks at once, and a failing fill raising SIGBUS at the address touched.

#[macro_use]
mod common;

use common::{generate, next, read_word, refill_or_skip};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;
use vrange::{Error, RefillRegion};
use vrange_testkit::pattern::pattern;
use vrange_testkit::{serial, skip};

const KIB: usize = 1 << 10;
const BLOCK: usize = 64 * KIB;

/// The generator: word `i` of the region.
fn word(seed: u64, i: usize) -> u64 {
    pattern(seed, i)
}

/// A region of `len` bytes made by the generator, counting its fills; None (with a printed
/// reason) without userfaultfd.
fn region(len: usize, seed: u64) -> Option<(RefillRegion, Arc<AtomicUsize>)> {
    let fills = Arc::new(AtomicUsize::new(0));
    let counted = fills.clone();
    let r = refill_or_skip(RefillRegion::new(len, BLOCK, move |offset, buf| {
        counted.fetch_add(1, SeqCst);
        generate(seed, offset, buf);
        true
    }))?;
    Some((r, fills))
}

#[test]
fn blocks_are_made_on_first_touch_and_again_after_they_were_taken() {
    let _s = serial();
    let Some((r, fills)) = region(16 * BLOCK, 3) else {
        return;
    };
    let words = BLOCK / 8;
    assert_eq!(
        fills.load(SeqCst),
        0,
        "nothing is made before it is touched"
    );
    assert_eq!(read_word(&r, 5 * words + 17), word(3, 5 * words + 17));
    assert_eq!(fills.load(SeqCst), 1, "one fill for the block");
    for i in 5 * words..6 * words {
        assert_eq!(read_word(&r, i), word(3, i));
    }
    assert_eq!(
        fills.load(SeqCst),
        1,
        "the block was installed whole: no more fills"
    );
    let before = vrange::stats();
    // Take block 5 back as the system would (the pages go; the registration stays).
    let block5 = r.as_ptr().wrapping_add(5 * BLOCK);
    // SAFETY: the region's content is the generator's: nothing is lost.
    unsafe { vrange_sys::mem::purge_forced(block5, BLOCK) }.unwrap();
    assert_eq!(read_word(&r, 6 * words - 1), word(3, 6 * words - 1));
    assert_eq!(fills.load(SeqCst), 2, "made again after it was taken");
    let after = vrange::stats();
    assert_eq!(after.refill_fills - before.refill_fills, 1);
    assert_eq!(after.refill_bytes - before.refill_bytes, BLOCK as u64);
}

#[test]
fn a_page_taken_from_a_block_is_made_again_without_touching_the_rest() {
    let _s = serial();
    let Some((r, fills)) = region(4 * BLOCK, 4) else {
        return;
    };
    let page = vrange::page_size();
    let words = BLOCK / 8;
    for i in 0..words {
        assert_eq!(read_word(&r, i), word(4, i));
    }
    // The program wrote into one page of the block; the kernel takes another.
    // SAFETY: inside the region.
    unsafe { (r.as_ptr() as *mut u64).write_volatile(99) };
    // SAFETY: the region's content is the generator's (the written page is not touched).
    unsafe { vrange_sys::mem::purge_forced(r.as_ptr().wrapping_add(3 * page), page) }.unwrap();
    assert_eq!(read_word(&r, 3 * page / 8), word(4, 3 * page / 8));
    assert_eq!(fills.load(SeqCst), 2);
    assert_eq!(
        read_word(&r, 0),
        99,
        "a present page is kept when its block is made again"
    );
}

#[test]
fn threads_touching_blocks_at_once_each_read_the_generator() {
    let _s = serial();
    let Some((r, fills)) = region(32 * BLOCK, 5) else {
        return;
    };
    let r = &r;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            s.spawn(move || {
                let mut dice = 0x9e37_79b9 + t;
                for _ in 0..500 {
                    let i = next(&mut dice) as usize % (r.len() / 8);
                    assert_eq!(read_word(r, i), word(5, i), "thread {t}, word {i}");
                }
            });
        }
    });
    assert!(
        fills.load(SeqCst) <= 32,
        "each block made once without pressure"
    );
}

// ---- A fill that fails ----

static SIGNALS: AtomicUsize = AtomicUsize::new(0);
static SIG_ADDR: AtomicUsize = AtomicUsize::new(0);
static SEED: AtomicU64 = AtomicU64::new(0);
static BASE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    SIGNALS.fetch_add(1, SeqCst);
    SIG_ADDR.store(addr, SeqCst);
    // Place the page's content ourselves.
    let page = vrange::page_size();
    let at = addr & !(page - 1);
    let mut buf = [0u8; 4096];
    generate(SEED.load(SeqCst), at - BASE.load(SeqCst), &mut buf[..page]);
    // SAFETY: buf holds a page; the page belongs to the test's refill region.
    let _ = unsafe { vrange::fill(at as *mut u8, buf.as_ptr(), page) };
}

#[test]
fn a_failing_fill_raises_sigbus_at_the_address_and_a_handler_may_place_the_page() {
    let _s = serial();
    let failures = Arc::new(AtomicUsize::new(0));
    let f = failures.clone();
    let r = match RefillRegion::new(8 * BLOCK, BLOCK, move |offset, buf| {
        if offset == 2 * BLOCK {
            f.fetch_add(1, SeqCst);
            return false;
        }
        generate(6, offset, buf);
        true
    }) {
        Ok(r) => r,
        Err(Error::Os(libc::ENOTSUP)) => return skip("userfaultfd is not available"),
        Err(e) => panic!("RefillRegion::new: {e}"),
    };
    SEED.store(6, SeqCst);
    BASE.store(r.as_ptr() as usize, SeqCst);
    vrange_testkit::signal::on_sigbus(on_sigbus);
    let before = vrange::stats().refill_failures;
    let i = (2 * BLOCK + 3 * 4096 + 40) / 8;
    assert_eq!(read_word(&r, i), word(6, i), "the handler placed the page");
    assert_eq!(SIGNALS.load(SeqCst), 1);
    assert_eq!(SIG_ADDR.load(SeqCst), r.as_ptr() as usize + i * 8);
    assert_eq!(failures.load(SeqCst), 1);
    assert_eq!(vrange::stats().refill_failures - before, 1);
    // Other blocks fill as usual.
    assert_eq!(read_word(&r, 0), word(6, 0));
    vrange_testkit::signal::default_sigbus();
}

#[test]
fn bad_arguments_are_refused_and_from_raw_names_live_regions_only() {
    let _s = serial();
    let page = vrange::page_size();
    common::refill_refuses_bad_arguments(|len, block| RefillRegion::new(len, block, |_, _| true));
    let Some((r, _)) = region(4 * BLOCK, 7) else {
        return;
    };
    let (ptr, len) = r.into_raw();
    // SAFETY: probing: a wrong length names no region.
    let wrong = unsafe { RefillRegion::from_raw(ptr, len + page) };
    assert_eq!(wrong.err(), Some(Error::NotRegion));
    // SAFETY: from into_raw, no other handle.
    drop(unsafe { RefillRegion::from_raw(ptr, len) }.unwrap());
}

/// Blocks made one after another are lazily freed in runs; the last run goes when the refill thread rests.
#[test]
fn blocks_made_one_after_another_are_lazily_freed_once_the_refill_thread_rests() {
    let _s = serial();
    let Some((r, _)) = region(32 * BLOCK, 12) else {
        return;
    };
    common::assert_lazily_freed_soon(&r, 32 * BLOCK);
}

// ---- Larger than its memory cgroup ----

pressure_tests!("refill-reader", BLOCK, |len| {
    region(len, common::PRESSURE_SEED)
        .expect("a refill region")
        .0
});

#[test]
fn the_refill_thread_leaves_with_the_last_region() {
    let _s = serial();
    let Some((r, _)) = region(4 * BLOCK, 9) else {
        return;
    };
    assert_eq!(read_word(&r, 1), word(9, 1));
    assert!(vrange_testkit::sched::thread_named("vrange-refill").is_some());
    drop(r);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while vrange_testkit::sched::thread_named("vrange-refill").is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the refill thread outlived every region"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A new region starts a new one.
    let Some((r, _)) = region(4 * BLOCK, 10) else {
        return;
    };
    assert_eq!(read_word(&r, 2), word(10, 2));
}

/// A program that closes every descriptor above its own (closefrom) takes vrange's userfaultfd
/// with them, and the kernel drops the regions' registrations: missing pages read zero. The
/// next refill region opens a new descriptor, and the refill thread registers the live regions
/// on it again.
#[test]
fn regions_are_registered_again_after_the_program_closed_the_descriptor() {
    let _s = serial();
    // The refill thread registers the first region again once its poll on the old descriptor
    // returns (within its one-second timeout).
    common::registered_again_after_closefrom(
        BLOCK,
        |seed| region(4 * BLOCK, seed).map(|(r, _)| r),
        Duration::from_secs(5),
    );
}
