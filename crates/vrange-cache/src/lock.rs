//! The cache's mutexes, each with its rank in vrange's one lock order
//! (`vrange_sys::lock::Rank::Cache*`): parking_lot mutexes (a waiter parks, which suits a cache
//! that many threads read), whose every wait is checked in debug builds against the ranks the
//! thread already holds, vrange's own locks included.
//!
//! They guard one cache's state and are never held across fork: as with any mutex, a fork
//! child must not use a cache that another thread of its parent was changing at the fork.

use vrange_sys::lock::{Rank, Witness};

/// A `parking_lot::Mutex` with a rank.
#[derive(Debug)]
pub(crate) struct Mutex<T> {
    rank: Rank,
    inner: parking_lot::Mutex<T>,
}

/// Holds a [`Mutex`]; the lock is released before the rank.
pub(crate) struct MutexGuard<'a, T> {
    guard: parking_lot::MutexGuard<'a, T>,
    _witness: Witness,
}

impl<T> Mutex<T> {
    pub(crate) const fn new(rank: Rank, value: T) -> Mutex<T> {
        Mutex {
            rank,
            inner: parking_lot::const_mutex(value),
        }
    }

    /// The value, through the only reference to the mutex: no lock, no rank.
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    /// Takes the lock (debug builds: asserting that this thread holds no lock of this rank or
    /// higher).
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        let witness = Witness::acquire(self.rank);
        MutexGuard {
            guard: self.inner.lock(),
            _witness: witness,
        }
    }

    /// Takes the lock if it is free.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let guard = self.inner.try_lock()?;
        Some(MutexGuard {
            guard,
            _witness: Witness::acquired_without_waiting(self.rank),
        })
    }
}

impl<T> std::ops::Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}
