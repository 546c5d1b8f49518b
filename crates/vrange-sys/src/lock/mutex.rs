//! [`RankedMutex`]: a ranked lock around state that allocates, never held across fork.

use super::held::{ensure_installed, generation};
use super::witness::{Order, Witness};
use super::Rank;
use crate::sync::backoff;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// A lock with a rank around state that allocates or opens files (a join handle, flush hooks,
/// the headroom files), which a [`Lock`](super::Lock), held across fork, must not guard: a
/// thread holding such a lock may call `malloc`, and the fork must not wait for it. Waiting
/// spins, yields, then sleeps, as a `Lock`; the same order is asserted.
///
/// Not held across fork, and yet never waited for in vain by a child: the lock word records the
/// fork generation ([`generation`]) in which it was taken. In a fork child, a lock still held
/// from an earlier generation was held by a thread of the parent, which the child does not have;
/// the next `lock` or `try_lock` takes it over and replaces the value, which that thread may have
/// been changing, with `T::default()` (the old value is leaked, never dropped half-changed).
/// Its first use installs the fork protocol's handlers (which count the generations).
pub struct RankedMutex<T> {
    /// Bit 0: held; the bits above: the fork generation in which it was taken.
    word: AtomicU64,
    value: UnsafeCell<T>,
    rank: Rank,
}

// SAFETY: the value is reached only through a guard, which the lock word makes exclusive; a
// value taken over in a child was left by a thread the child does not have.
unsafe impl<T: Send> Sync for RankedMutex<T> {}

impl<T> std::fmt::Debug for RankedMutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankedMutex")
            .field("rank", &self.rank)
            .finish()
    }
}

/// Holds a [`RankedMutex`] (the witness is released after the lock).
pub struct MutexGuard<'a, T> {
    lock: &'a RankedMutex<T>,
    _witness: Witness,
}

impl<T: Default> RankedMutex<T> {
    /// A lock of `rank` around `value`.
    pub const fn new(rank: Rank, value: T) -> RankedMutex<T> {
        RankedMutex {
            word: AtomicU64::new(0),
            value: UnsafeCell::new(value),
            rank,
        }
    }

    /// Takes the lock, waiting as long as it takes (never for a thread of a parent process).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        ensure_installed();
        let witness = Witness::record(self.rank, Order::Wait);
        let mut round = 0;
        loop {
            if self.take() {
                return MutexGuard {
                    lock: self,
                    _witness: witness,
                };
            }
            backoff(&mut round);
        }
    }

    /// Takes the lock if it is free (or was left held by a thread of a parent process).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        ensure_installed();
        self.take().then(|| MutexGuard {
            lock: self,
            _witness: Witness::record(self.rank, Order::Try),
        })
    }

    /// One attempt: takes the lock if it is free or held from an earlier fork generation.
    fn take(&self) -> bool {
        let generation = generation();
        let word = self.word.load(Ordering::Relaxed);
        let held = word & 1 == 1;
        if held && word >> 1 == generation {
            return false;
        }
        let ours = generation << 1 | 1;
        if self
            .word
            .compare_exchange(word, ours, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        if held {
            // SAFETY: the lock is this thread's now; the thread that held it is not in this
            // process, and the value it may have been changing is forgotten, not dropped.
            std::mem::forget(unsafe { std::ptr::replace(self.value.get(), T::default()) });
        }
        true
    }
}

impl<T> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.word.fetch_and(!1, Ordering::Release);
    }
}

impl<T> std::ops::Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this reference the guard's only one.
        unsafe { &mut *self.lock.value.get() }
    }
}
