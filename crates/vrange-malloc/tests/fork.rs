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
