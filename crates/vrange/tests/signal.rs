//! Unmarking from a signal handler: the handler pins a volatile range while the interrupted
//! thread is inside malloc/free in a tight loop. If unmark allocated or took a lock the
//! interrupted thread could hold, this would deadlock or corrupt the heap; the test guards the
//! whole run with a watchdog so that a deadlock fails instead of hanging.

mod common;
use common::{force_purge, Mapping};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use vrange::page_size;
use vrange_testkit::pattern::{check_at, fill};

static RANGE_PTR: AtomicUsize = AtomicUsize::new(0);
static RANGE_LEN: AtomicUsize = AtomicUsize::new(0);
static HANDLED: AtomicUsize = AtomicUsize::new(0);
static PURGED: AtomicUsize = AtomicUsize::new(0);
static FAILED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    let ptr = RANGE_PTR.load(Ordering::Acquire) as *mut u8;
    let len = RANGE_LEN.load(Ordering::Acquire);
    // SAFETY: test-owned memory; the range is the test's own mapping, alive for the whole test.
    match unsafe { vrange::unmark(ptr, len) } {
        Ok(r) => {
            PURGED.fetch_add(r.purged, Ordering::Relaxed);
        }
        Err(_) => {
            FAILED.fetch_add(1, Ordering::Relaxed);
        }
    }
    HANDLED.fetch_add(1, Ordering::Release);
}

// The test plays the program installing its own handler: outside the OS layer's fence.
#[allow(clippy::disallowed_methods)]
fn install(sig: libc::c_int) {
    // SAFETY: test-owned memory; a zeroed sigaction with a valid handler and an empty mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

#[test]
fn unmark_from_a_signal_handler_interrupting_malloc() {
    let pages = 64;
    let m = Mapping::new(pages * page_size());
    RANGE_PTR.store(m.ptr as usize, Ordering::Release);
    RANGE_LEN.store(m.len, Ordering::Release);
    install(libc::SIGUSR1);

    let done = std::sync::Arc::new(AtomicBool::new(false));
    let victim_done = done.clone();
    // The victim allocates and frees constantly, so signals land inside malloc's locks.
    let victim = std::thread::spawn(move || {
        let mut v: Vec<Vec<u8>> = Vec::new();
        let mut i = 0usize;
        while !victim_done.load(Ordering::Relaxed) {
            v.push(vec![i as u8; 64 + (i * 37) % 4096]);
            if v.len() > 64 {
                v.swap_remove(i % 64);
            }
            i += 1;
        }
    });
    // SAFETY: test-owned memory; pthread_self of the victim is taken from its JoinHandle.
    let tid = {
        use std::os::unix::thread::JoinHandleExt;
        victim.as_pthread_t()
    };

    let signals = 2000;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut expected_purged = 0;
    for round in 0..signals {
        let seed = 100 + round as u64;
        fill(m.ptr, m.len, seed);
        // SAFETY: test-owned memory; ours.
        unsafe { vrange::mark_volatile(m.ptr, m.len).unwrap() };
        if round % 4 == 0 {
            force_purge(m.ptr, page_size());
            expected_purged += 1;
        }
        let before = HANDLED.load(Ordering::Acquire);
        // SAFETY: test-owned memory; tid names a live thread (joined only after the loop).
        assert_eq!(unsafe { libc::pthread_kill(tid, libc::SIGUSR1) }, 0);
        while HANDLED.load(Ordering::Acquire) == before {
            assert!(
                Instant::now() < deadline,
                "signal handler deadlocked (unmark not async-signal-safe)"
            );
            std::thread::yield_now();
        }
        assert_eq!(
            vrange::volatile_pages(m.ptr, m.len).unwrap(),
            0,
            "the handler pinned the range"
        );
        let intact_from = if round % 4 == 0 { page_size() } else { 0 };
        assert!(
            check_at(m.ptr, intact_from, m.len - intact_from, seed),
            "round {round}: pinned data intact"
        );
    }
    done.store(true, Ordering::Relaxed);
    victim.join().unwrap();
    assert_eq!(FAILED.load(Ordering::Relaxed), 0);
    assert_eq!(
        PURGED.load(Ordering::Relaxed),
        expected_purged,
        "each forced purge was reported by the handler"
    );
}
