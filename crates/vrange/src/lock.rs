//! The ranks of the core's locks, and the locks that carry them. A leaf: it names no other
//! module.
//!
//! Every lock of the core is a [`Lock`] (or, for state that allocates, a [`RankedMutex`]) with a
//! [`Rank`]; a thread takes locks in increasing rank only, and debug builds assert it on every
//! acquisition (a per-thread set of the ranks held, as jemalloc's witnesses). Which [`Lock`]s a
//! fork holds is `crate::fork`'s to say; a [`RankedMutex`] is never held across fork, and a
//! child takes over one that a thread of its parent held (see [`forked`]).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};
use vrange_sys::sync::{backoff, SpinGuard, SpinLock};

/// The rank of each of the core's locks: a thread holding one takes only higher ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(crate) enum Rank {
    /// The refill regions' table: held while a fill function runs, which may create or use
    /// any other region (and so take any lock below).
    RefillTable = 0,
    /// Opening the SIGBUS mode's userfaultfd (may take the registry's lock after it).
    SigbusOpen,
    /// Opening the refill regions' userfaultfd.
    RefillOpen,
    /// Adding and removing regions filled on the faulting thread (`crate::refill_here`).
    RefillHere,
    /// Starting and stopping the reclaimer thread.
    ReclaimerStart,
    /// The reclaimer thread's join handle (taken under `ReclaimerStart`).
    ReclaimerThread,
    /// The headroom file of `make_room`'s callers.
    Room,
    /// Purging (and arming), and scans of every range's state: purges never overlap, and a
    /// shared region is not unmapped under either.
    Purges,
    /// Flush hooks' list (run before a purge's candidates are collected).
    FlushHooks,
    /// The registry's free list of slots.
    Registry,
    /// The owner of an open userfaultfd (taken under its `*Open` lock).
    UffdOwner,
}

/// A spin lock with a rank: never allocates, usable in a `const` static, held across fork by
/// `crate::fork` where its module says so.
pub(crate) struct Lock {
    raw: SpinLock,
    rank: Rank,
}

/// Holds a [`Lock`]; releases it on drop.
#[must_use = "the lock is released when the guard drops"]
pub(crate) struct Guard<'a> {
    _raw: SpinGuard<'a>,
    _witness: Witness,
}

impl Lock {
    pub(crate) const fn new(rank: Rank) -> Lock {
        Lock {
            raw: SpinLock::new(),
            rank,
        }
    }

    #[cfg(test)]
    pub(crate) fn rank(&self) -> Rank {
        self.rank
    }

    /// Takes the lock (debug builds: asserting that this thread holds none of its rank or
    /// higher).
    pub(crate) fn lock(&self) -> Guard<'_> {
        let witness = Witness::acquire(self.rank, true);
        Guard {
            _raw: self.raw.lock(),
            _witness: witness,
        }
    }

    /// Takes the lock if it is free (which cannot deadlock: no order is asserted).
    pub(crate) fn try_lock(&self) -> Option<Guard<'_>> {
        let raw = self.raw.try_lock()?;
        Some(Guard {
            _raw: raw,
            _witness: Witness::acquire(self.rank, false),
        })
    }

    /// Runs `f` under the lock.
    pub(crate) fn with<R>(&self, f: impl FnOnce() -> R) -> R {
        let _held = self.lock();
        f()
    }

    /// For a `pthread_atfork` prepare handler: takes the lock and keeps it.
    pub(crate) fn hold_for_fork(&self) {
        std::mem::forget(Witness::acquire(self.rank, true));
        std::mem::forget(self.raw.lock());
    }

    /// Parent and child handlers: releases the lock taken by [`Lock::hold_for_fork`].
    ///
    /// # Safety
    /// The lock must be held by `hold_for_fork` in this thread, and by no live guard.
    pub(crate) unsafe fn release_after_fork(&self) {
        // SAFETY: the caller's contract is force_unlock's.
        unsafe { self.raw.force_unlock() };
        Witness::released(self.rank);
    }
}

/// A lock with a rank around state that allocates or opens files (a join handle, flush hooks,
/// the headroom files), which [`Lock`]s held across fork must not guard: a thread holding such a
/// lock may call `malloc`, whose locks an allocator's fork handlers take before vrange's.
/// Waiting spins, yields, then sleeps, as a [`Lock`]; the same order is asserted.
///
/// Not held across fork, and yet never waited for in vain by a child: the lock word records the
/// fork generation ([`forked`]) in which it was taken. In a fork child, a lock still held from an
/// earlier generation was held by a thread of the parent, which the child does not have; the
/// next `lock` or `try_lock` takes it over and replaces the value, which that thread may have
/// been changing, with `T::default()` (the old value is leaked, never dropped half-changed).
pub(crate) struct RankedMutex<T> {
    /// Bit 0: held; the bits above: the fork generation in which it was taken.
    word: AtomicU64,
    value: UnsafeCell<T>,
    rank: Rank,
}

// SAFETY: the value is reached only through a guard, which the lock word makes exclusive; a
// value taken over in a child was left by a thread the child does not have.
unsafe impl<T: Send> Sync for RankedMutex<T> {}

/// Holds a [`RankedMutex`] (the witness is released after the lock).
pub(crate) struct MutexGuard<'a, T> {
    lock: &'a RankedMutex<T>,
    _witness: Witness,
}

/// Fork children so far on this process's line (0 in a process that has not been forked from
/// one with vrange's handlers): the generation a [`RankedMutex`] records.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// For the fork protocol's child handler (the child's one thread, before anything else of
/// vrange runs there): every [`RankedMutex`] held now was held by a thread of the parent.
pub(crate) fn forked() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

impl<T: Default> RankedMutex<T> {
    pub(crate) const fn new(rank: Rank, value: T) -> RankedMutex<T> {
        RankedMutex {
            word: AtomicU64::new(0),
            value: UnsafeCell::new(value),
            rank,
        }
    }

    /// Takes the lock, waiting as long as it takes (never for a thread of a parent process).
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        let witness = Witness::acquire(self.rank, true);
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
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.take().then(|| MutexGuard {
            lock: self,
            _witness: Witness::acquire(self.rank, false),
        })
    }

    /// One attempt: takes the lock if it is free or held from an earlier fork generation.
    fn take(&self) -> bool {
        let generation = GENERATION.load(Ordering::Relaxed);
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

/// Records a rank held by this thread (debug builds; nothing in release builds).
struct Witness {
    #[cfg(debug_assertions)]
    rank: Rank,
}

#[cfg(debug_assertions)]
thread_local! {
    /// The ranks this thread holds, one bit each. A const-initialised `Cell` without a
    /// destructor: no allocation, usable from inside an allocator.
    static HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl Witness {
    #[cfg(debug_assertions)]
    fn acquire(rank: Rank, ordered: bool) -> Witness {
        let bit = 1u32 << rank as u8;
        // A thread being torn down (its TLS gone) is not checked.
        let _ = HELD.try_with(|held| {
            let h = held.get();
            // Every rank held must be lower: no bit at `rank` or above.
            assert!(
                !ordered || h >> (rank as u8) == 0,
                "lock order: {rank:?} taken while holding ranks {h:#b}"
            );
            held.set(h | bit);
        });
        Witness { rank }
    }

    #[cfg(not(debug_assertions))]
    #[inline(always)]
    fn acquire(_rank: Rank, _ordered: bool) -> Witness {
        Witness {}
    }

    #[cfg(debug_assertions)]
    fn released(rank: Rank) {
        let _ = HELD.try_with(|held| held.set(held.get() & !(1u32 << rank as u8)));
    }

    #[cfg(not(debug_assertions))]
    #[inline(always)]
    fn released(_rank: Rank) {}
}

impl Drop for Witness {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        Witness::released(self.rank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(debug_assertions)]
    fn taking_a_lower_rank_while_holding_a_higher_one_is_caught() {
        static HIGH: Lock = Lock::new(Rank::Registry);
        static LOW: Lock = Lock::new(Rank::Purges);
        // In order: fine, and released in any order.
        let low = LOW.lock();
        let high = HIGH.lock();
        drop(low);
        drop(high);
        // Out of order: a try is allowed (it cannot deadlock), a wait is not.
        let high = HIGH.lock();
        assert!(LOW.try_lock().is_some());
        let caught = std::panic::catch_unwind(|| drop(LOW.lock()));
        drop(high);
        assert!(caught.is_err(), "the witness catches the inversion");
        // Released on unwinding: the thread holds nothing now.
        drop(LOW.lock());
        drop(HIGH.lock());
    }
}
