//! fork while other threads allocate, free and the reclaimer purges: the child must never
//! inherit an allocator lock held (it would hang) nor a half-changed chunk (it would corrupt),
//! and must be able to allocate, free and have its own reclaimer. vrange-malloc is this test
//! binary's global allocator.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

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

/// How long a child may take: a round takes about 0.15 s in an emulated guest. Far longer
/// means it hangs (a lock the fork left held), and the report says where.
const CHILD_LIMIT: Duration = Duration::from_secs(60);

/// The child's wait status, or a failure naming what each of its threads is doing if it is
/// still running after [`CHILD_LIMIT`] (then it is killed).
fn wait_or_report(pid: i32, round: usize) -> i32 {
    let deadline = std::time::Instant::now() + CHILD_LIMIT;
    let mut status = 0;
    loop {
        // SAFETY: pid is this test's unreaped child; status is a valid int.
        let waited = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if waited == pid {
            return status;
        }
        assert_eq!(waited, 0, "waitpid: {}", std::io::Error::last_os_error());
        if std::time::Instant::now() >= deadline {
            let states = vrange_testkit::proc::task_states(pid);
            // SAFETY: pid is this test's unreaped child, so not recycled.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            panic!("round {round}: the child still runs after {CHILD_LIMIT:?}:\n{states}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

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
        // SAFETY: the child only runs child_body (allocations included: that is the point)
        // and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = child_body();
            // SAFETY: ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let status = wait_or_report(pid, round);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "round {round}: the child ended with status {status:#x}"
        );
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
