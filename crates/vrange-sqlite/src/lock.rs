//! The cache's lock. SQLite calls one cache from one thread at a time; the only other taker is
//! the reclaimer's flush hook, which only tries. So the lock is a flag: taking it is one
//! compare-and-swap that all but always succeeds, releasing it one store. (`std::sync::Mutex`
//! releases with an atomic swap, to learn whether to wake a waiter: a tenth of a page fetch.)
//! It owns nothing but the flag and never sleeps; a second thread of SQLite's (it serialises
//! a cache's callers itself) or a hook caught mid-flush makes a taker spin, then yield.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// `T` behind a flag.
pub(crate) struct Lock<T> {
    held: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `Guard`, and one guard exists at a time (the
// flag, taken with Acquire and released with Release, orders each holder after the last).
unsafe impl<T: Send> Sync for Lock<T> {}

/// Spins before a taker yields its CPU to the holder.
const SPINS: u32 = 64;

impl<T> Lock<T> {
    pub fn new(value: T) -> Lock<T> {
        Lock {
            held: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting for its holder.
    pub fn lock(&self) -> Guard<'_, T> {
        let mut spins = 0;
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            while self.held.load(Relaxed) {
                if spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        // A guard is made only once the flag is ours: dropping one releases the lock.
        self.held
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
            .then(|| Guard { lock: self })
    }
}

/// The lock, held until dropped (also when a panic unwinds through its holder).
pub(crate) struct Guard<'a, T> {
    lock: &'a Lock<T>,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the flag: no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and the guard is borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.lock.held.store(false, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn one_holder_at_a_time() {
        let l = Lock::new(0u64);
        let g = l.lock();
        assert!(l.try_lock().is_none(), "held: a try fails");
        assert!(
            l.try_lock().is_none(),
            "a failed try released nothing (regression: it dropped a guard it had made)"
        );
        drop(g);
        assert!(l.try_lock().is_some(), "released: a try succeeds");
    }

    #[test]
    fn threads_add_without_losing_an_update() {
        let l = Arc::new(Lock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 40_000);
    }
}
