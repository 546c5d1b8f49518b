//! The allocator on the real kernel: hot reuse without faults, purged memory coming back zero
//! (and `calloc` trusting it), in-place resizing, foreign pointers declined.

use vrange_malloc::heap;

const KIB: usize = 1024;

/// Tests that expect to get back the block they just freed run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    // The tests decide every purge themselves: pressure left on the machine by other tests
    // (PSI's window is system-wide) must not purge free memory behind their back.
    for (name, value) in [
        ("VRANGE_PSI", "off"),
        ("VRANGE_VMPRESSURE", "off"),
        ("VRANGE_HEADROOM", "off"),
    ] {
        vrange::set_option(name, value).unwrap();
    }
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn minor_faults() -> i64 {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u.ru_minflt
    }
}

fn fill(p: *mut u8, len: usize, byte: u8) {
    // SAFETY: callers pass live blocks of at least len bytes.
    unsafe { p.write_bytes(byte, len) };
}

fn all(p: *const u8, len: usize, byte: u8) -> bool {
    // SAFETY: callers pass live blocks of at least len bytes.
    unsafe { std::slice::from_raw_parts(p, len) }
        .iter()
        .all(|b| *b == byte)
}

#[test]
fn freed_block_is_reused_intact_without_a_fault() {
    let _serial = serial();
    // Arenas are per CPU: stay on one so the allocation after the free uses the same arena.
    vrange_sys::mem::pin_thread_to_current_cpu().expect("pin to a CPU");
    let len = 512 * KIB;
    let a = heap::alloc(len, 16).expect("served").ptr.as_ptr();
    fill(a, len, 0x5a);
    let before = vrange::stats().allocator;
    // SAFETY: a is live, freed once.
    assert!(unsafe { heap::free(a) });
    let b = heap::alloc(len, 16).expect("served");
    assert_eq!(b.ptr.as_ptr(), a, "the block just freed is reused");
    assert!(!b.zeroed);
    let faults = minor_faults();
    fill(b.ptr.as_ptr(), len, 0x33);
    assert_eq!(
        minor_faults() - faults,
        0,
        "reusing intact free memory faults nothing"
    );
    let after = vrange::stats().allocator;
    assert!(after.reused_intact_bytes >= before.reused_intact_bytes + len as u64);
    // SAFETY: live, freed once.
    assert!(unsafe { heap::free(b.ptr.as_ptr()) });
}

#[test]
fn a_cached_block_is_freed_for_real_within_a_tick() {
    let _serial = serial();
    vrange_sys::mem::pin_thread_to_current_cpu().expect("pin to a CPU");
    // The reclaimer's tick must not come between the free and the check that the block is
    // still cached (a slow machine lets it): one tick of a minute, woken by the setting.
    // The setting wakes the thread, which flushes the caches once: a free before it got there
    // (a busy machine may keep it waiting) is flushed at once. Then the free is tried again.
    vrange::set_option("VRANGE_POLL_MS", "60000").unwrap();
    // An odd size that no other test of this file allocates.
    let len = 372 * KIB;
    let mut tries = Vec::new();
    let a = loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let a = heap::alloc(len, 16).expect("served").ptr.as_ptr();
        // SAFETY: a is live, freed once.
        assert!(unsafe { heap::free(a) });
        // In this CPU's cache: still a block of its chunk, not yet a volatile free span.
        let cached = heap::usable_size(a);
        tries.push(cached);
        if cached.is_some() || tries.len() == 20 {
            break a;
        }
    };
    // Back to the default tick (the change wakes the thread, which flushes the caches).
    vrange::set_option("VRANGE_POLL_MS", "100").unwrap();
    assert_eq!(
        tries.last().copied().flatten(),
        Some(len),
        "cached, not freed for real (tries: {tries:?})"
    );
    // A second free of a cached block is caught like any double free (double_free_aborts
    // checks the abort); the reclaimer's tick (VRANGE_POLL_MS, 100 ms) frees it for real.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while heap::usable_size(a).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the cached block was never freed for real"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn purged_free_memory_comes_back_zero_without_clearing() {
    let _serial = serial();
    let len = 768 * KIB;
    let a = heap::alloc(len, 16).expect("served").ptr.as_ptr();
    fill(a, len, 0xa5);
    // SAFETY: live, freed once.
    assert!(unsafe { heap::free(a) });
    let purged = vrange::purge(usize::MAX);
    assert!(purged >= len, "the free span was purged ({purged} bytes)");
    let b = heap::alloc(len, 16).expect("served");
    assert!(
        b.zeroed,
        "purged memory is known zero: calloc need not clear it"
    );
    let resident =
        vrange_sys::mem::resident_pages(b.ptr.as_ptr(), len).expect("mincore of a live block");
    assert_eq!(resident, 0, "purged pages hold no memory until touched");
    assert!(all(b.ptr.as_ptr(), len, 0));
    // SAFETY: live, freed once.
    assert!(unsafe { heap::free(b.ptr.as_ptr()) });
}

#[test]
fn resize_in_place_and_usable_size() {
    let _serial = serial();
    let a = heap::alloc(300 * KIB, 16).expect("served").ptr.as_ptr();
    let page = vrange::page_size();
    assert_eq!(
        heap::usable_size(a),
        Some((300 * KIB).div_ceil(page) * page)
    );
    fill(a, 300 * KIB, 7);
    // SAFETY: a is live.
    assert!(unsafe { heap::resize_in_place(a, 100 * KIB) });
    assert_eq!(heap::usable_size(a), Some(100 * KIB));
    assert!(all(a, 100 * KIB, 7), "shrinking keeps the head");
    // SAFETY: a is live.
    assert!(unsafe { heap::resize_in_place(a, 100 * KIB - 10) });
    // SAFETY: a is live. Growing past the usable size takes the free span after the block:
    // the one shrinking just gave back.
    assert!(unsafe { heap::resize_in_place(a, 200 * KIB) });
    assert_eq!(heap::usable_size(a), Some(200 * KIB));
    assert!(all(a, 100 * KIB, 7), "growing keeps the head");
    // SAFETY: a is live; more than a chunk always needs a move.
    assert!(!unsafe { heap::resize_in_place(a, 3 << 20) });
    // SAFETY: live, freed once.
    assert!(unsafe { heap::free(a) });
}

#[test]
fn small_and_foreign_requests_are_declined() {
    let _serial = serial();
    assert!(heap::alloc(1000, 16).is_none(), "below the threshold");
    assert!(
        heap::alloc(1 << 20, 4 << 20).is_none(),
        "aligned beyond a chunk"
    );
    // SAFETY: plain libc allocation, freed below.
    let p = unsafe { libc::malloc(256 * KIB) }.cast::<u8>();
    assert!(!heap::owns(p));
    assert_eq!(heap::usable_size(p), None);
    // SAFETY: not the allocator's: declined without touching it.
    assert!(!unsafe { heap::free(p) });
    // SAFETY: p came from libc::malloc.
    unsafe { libc::free(p.cast()) };
}

#[test]
fn aligned_blocks_are_aligned() {
    let _serial = serial();
    let mut blocks = Vec::new();
    for shift in 12..=21 {
        let align = 1usize << shift;
        let b = heap::alloc(80 * KIB, align).expect("served");
        assert_eq!(b.ptr.as_ptr() as usize % align, 0, "aligned to {align}");
        fill(b.ptr.as_ptr(), 80 * KIB, shift as u8);
        blocks.push((b.ptr.as_ptr(), shift as u8));
    }
    for (p, byte) in blocks {
        assert!(all(p, 80 * KIB, byte), "no block overlapped another");
        // SAFETY: live, freed once.
        assert!(unsafe { heap::free(p) });
    }
}

/// A double free aborts with a message (checked in a child process), as glibc does, instead of
/// corrupting the heap.
#[test]
fn double_free_aborts() {
    let _serial = serial();
    for len in [256 * KIB, 5 << 20] {
        let a = heap::alloc(len, 16).expect("served").ptr.as_ptr();
        // SAFETY: the child frees the block twice and must die; the parent only waits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: the second free is the bug under test; the child never returns.
            unsafe {
                heap::free(a);
                heap::free(a);
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGABRT,
            "a double free of {len} bytes must abort (status {status:#x})"
        );
        // SAFETY: still live in the parent.
        assert!(unsafe { heap::free(a) });
    }
}

/// Regression (vrange-bench's `pagetable` in CI, OOM-killed in its memory cgroup): frees kept
/// free memory resident beyond the budget for as long as the reclaimer thread did not run.
#[test]
fn frees_keep_the_budget_while_the_reclaimer_thread_cannot_run() {
    let _serial = serial();
    vrange::set_option("VRANGE_BUDGET", "8M").unwrap();
    let len = 1024 * KIB;
    let blocks: Vec<*mut u8> = (0..128)
        .map(|i| {
            let b = heap::alloc(len, 16).expect("served").ptr.as_ptr();
            fill(b, len, i as u8);
            b
        })
        .collect();
    // The first free starts the reclaimer thread.
    // SAFETY: live, freed once.
    assert!(unsafe { heap::free(blocks[0]) });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let tid = loop {
        match vrange_testkit::sched::thread_named("vrange-reclaim") {
            Some(tid) => break tid,
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            None => panic!("no reclaimer thread"),
        }
    };
    let mut max = 0;
    let starved = match vrange_testkit::sched::starve(tid) {
        Ok(g) => g,
        Err(e) => {
            vrange::set_option("VRANGE_BUDGET", "0").unwrap();
            for &b in &blocks[1..] {
                // SAFETY: live, freed once.
                unsafe { heap::free(b) };
            }
            return vrange_testkit::skip(format!("cannot starve the reclaimer thread: {e}"));
        }
    };
    for &b in &blocks[1..] {
        // SAFETY: live, freed once.
        assert!(unsafe { heap::free(b) });
        max = max.max(vrange::stats().volatile_bytes);
    }
    drop(starved);
    vrange::set_option("VRANGE_BUDGET", "0").unwrap();
    // The budget, the slack (the budget again, at least 16 MiB) and one chunk freed whole.
    assert!(
        max <= (8 + 16 + 2) << 20,
        "{} MiB of free memory resident while the reclaimer thread could not run",
        max >> 20
    );
}
