//! The atomics and the wait primitive the range state machine uses, in one place so that the
//! loom model (`tests/loom_state.rs`) can compile `state.rs` against loom's versions instead.

pub(crate) use std::sync::atomic;

/// One step of waiting for another thread (or process) to finish a short transition: spins
/// briefly, then yields, then sleeps, so a waiter never burns a core for long. `round` counts
/// the calls made so far in this wait. Async-signal-safe (no allocation, no lock).
pub(crate) fn backoff(round: &mut u32) {
    *round = round.saturating_add(1);
    if *round < 64 {
        std::hint::spin_loop();
    } else if *round < 128 {
        std::thread::yield_now();
    } else {
        // A purge of a large shared range by another process can take milliseconds.
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// A spin lock for short critical sections that must also be taken around `fork` (the registry's
/// free list, an allocator's arenas): explicit `lock`/`unlock` so that fork handlers can hold it
/// across the fork. Waiting spins, then yields, then sleeps. Never allocates. Not
/// async-signal-safe: signal handlers never take it.
#[derive(Debug, Default)]
pub struct SpinLock(std::sync::atomic::AtomicBool);

impl SpinLock {
    /// An unlocked lock.
    pub const fn new() -> SpinLock {
        SpinLock(std::sync::atomic::AtomicBool::new(false))
    }

    /// Takes the lock, waiting as long as it takes.
    pub fn lock(&self) {
        let mut round = 0;
        while self
            .0
            .compare_exchange_weak(
                false,
                true,
                std::sync::atomic::Ordering::Acquire,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_err()
        {
            backoff(&mut round);
        }
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> bool {
        self.0
            .compare_exchange(
                false,
                true,
                std::sync::atomic::Ordering::Acquire,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Releases the lock (taken by this thread, or inherited locked by a fork child).
    pub fn unlock(&self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }

    /// Runs `f` under the lock.
    pub fn with<R>(&self, f: impl FnOnce() -> R) -> R {
        self.lock();
        let r = f();
        self.unlock();
        r
    }
}
