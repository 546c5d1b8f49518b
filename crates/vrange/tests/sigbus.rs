//! SIGBUS mode on the real kernel, the design's table cell by cell: a purged page of a range
//! that is still volatile raises SIGBUS at its address (and a handler that places content with
//! `vrange::fill` lets the access continue); pages never purged and pinned memory never
//! signal; after unmark, purged pages read zero with no signal. For managed, hybrid and lazy
//! regions and the classic call on ordinary memory; several threads at once; a fork child.
//!
//! Purges are forced: `vrange::purge` for managed ranges, MADV_PAGEOUT of lazily freed pages
//! on the kernel path (the thread pinned to its CPU, see `common::force_purge`). The handler
//! is this test's own (vrange installs none): it regenerates the page from the pattern the test
//! wrote, counts the signal and records its address.

mod common;
use common::{force_purge, pin_cpu, quiet, Mapping};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::Duration;
use vrange::{Error, Options, Policy, VolatileRegion};
use vrange_testkit::fork::fork_linked;
use vrange_testkit::pattern::{check_at, fill, is_zero, pattern};
use vrange_testkit::proc::Exit;
use vrange_testkit::{serial, skip};

const PAGES: usize = 16;

/// The memory the handler serves: signals elsewhere are not ours (default action).
static BASE: AtomicUsize = AtomicUsize::new(0);
static LEN: AtomicUsize = AtomicUsize::new(0);
static SEED: AtomicU64 = AtomicU64::new(0);
static SIGNALS: AtomicUsize = AtomicUsize::new(0);
static LAST_ADDR: AtomicUsize = AtomicUsize::new(0);
static FILL_FAILED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let (base, len) = (BASE.load(SeqCst), LEN.load(SeqCst));
    if addr < base || addr >= base + len {
        // Not ours: die of it as without a handler (returning re-raises the fault).
        return vrange_testkit::signal::default_sigbus();
    }
    SIGNALS.fetch_add(1, SeqCst);
    LAST_ADDR.store(addr, SeqCst);
    let page = vrange::page_size();
    let at = addr & !(page - 1);
    // The page's content as the test wrote it, regenerated on this thread's stack.
    let mut buf = [0u64; 512];
    let first_word = (at - base) / 8;
    for (i, w) in buf.iter_mut().enumerate().take(page / 8) {
        *w = pattern(SEED.load(SeqCst), first_word + i);
    }
    // SAFETY: buf holds a page; the page is the test's SIGBUS-mode memory.
    if unsafe { vrange::fill(at as *mut u8, buf.as_ptr().cast(), page) }.is_err() {
        FILL_FAILED.fetch_add(1, SeqCst);
        vrange_testkit::signal::default_sigbus();
    }
}

/// Installs the handler (once) and points it at `[base, base + len)`, filled with `seed`.
fn serve(base: *mut u8, len: usize, seed: u64) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| vrange_testkit::signal::on_sigbus(on_sigbus));
    SEED.store(seed, SeqCst);
    BASE.store(base as usize, SeqCst);
    LEN.store(len, SeqCst);
    SIGNALS.store(0, SeqCst);
    FILL_FAILED.store(0, SeqCst);
}

/// A SIGBUS-mode region, or None (with a printed reason) without userfaultfd.
fn region(policy: Policy) -> Option<VolatileRegion> {
    let opts = Options {
        policy,
        sigbus: true,
        ..Options::default()
    };
    match VolatileRegion::new(PAGES * vrange::page_size(), opts) {
        Ok(r) => Some(r),
        Err(Error::Os(libc::ENOTSUP)) => {
            skip("userfaultfd with UFFD_FEATURE_SIGBUS is not available to this process");
            None
        }
        Err(e) => panic!("a SIGBUS region: {e}"),
    }
}

fn read(p: *const u8, page: usize) -> u64 {
    // SAFETY: test-owned memory.
    unsafe { (p.wrapping_add(page * vrange::page_size()) as *const u64).read_volatile() }
}

/// The table for a managed (or hybrid: purged as managed) SIGBUS region.
fn managed_table(policy: Policy) {
    let _s = serial();
    quiet();
    let Some(r) = region(policy) else { return };
    let page = vrange::page_size();
    let (p, len) = (r.as_ptr(), r.len());
    fill(p, len, 31);
    serve(p, len, 31);

    // Not purged: original content, no signal.
    // SAFETY: no reference into the region is held while it is volatile.
    unsafe { r.mark().unwrap() };
    assert!(check_at(p, 0, len, 31));
    assert_eq!(
        SIGNALS.load(SeqCst),
        0,
        "a page never purged does not signal"
    );
    assert!(!r.unmark().unwrap().was_purged());

    // Purged and still volatile: SIGBUS at the address; the handler's fill lets it continue.
    // SAFETY: as above.
    unsafe { r.mark().unwrap() };
    assert_eq!(vrange::purge(usize::MAX), len);
    let addr = p.wrapping_add(3 * page + 24);
    // SAFETY: test-owned memory; the handler places the page's content.
    let v = unsafe { (addr as *const u64).read_volatile() };
    assert_eq!(
        v,
        pattern(31, (3 * page + 24) / 8),
        "the access continued after the fill"
    );
    assert_eq!(SIGNALS.load(SeqCst), 1);
    assert_eq!(
        LAST_ADDR.load(SeqCst),
        addr as usize,
        "si_addr is the address touched"
    );
    // A write faults too, and continues.
    // SAFETY: as above.
    unsafe { (p.wrapping_add(5 * page) as *mut u64).write_volatile(7) };
    assert_eq!(SIGNALS.load(SeqCst), 2);
    assert_eq!(read(p, 5), 7);

    // Unmarked after the purge: reported; purged pages read zero with no signal; the pages the
    // handler placed keep what it placed.
    let u = r.unmark().unwrap();
    assert!(u.was_purged());
    for i in 0..PAGES {
        let pg = p.wrapping_add(i * page);
        match i {
            3 => assert!(check_at(p, 3 * page, page, 31)),
            5 => assert_eq!(read(p, 5), 7),
            _ => assert!(is_zero(pg, page), "page {i} reads zero after the unmark"),
        }
    }
    assert_eq!(SIGNALS.load(SeqCst), 2, "pinned memory never signals");
    // Pinned and purged by nobody: writes and reads, no signal.
    fill(p, len, 32);
    assert!(check_at(p, 0, len, 32));
    assert_eq!(SIGNALS.load(SeqCst), 2);
    assert_eq!(FILL_FAILED.load(SeqCst), 0);
}

#[test]
fn managed_sigbus_region_follows_the_table() {
    managed_table(Policy::Managed);
}

#[test]
fn hybrid_sigbus_region_follows_the_table() {
    managed_table(Policy::Hybrid);
}

/// Issue 20: after the handler placed one page of a purged managed SIGBUS range with
/// `vrange::fill`, the unmark reported all 16 pages purged (the kernel path, plain memory,
/// reported 15). vrange.h: a page `fill` placed counts as intact at the next unmark.
fn placed_page_counts_as_intact(policy: Policy) {
    let _s = serial();
    quiet();
    let Some(r) = region(policy) else { return };
    let page = vrange::page_size();
    let (p, len) = (r.as_ptr(), r.len());
    fill(p, len, 81);
    serve(p, len, 81);
    // SAFETY: no reference into the region is held while it is volatile.
    unsafe { r.mark().unwrap() };
    assert_eq!(vrange::purge(usize::MAX), len);
    // SAFETY: test-owned memory; the handler places the page's content.
    let v = unsafe { (p.wrapping_add(7 * page) as *const u64).read_volatile() };
    assert_eq!(v, pattern(81, 7 * page / 8));
    assert_eq!(SIGNALS.load(SeqCst), 1);
    let u = r.unmark().unwrap();
    assert_eq!(
        u.purged,
        PAGES - 1,
        "the placed page is intact, the 15 others purged: {u:?}"
    );
    assert!(u.was_purged());
    assert!(
        check_at(p, 7 * page, page, 81),
        "the placed page kept its content"
    );
    assert!(
        is_zero(p, page),
        "a purged page reads zero after the unmark"
    );
    // Purged again, every page placed back before the unmark: nothing was lost.
    fill(p, len, 82);
    serve(p, len, 82);
    // SAFETY: as above.
    unsafe { r.mark().unwrap() };
    assert_eq!(vrange::purge(usize::MAX), len);
    assert!(
        check_at(p, 0, len, 82),
        "every page placed back by the handler"
    );
    assert_eq!(SIGNALS.load(SeqCst), PAGES);
    let u = r.unmark().unwrap();
    assert_eq!(u.purged, 0, "{u:?}");
    assert!(!u.was_purged());
    assert_eq!(FILL_FAILED.load(SeqCst), 0);
}

#[test]
fn managed_sigbus_unmark_counts_a_page_placed_by_fill_as_intact() {
    placed_page_counts_as_intact(Policy::Managed);
}

#[test]
fn hybrid_sigbus_unmark_counts_a_page_placed_by_fill_as_intact() {
    placed_page_counts_as_intact(Policy::Hybrid);
}

/// The kernel path: `mark_volatile_sigbus` on memory vrange did not allocate, or a lazy region.
fn kernel_path_table(p: *mut u8, len: usize, mark: impl Fn() -> Result<usize, Error>) {
    let page = vrange::page_size();
    fill(p, len / 2, 41); // the second half never written: zero, and never signals
    serve(p, len, 41);
    match mark() {
        Ok(n) => assert_eq!(n, len),
        Err(Error::Os(libc::ENOTSUP)) => {
            return skip("userfaultfd with UFFD_FEATURE_SIGBUS is not available to this process")
        }
        Err(e) => panic!("mark in SIGBUS mode: {e}"),
    }
    // Not purged: no signal, original content.
    assert!(check_at(p, 0, len / 2, 41));
    assert!(is_zero(p.wrapping_add(len / 2), len / 2));
    assert_eq!(SIGNALS.load(SeqCst), 0);
    force_purge(p, len);
    let addr = p.wrapping_add(2 * page + 8);
    // SAFETY: test-owned memory; the handler places the page's content.
    let v = unsafe { (addr as *const u64).read_volatile() };
    assert_eq!(v, pattern(41, (2 * page + 8) / 8));
    assert_eq!(SIGNALS.load(SeqCst), 1);
    assert_eq!(LAST_ADDR.load(SeqCst), addr as usize);
    assert!(
        is_zero(p.wrapping_add(len / 2), len / 2),
        "pages never written are zero pages: never discarded, never signal"
    );
    assert_eq!(SIGNALS.load(SeqCst), 1);
    // SAFETY: test-owned memory.
    let u = unsafe { vrange::unmark(p, len) }.unwrap();
    // Every written page but the one placed again was discarded.
    assert_eq!(u.purged, PAGES / 2 - 1, "{u:?}");
    assert!(check_at(p, 2 * page, page, 41));
    assert!(is_zero(p, page), "after unmark a purged page reads zero");
    assert_eq!(SIGNALS.load(SeqCst), 1, "no signal once unmarked");
    assert_eq!(FILL_FAILED.load(SeqCst), 0);
}

#[test]
fn classic_call_in_sigbus_mode_follows_the_table() {
    let _s = serial();
    let m = Mapping::new(PAGES * vrange::page_size());
    let (p, len) = (m.ptr, m.len);
    // SAFETY: test-owned memory, no reference held into it while volatile.
    kernel_path_table(p, len, || unsafe { vrange::mark_volatile_sigbus(p, len) });
}

#[test]
fn lazy_sigbus_region_follows_the_table() {
    let _s = serial();
    quiet();
    pin_cpu();
    let Some(r) = region(Policy::Lazy) else {
        return;
    };
    let (p, len) = (r.as_ptr(), r.len());
    // SAFETY: as above.
    kernel_path_table(p, len, || unsafe { r.mark() }.map(|()| len));
}

#[test]
fn threads_touching_different_purged_pages_each_get_their_page() {
    let _s = serial();
    quiet();
    let Some(r) = region(Policy::Managed) else {
        return;
    };
    let page = vrange::page_size();
    let (p, len) = (r.as_ptr(), r.len());
    fill(p, len, 51);
    serve(p, len, 51);
    // SAFETY: no reference into the region is held while it is volatile.
    unsafe { r.mark().unwrap() };
    assert_eq!(vrange::purge(usize::MAX), len);
    let base = p as usize;
    let barrier = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for t in 0..4 {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                let off = (2 + 3 * t) * page;
                assert!(check_at(base as *const u8, off, page, 51), "thread {t}");
            });
        }
    });
    assert_eq!(
        SIGNALS.load(SeqCst),
        4,
        "one signal per purged page touched"
    );
    assert!(r.unmark().unwrap().was_purged());
}

#[test]
fn a_fork_child_reads_purged_pages_as_zero() {
    let _s = serial();
    quiet();
    let Some(r) = region(Policy::Managed) else {
        return;
    };
    let (p, len) = (r.as_ptr(), r.len());
    fill(p, len, 61);
    serve(p, len, 61);
    // SAFETY: no reference into the region is held while it is volatile.
    unsafe { r.mark().unwrap() };
    assert_eq!(vrange::purge(usize::MAX), len);
    let base = p as usize;
    let (mut child, _link) = fork_linked(|_| {
        // No registration came along: a purged page is an ordinary missing page.
        if is_zero(base as *const u8, len) {
            0
        } else {
            1
        }
    });
    assert_eq!(child.wait(Duration::from_secs(30)), Exit::Code(0));
    assert_eq!(SIGNALS.load(SeqCst), 0, "the parent touched nothing");
    assert!(r.unmark().unwrap().was_purged());
}

#[test]
fn fill_refuses_misaligned_and_ordinary_memory() {
    let page = vrange::page_size();
    let m = Mapping::new(4 * page);
    let src = vec![1u8; page];
    // SAFETY: src is a page; the destination is test-owned memory.
    unsafe {
        assert_eq!(
            vrange::fill(m.ptr.wrapping_add(8), src.as_ptr(), page),
            Err(Error::Unaligned)
        );
        assert_eq!(
            vrange::fill(m.ptr, src.as_ptr(), page - 1),
            Err(Error::Unaligned)
        );
        // Ordinary memory: not SIGBUS-mode (whether or not this process has a userfaultfd).
        assert_eq!(
            vrange::fill(m.ptr, src.as_ptr(), page),
            Err(Error::NotRegion)
        );
    }
}

#[test]
fn shared_sigbus_region_signals_in_its_sigbus_mappings_only() {
    let _s = serial();
    quiet();
    let opts = Options {
        shared: true,
        sigbus: true,
        ..Options::default()
    };
    let a = match VolatileRegion::new(PAGES * vrange::page_size(), opts) {
        Ok(r) => r,
        Err(Error::Os(libc::ENOTSUP)) => return skip("userfaultfd cannot serve SIGBUS mode"),
        Err(e) => panic!("a shared SIGBUS region: {e}"),
    };
    let page = vrange::page_size();
    let (p, len) = (a.as_ptr(), a.len());
    fill(p, len, 71);
    // A second mapping of the same file, not in SIGBUS mode (as another process would map it).
    let b = VolatileRegion::open_shared(a.shared_fd().unwrap(), vrange::Priority::Normal).unwrap();
    serve(p, len, 71);
    // SAFETY: no reference into the region is held while it is volatile.
    unsafe { a.mark().unwrap() };
    // b holds no pin (it was never unmarked): the region is purged for both.
    assert_eq!(vrange::purge(usize::MAX), len);
    // b is not in SIGBUS mode: the hole reads zero there.
    assert!(is_zero(b.as_ptr(), page));
    assert_eq!(SIGNALS.load(SeqCst), 0);
    // a is: SIGBUS at the address, and the handler's fill puts the page in the shared file.
    let addr = p.wrapping_add(6 * page + 16);
    // SAFETY: test-owned memory; the handler places the page's content.
    let v = unsafe { (addr as *const u64).read_volatile() };
    assert_eq!(v, pattern(71, (6 * page + 16) / 8));
    assert_eq!(SIGNALS.load(SeqCst), 1);
    assert_eq!(LAST_ADDR.load(SeqCst), addr as usize);
    assert!(
        check_at(b.as_ptr(), 6 * page, page, 71),
        "the placed page is shared"
    );
    assert!(a.unmark().unwrap().was_purged());
    assert!(
        is_zero(p.wrapping_add(page), page),
        "after unmark: zero, no signal"
    );
    assert_eq!(SIGNALS.load(SeqCst), 1);
}
