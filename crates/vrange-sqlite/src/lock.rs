//! The cache's lock. SQLite calls one cache from one thread at a time; the only other taker is
//! the reclaimer's flush hook, which only tries. So the lock is vrange's spin lock: taking it
//! is one compare-and-swap that all but always succeeds, releasing it one store
//! (`std::sync::Mutex` releases with an atomic swap, to learn whether to wake a waiter: a tenth
//! of a page fetch). Not held across fork: SQLite's connections are not carried into a fork
//! child (SQLite's own rule), and a child that uses none never takes it.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use vrange_sys::sync::{SpinGuard, SpinLock};

/// `T` behind vrange's spin lock (`vrange_sys::sync::SpinLock`: one compare-and-swap to take,
/// one store to release; a waiter spins, yields, then sleeps).
pub(crate) struct Lock<T> {
    flag: SpinLock,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `Guard`, and one guard exists at a time (the
// spin lock orders each holder after the last).
unsafe impl<T: Send> Sync for Lock<T> {}

impl<T> Lock<T> {
    pub fn new(value: T) -> Lock<T> {
        Lock {
            flag: SpinLock::new(),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting for its holder.
    pub fn lock(&self) -> Guard<'_, T> {
        Guard {
            lock: self,
            _held: self.flag.lock(),
        }
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        self.flag.try_lock().map(|held| Guard {
            lock: self,
            _held: held,
        })
    }
}

/// The lock, held until dropped (also when a panic unwinds through its holder).
pub(crate) struct Guard<'a, T> {
    lock: &'a Lock<T>,
    _held: SpinGuard<'a>,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock: no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and the guard is borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
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
