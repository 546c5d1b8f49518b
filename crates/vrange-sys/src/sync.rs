//! The spin lock vrange's short critical sections use (the registry's free list, the
//! reclaimer's start and purge, an allocator's arenas), and the wait step it shares with the
//! range state machine. Written by hand rather than taken from a crate because it must never
//! allocate, must be usable from a `const` static before `main` (an allocator runs there), and
//! must be held across `fork` by `pthread_atfork` handlers.

use std::sync::atomic::{AtomicBool, Ordering};

/// One step of waiting for another thread (or process) to finish a short transition: spins
/// briefly, then yields, then sleeps, so a waiter never burns a core for long. `round` counts
/// the calls made so far in this wait. Async-signal-safe (no allocation, no lock).
pub fn backoff(round: &mut u32) {
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

/// A spin lock whose holder is a guard ([`SpinGuard`]): released when the guard drops, also on
/// unwinding. Waiting spins, then yields, then sleeps. Never allocates. Not async-signal-safe:
/// signal handlers never take it.
#[derive(Debug, Default)]
pub struct SpinLock(AtomicBool);

/// Holds a [`SpinLock`]; releases it on drop.
#[must_use = "the lock is released when the guard drops"]
#[derive(Debug)]
pub struct SpinGuard<'a>(&'a SpinLock);

impl SpinLock {
    /// An unlocked lock.
    pub const fn new() -> SpinLock {
        SpinLock(AtomicBool::new(false))
    }

    /// Takes the lock, waiting as long as it takes.
    pub fn lock(&self) -> SpinGuard<'_> {
        let mut round = 0;
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            backoff(&mut round);
        }
        SpinGuard(self)
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> Option<SpinGuard<'_>> {
        // Not `then_some`: a guard built for a lock someone else holds would release it on drop.
        self.0
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then(|| SpinGuard(self))
    }

    /// Runs `f` under the lock.
    pub fn with<R>(&self, f: impl FnOnce() -> R) -> R {
        let _held = self.lock();
        f()
    }

    /// Takes the lock for a `pthread_atfork` prepare handler, which must leave it held when it
    /// returns; the parent and child handlers release it with [`SpinLock::force_unlock`].
    pub fn lock_for_fork(&self) {
        std::mem::forget(self.lock());
    }

    /// Releases a lock taken by [`SpinLock::lock_for_fork`] (in the parent after fork, or in the
    /// child, which inherits it held).
    ///
    /// # Safety
    /// The lock must be held by a forgotten guard (`lock_for_fork`) and by no live guard.
    pub unsafe fn force_unlock(&self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Drop for SpinGuard<'_> {
    fn drop(&mut self) {
        self.0 .0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_releases_also_on_unwind() {
        let lock = SpinLock::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            lock.with(|| panic!("inside"));
        }));
        assert!(r.is_err());
        assert!(lock.try_lock().is_some(), "a panic left the lock held");
    }

    #[test]
    fn a_failed_try_lock_leaves_the_holder_holding() {
        let lock = SpinLock::new();
        let held = lock.lock();
        assert!(lock.try_lock().is_none());
        assert!(
            lock.try_lock().is_none(),
            "a failed try_lock released the lock"
        );
        drop(held);
        assert!(lock.try_lock().is_some());
    }

    #[test]
    fn fork_style_lock_and_release() {
        let lock = SpinLock::new();
        lock.lock_for_fork();
        assert!(lock.try_lock().is_none());
        // SAFETY: held by lock_for_fork, no live guard.
        unsafe { lock.force_unlock() };
        assert!(lock.try_lock().is_some());
    }
}
