//! Refill regions filled on the faulting thread (`RefillRegion::filled_here`) on the real
//! kernel: each block is made by the thread that touches it, on first touch and again after
//! the system took it (forced with MADV_DONTNEED, and by real pressure in a memory cgroup a
//! quarter of the region's size, without an OOM kill, the fills near the limit recycling the
//! oldest blocks: moved where the kernel moves pages, copied with moves off or for pages
//! shared with a fork child), by threads touching and a purger taking blocks at once; a failing fill and every SIGBUS that is not a region's go to the program's
//! own handler (installed before the first region), or kill the process where it had none;
//! regions are registered again after the program closed the descriptor; the table of such
//! regions is bounded and freed entries are reused.
//!
//! The program's handler is installed once, before any region, by [`setup`]: vrange's handler
//! keeps the action it found when the process's first region installed it.

#[macro_use]
mod common;

use common::{generate, next, read_word, refill_or_skip};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicI32, AtomicUsize};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;
use vrange::{Error, RefillRegion};
use vrange_testkit::pattern::pattern;
use vrange_testkit::proc::Exit;
use vrange_testkit::role::{role, role_command, say, Role};
use vrange_testkit::{serial, skip};

const KIB: usize = 1 << 10;
const BLOCK: usize = 64 * KIB;
const TEST_ACTIONS: &str = "sigbus_goes_on_to_the_programs_own_action_whatever_it_is";

fn word(seed: u64, i: usize) -> u64 {
    pattern(seed, i)
}

fn tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Fills of a region: how many, and the threads they ran on.
#[derive(Default)]
struct Fills {
    count: AtomicUsize,
    threads: Mutex<Vec<i32>>,
    last_thread: AtomicI32,
}

/// A region of `len` bytes made by the generator with `seed`, recording its fills; None (with a
/// printed reason) without userfaultfd.
fn region(len: usize, seed: u64) -> Option<(RefillRegion, Arc<Fills>)> {
    setup();
    let fills = Arc::new(Fills::default());
    let seen = fills.clone();
    let r = refill_or_skip(RefillRegion::filled_here(len, BLOCK, move |offset, buf| {
        seen.count.fetch_add(1, SeqCst);
        seen.last_thread.store(tid(), SeqCst);
        seen.threads.lock().unwrap().push(tid());
        generate(seed, offset, buf);
        true
    }))?;
    Some((r, fills))
}

// ---- The program's own SIGBUS handler ----

static SIGNALS: AtomicUsize = AtomicUsize::new(0);
static SIG_ADDR: AtomicUsize = AtomicUsize::new(0);
static SIG_CODE: AtomicI32 = AtomicI32::new(0);
/// The region whose failing block the handler places (0: none), and its seed.
static PLACE_BASE: AtomicUsize = AtomicUsize::new(0);
static PLACE_LEN: AtomicUsize = AtomicUsize::new(0);
const PLACE_SEED: u64 = 6;

extern "C" fn programs_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: a valid siginfo for an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    SIGNALS.fetch_add(1, SeqCst);
    SIG_ADDR.store(addr, SeqCst);
    SIG_CODE.store(code, SeqCst);
    let base = PLACE_BASE.load(SeqCst);
    if base == 0 || addr < base || addr >= base + PLACE_LEN.load(SeqCst) {
        return;
    }
    let page = vrange::page_size();
    let at = addr & !(page - 1);
    let mut buf = [0u8; 4096];
    generate(PLACE_SEED, at - base, &mut buf[..page]);
    // SAFETY: buf holds a page; the page belongs to the test's region.
    let _ = unsafe { vrange::fill(at as *mut u8, buf.as_ptr(), page) };
}

/// Installs the program's handler once, before this process's first region (not in a role:
/// each sets its own action).
fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if role().is_none() {
            vrange_testkit::signal::on_sigbus(programs_handler);
        }
    });
}

// ---- Tests ----

#[test]
fn blocks_are_filled_on_the_touching_thread_first_and_after_they_were_taken() {
    let _s = serial();
    let Some((r, fills)) = region(16 * BLOCK, 3) else {
        return;
    };
    let words = BLOCK / 8;
    assert_eq!(
        fills.count.load(SeqCst),
        0,
        "nothing is made before it is touched"
    );
    let before = vrange::stats();
    let signals = SIGNALS.load(SeqCst);
    assert_eq!(read_word(&r, 5 * words + 17), word(3, 5 * words + 17));
    assert_eq!(fills.count.load(SeqCst), 1, "one fill for the block");
    assert_eq!(
        fills.last_thread.load(SeqCst),
        tid(),
        "filled on the touching thread"
    );
    for i in 5 * words..6 * words {
        assert_eq!(read_word(&r, i), word(3, i));
    }
    assert_eq!(
        fills.count.load(SeqCst),
        1,
        "installed whole: no more fills"
    );
    // Take the block back as the system would.
    // SAFETY: the region's content is the generator's: nothing is lost.
    unsafe { vrange_sys::mem::purge_forced(r.as_ptr().wrapping_add(5 * BLOCK), BLOCK) }.unwrap();
    let other = std::thread::spawn({
        let r = r.as_ptr() as usize;
        move || {
            // SAFETY: inside the region, which outlives this thread (joined below).
            let v = unsafe { ((r + 5 * BLOCK) as *const u64).read_volatile() };
            (v, tid())
        }
    });
    let (v, other_tid) = other.join().unwrap();
    assert_eq!(v, word(3, 5 * words));
    assert_eq!(fills.count.load(SeqCst), 2, "made again after it was taken");
    assert_eq!(
        fills.last_thread.load(SeqCst),
        other_tid,
        "by the thread that touched it"
    );
    let after = vrange::stats();
    assert_eq!(after.refill_fills - before.refill_fills, 2);
    assert_eq!(after.refill_bytes - before.refill_bytes, 2 * BLOCK as u64);
    assert!(
        vrange_testkit::sched::thread_named("vrange-refill").is_none(),
        "no refill thread serves these regions"
    );
    assert_eq!(
        SIGNALS.load(SeqCst),
        signals,
        "the program's handler saw none of it"
    );
}

#[test]
fn threads_touching_while_blocks_are_taken_read_the_generator() {
    let _s = serial();
    const TAKEN: usize = 300;
    let blocks = 32;
    let Some((r, fills)) = region(blocks * BLOCK, 5) else {
        return;
    };
    let r = &r;
    let readers = Mutex::new(Vec::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let taken = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let (readers, taken) = (&readers, &taken);
                s.spawn(move || {
                    readers.lock().unwrap().push(tid());
                    let mut dice = 0x9e37_79b9 + t;
                    let deadline = std::time::Instant::now() + Duration::from_secs(20);
                    let mut reads = 0;
                    while reads < 20_000
                        || (taken.load(SeqCst) < TAKEN && std::time::Instant::now() < deadline)
                    {
                        let i = next(&mut dice) as usize % (r.len() / 8);
                        assert_eq!(read_word(r, i), word(5, i), "thread {t}, word {i}");
                        reads += 1;
                    }
                })
            })
            .collect();
        s.spawn(|| {
            let mut dice = 77u64;
            while !stop.load(SeqCst) {
                let b = next(&mut dice) as usize % blocks;
                // SAFETY: the region's content is the generator's: nothing is lost.
                unsafe { vrange_sys::mem::purge_forced(r.as_ptr().wrapping_add(b * BLOCK), BLOCK) }
                    .unwrap();
                taken.fetch_add(1, SeqCst);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        for h in handles {
            h.join().unwrap();
        }
        stop.store(true, SeqCst);
    });
    let readers = readers.into_inner().unwrap();
    let threads = fills.threads.lock().unwrap();
    assert!(
        taken.load(SeqCst) >= TAKEN,
        "the purger took too few blocks meanwhile"
    );
    println!(
        "{} fills, {} blocks taken meanwhile",
        threads.len(),
        taken.load(SeqCst)
    );
    assert!(
        threads.len() >= blocks,
        "every block was filled at least once"
    );
    assert!(
        threads.iter().all(|t| readers.contains(t)),
        "every fill ran on a reading thread"
    );
}

#[test]
fn a_failing_fill_and_other_sigbus_go_to_the_programs_handler() {
    let _s = serial();
    setup();
    let failures = Arc::new(AtomicUsize::new(0));
    let f = failures.clone();
    let r = match RefillRegion::filled_here(8 * BLOCK, BLOCK, move |offset, buf| {
        if offset == 2 * BLOCK {
            f.fetch_add(1, SeqCst);
            return false;
        }
        generate(PLACE_SEED, offset, buf);
        true
    }) {
        Ok(r) => r,
        Err(Error::Os(libc::ENOTSUP)) => return skip("userfaultfd is not available"),
        Err(e) => panic!("RefillRegion::filled_here: {e}"),
    };
    PLACE_LEN.store(r.len(), SeqCst);
    PLACE_BASE.store(r.as_ptr() as usize, SeqCst);
    let signals = SIGNALS.load(SeqCst);
    let failed = vrange::stats().refill_failures;
    let i = (2 * BLOCK + 3 * 4096 + 40) / 8;
    assert_eq!(
        read_word(&r, i),
        word(PLACE_SEED, i),
        "the program's handler placed the page"
    );
    assert_eq!(SIGNALS.load(SeqCst) - signals, 1);
    assert_eq!(SIG_ADDR.load(SeqCst), r.as_ptr() as usize + i * 8);
    assert_eq!(
        SIG_CODE.load(SeqCst),
        libc::BUS_ADRERR,
        "the fault's own siginfo"
    );
    assert_eq!(failures.load(SeqCst), 1);
    assert_eq!(vrange::stats().refill_failures - failed, 1);
    assert_eq!(
        read_word(&r, 0),
        word(PLACE_SEED, 0),
        "other blocks fill as usual"
    );
    // A SIGBUS sent to the thread (not a fault) goes to the program's handler as it came.
    vrange_sys::process::raise_sigbus(tid(), 0x1234_5000).unwrap();
    assert_eq!(SIGNALS.load(SeqCst) - signals, 2);
    assert_eq!(SIG_ADDR.load(SeqCst), 0x1234_5000);
    assert_eq!(SIG_CODE.load(SeqCst), libc::SI_QUEUE);
    PLACE_BASE.store(0, SeqCst);
}

static PLAIN_CALLS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn plain_handler(_: libc::c_int) {
    PLAIN_CALLS.fetch_add(1, SeqCst);
}

/// The roles, each a program whose SIGBUS action was set before its first region (as a C
/// program's):
/// - `dies`: the default action; it touches a block whose fill fails;
/// - `ignored`: SIGBUS ignored; the same touch (the kernel does not let a fault be ignored);
/// - `sent`: the default action; SIGBUS sent to itself (not a fault: sent again, and kills);
/// - `plain`: a handler without SA_SIGINFO; SIGBUS sent to itself reaches it, and it lives.
fn program(kind: &str) {
    // SAFETY: signal(2) with a plain handler or SIG_IGN, before any region: the program's own
    // action, as it would set it.
    unsafe {
        match kind {
            "ignored" => libc::signal(libc::SIGBUS, libc::SIG_IGN),
            "plain" => libc::signal(
                libc::SIGBUS,
                plain_handler as *const () as libc::sighandler_t,
            ),
            // Rust's runtime installs a SIGBUS handler of its own (stack overflow reports,
            // resetting to the default for any other address): a C program has none.
            _ => libc::signal(libc::SIGBUS, libc::SIG_DFL),
        };
    }
    let r = RefillRegion::filled_here(4 * BLOCK, BLOCK, |offset, buf| {
        generate(1, offset, buf);
        offset != BLOCK
    })
    .expect("filled_here");
    assert_eq!(read_word(&r, 0), word(1, 0));
    say("FILLED");
    match kind {
        "sent" | "plain" => vrange_sys::process::raise_sigbus(tid(), 0x1000).unwrap(),
        _ => drop(read_word(&r, BLOCK / 8)),
    }
    say(format_args!("SURVIVED plain={}", PLAIN_CALLS.load(SeqCst)));
}

#[test]
fn sigbus_goes_on_to_the_programs_own_action_whatever_it_is() {
    if let Some(kind) = role() {
        return program(&kind);
    }
    let _s = serial();
    if region(BLOCK, 1).is_none() {
        return;
    }
    for kind in ["dies", "ignored", "sent", "plain"] {
        let mut child = Role::spawn(kind, role_command(TEST_ACTIONS, kind));
        child.expect("FILLED", Duration::from_secs(20));
        let survived = child.next(Duration::from_secs(20));
        let exit = child.wait(Duration::from_secs(20));
        if kind == "plain" {
            let line = survived.expect("the plain handler's program lives on");
            assert_eq!(line.u64("plain"), 1, "{kind}: {line:?}");
            assert!(matches!(exit, Exit::Code(0)), "{kind}: {exit}");
        } else {
            assert!(survived.is_err(), "{kind}: it lived on: {survived:?}");
            assert!(
                matches!(exit, Exit::Signal(libc::SIGBUS)),
                "{kind}: killed by SIGBUS, as without vrange: {exit}"
            );
        }
    }
}

#[test]
fn the_table_is_bounded_and_reuses_freed_entries() {
    let _s = serial();
    common::refill_refuses_bad_arguments(|len, block| {
        RefillRegion::filled_here(len, block, |_, _| true)
    });
    let Some((first, _)) = region(BLOCK, 2) else {
        return;
    };
    let mut live = vec![first];
    let full = loop {
        match RefillRegion::filled_here(BLOCK, BLOCK, |o, b| {
            generate(2, o, b);
            true
        }) {
            Ok(r) => live.push(r),
            Err(e) => break e,
        }
        assert!(live.len() <= 64, "more than 64 regions live");
    };
    assert_eq!(full, Error::Os(libc::ENOMEM));
    assert_eq!(live.len(), 64);
    let (ptr, len) = live.pop().unwrap().into_raw();
    // SAFETY: from into_raw, no other handle; a wrong length names no region.
    let wrong = unsafe { RefillRegion::from_raw(ptr, len + vrange::page_size()) };
    assert_eq!(wrong.err(), Some(Error::NotRegion));
    // SAFETY: as above.
    let back = unsafe { RefillRegion::from_raw(ptr, len) }.unwrap();
    assert_eq!(read_word(&back, 3), word(2, 3));
    drop(back);
    live.truncate(1);
    let again: Vec<_> = (0..63)
        .map(|_| RefillRegion::filled_here(BLOCK, BLOCK, |_, _| true).expect("freed entries"))
        .collect();
    assert_eq!(read_word(&live[0], 1), word(2, 1));
    drop(again);
}

/// Blocks made one after another are lazily freed in runs; the last run goes when the reclaimer's next tick.
#[test]
fn blocks_made_one_after_another_are_lazily_freed_by_the_next_tick() {
    let _s = serial();
    let Some((r, _)) = region(32 * BLOCK, 12) else {
        return;
    };
    common::assert_lazily_freed_soon(&r, 32 * BLOCK);
}

// ---- Larger than its memory cgroup ----

pressure_tests!("refill-here-reader", BLOCK, |len| {
    region(len, common::PRESSURE_SEED)
        .expect("a refill region")
        .0
});

/// A program that closes every descriptor above its own takes the SIGBUS descriptor with them
/// and the kernel drops the registrations; the next region opens a new one and registers the
/// live regions on it again at once.
#[test]
fn regions_are_registered_again_after_the_program_closed_the_descriptor() {
    let _s = serial();
    // The new descriptor's first region registers the live ones on it before it returns.
    common::registered_again_after_closefrom(
        BLOCK,
        |seed| region(4 * BLOCK, seed).map(|(r, _)| r),
        Duration::ZERO,
    );
}
