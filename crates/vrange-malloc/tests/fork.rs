//! fork while other threads allocate, free and the reclaimer purges: the child must never
//! inherit an allocator lock held (it would hang) nor a half-changed chunk (it would corrupt),
//! and must be able to allocate, free and have its own reclaimer. vrange-malloc is this test
//! binary's global allocator.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use vrange_testkit::proc::Exit;

#[global_allocator]
static A: vrange_malloc::VrangeMalloc = vrange_malloc::VrangeMalloc;

fn churn(seed: u64, stop: &AtomicBool) -> u64 {
    let mut x = seed | 1;
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut rounds = 0;
    while !stop.load(Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (64 << 10) + (x % (192 << 10)) as usize;
        let byte = (x >> 32) as u8;
        held.push(vec![byte; len]);
        if held.len() > 6 {
            let v = held.remove((x >> 40) as usize % held.len());
            assert!(v.iter().all(|b| *b == v[0]), "a live block changed");
        }
        rounds += 1;
    }
    rounds
}

/// In the child: allocate, check, free, let the reclaimer purge; exit 0 on success.
fn child_body() -> i32 {
    // SAFETY: alarm has no preconditions. A backstop only: the parent reports a child still
    // running after CHILD_LIMIT and kills it.
    unsafe { libc::alarm(2 * CHILD_LIMIT.as_secs() as u32) };
    let mut blocks: Vec<Vec<u8>> = (0..8).map(|i| vec![i as u8; 300 << 10]).collect();
    for (i, b) in blocks.iter().enumerate() {
        if !b.iter().all(|x| *x == i as u8) {
            return 2;
        }
    }
    blocks.truncate(2);
    drop(blocks);
    vrange::purge(usize::MAX);
    let again = vec![7u8; 3 << 20];
    if again.iter().any(|x| *x != 7) {
        return 3;
    }
    0
}

/// How long a child may take: a round takes about 0.15 s in an emulated guest (0.4 s under
/// load). Far longer means it hangs, and the report says where.
const CHILD_LIMIT: Duration = Duration::from_secs(60);

#[test]
fn fork_with_threads_churning() {
    vrange::set_option("VRANGE_ARM_DELAY_MS", "0").unwrap();
    vrange::set_option("VRANGE_BUDGET", "2M").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..3)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || churn(0x1234_5678 + i, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    for round in 0..150 {
        // The child allocates (that is the point: vrange-malloc must be usable after fork).
        let (mut child, _link) = vrange_testkit::fork::fork_linked(|_| child_body());
        match child.wait_or_describe(CHILD_LIMIT) {
            Ok(Exit::Code(0)) => {}
            Ok(exit) => panic!("round {round}: the child ended with {exit}"),
            Err(states) => {
                panic!("round {round}: the child still runs after {CHILD_LIMIT:?}:\n{states}")
            }
        }
    }
    stop.store(true, Relaxed);
    let rounds: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(rounds > 0);
    let s = vrange::stats();
    assert!(
        s.allocator.allocations > 0,
        "the allocator served the workers"
    );
    println!(
        "{rounds} churn rounds; {} MiB purged by the reclaimer meanwhile",
        s.purged_total_bytes >> 20
    );
}

/// Forks while another thread starts and stops the reclaimer over and over: a spawning or an
/// exiting reclaimer thread allocates and frees, and a fork's preparation takes the
/// allocator's locks before the reclaimer's start lock; so neither the spawn nor the join may
/// happen under that lock. Runs in a child process (a hang is a timed-out child).
#[test]
fn fork_while_the_reclaimer_starts_and_stops() {
    let (mut scenario, _link) = vrange_testkit::fork::fork_linked(|_| start_stop_races_fork());
    match scenario.wait_or_describe(CHILD_LIMIT) {
        Ok(Exit::Code(0)) => {}
        Ok(exit) => panic!("the scenario ended with {exit}"),
        Err(states) => panic!(
            "forks made while the reclaimer starts and stops did not complete within \
             {CHILD_LIMIT:?}:\n{states}"
        ),
    }
}

/// In a process of its own: one thread frees a block (which starts the reclaimer) and stops
/// the reclaimer, 300 times or for 5 s; this thread forks meanwhile. 0 when every fork completed and
/// every child exited 0.
fn start_stop_races_fork() -> i32 {
    let stop = Arc::new(AtomicBool::new(false));
    let cycler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // 300 cycles take 2 s here; in an emulated guest, the first 5 s of them.
            let t0 = std::time::Instant::now();
            let mut cycles = 0u32;
            while !stop.load(Relaxed) && cycles < 300 && t0.elapsed() < Duration::from_secs(5) {
                // A 4 MiB block freed: its pages are volatile, which starts the reclaimer.
                drop(std::hint::black_box(vec![1u8; 4 << 20]));
                if !vrange::reclaimer::is_running() {
                    return 0;
                }
                vrange::reclaimer::stop();
                cycles += 1;
            }
            cycles
        })
    };
    let mut forks = 0;
    while !cycler.is_finished() {
        match fork_empty_child() {
            Some(true) => {}
            Some(false) => return 5,
            None => return 4,
        }
        forks += 1;
    }
    stop.store(true, Relaxed);
    match cycler.join() {
        Ok(cycles) if cycles > 0 && forks > 0 => 0,
        _ => 6,
    }
}

/// A fork while the refill thread's fill function allocates under vrange-malloc: the fork must
/// complete. Each lock a fork holds is taken in one rank order, the allocator's with vrange's,
/// and no lock held across fork is held while a program's fill function runs; otherwise the
/// fork (holding the allocator's locks) would wait for the fill, and the fill, allocating, for
/// the fork. The scenario runs in a child process, so that a hang is a timed-out child, not a
/// hung test.
#[test]
fn fork_while_a_refill_fill_allocates() {
    let (mut scenario, _link) = vrange_testkit::fork::fork_linked(|_| fill_races_fork());
    match scenario.wait_or_describe(CHILD_LIMIT) {
        Ok(Exit::Code(0)) => {}
        Ok(Exit::Code(SKIPPED)) => {
            vrange_testkit::skip("userfaultfd is not available to this process")
        }
        Ok(exit) => panic!("the scenario ended with {exit}"),
        Err(states) => panic!(
            "a fork made while a fill allocates did not complete within {CHILD_LIMIT:?}:\n{states}"
        ),
    }
}

/// The scenario's exit status without userfaultfd.
const SKIPPED: i32 = 77;

/// In a process of its own: a thread reads a refill region whose fill allocates blocks the
/// allocator serves under its locks (large blocks, then blocks from its arenas) for half a
/// second; once the fill has started, this thread forks. 0 when the fork completed and the
/// bytes read are the fill's.
fn fill_races_fork() -> i32 {
    use std::sync::mpsc;
    const LEN: usize = 1 << 20;
    let (inside, fill_started) = mpsc::channel::<()>();
    let inside = std::sync::Mutex::new(inside);
    let region = match vrange::RefillRegion::new(LEN, LEN, move |_, buf| {
        let _ = inside.lock().map(|s| s.send(()));
        let t0 = std::time::Instant::now();
        let mut i = 0usize;
        while t0.elapsed() < Duration::from_millis(500) {
            // 3 MiB: the large-block path; 68-120 KiB: an arena's (sizes the per-CPU cache of
            // freed blocks does not hold yet).
            let len = if i % 2 == 0 {
                3 << 20
            } else {
                (68 + i % 53) << 10
            };
            let v = vec![i as u8; len];
            std::hint::black_box(&v);
            i += 1;
        }
        buf.fill(0x5a);
        true
    }) {
        Ok(r) => r,
        Err(vrange::Error::Os(libc::ENOTSUP)) => return SKIPPED,
        Err(_) => return 2,
    };
    let at = region.as_ptr() as usize;
    let reader = std::thread::spawn(move || {
        // SAFETY: the region lives until this thread is joined; a read waits for its fill.
        unsafe { (at as *const u8).read_volatile() }
    });
    if fill_started.recv_timeout(Duration::from_secs(20)).is_err() {
        return 3;
    }
    if fork_empty_child().is_none() {
        return 4;
    }
    match reader.join() {
        Ok(0x5a) => 0,
        _ => 5,
    }
}

/// Forks a child that exits at once and reaps it: whether it exited 0 (`None`: fork failed).
fn fork_empty_child() -> Option<bool> {
    // SAFETY: the child only leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: _exit ends the child at once.
        unsafe { libc::_exit(0) };
    }
    if pid < 0 {
        return None;
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Some(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0)
}
