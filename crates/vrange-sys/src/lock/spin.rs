//! [`Lock`]: a ranked spin lock, held across fork.

use super::fork;
use super::witness::{Order, Witness};
use super::Rank;
use crate::sync::{SpinGuard, SpinLock};
use std::ptr::null_mut;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicPtr};

/// A spin lock with a rank: never allocates, usable in a `const` static, and held across fork.
/// Waiting spins, then yields, then sleeps.
///
/// Its first acquisition enrolls it in the fork protocol (`super::fork`): from then on the
/// thread that forks takes it, in rank order with every other, before the fork, and releases it
/// in both processes after; in the child, its `child` hook (if any) runs first, with the lock
/// still held (the child has one thread), to forget what belonged to the parent's threads.
/// A lock never taken holds nothing a child could inherit, so it is never enrolled.
pub struct Lock {
    raw: SpinLock,
    rank: Rank,
    child: Option<fn()>,
    enrolled: AtomicBool,
    /// The next lock of the same rank in the fork protocol's list.
    pub(super) next: AtomicPtr<Lock>,
}

/// Holds a [`Lock`]; releases it on drop.
#[must_use = "the lock is released when the guard drops"]
pub struct Guard<'a> {
    _raw: SpinGuard<'a>,
    _witness: Witness,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock").field("rank", &self.rank).finish()
    }
}

impl Lock {
    /// A lock of `rank`, with nothing to forget in a fork child.
    pub const fn new(rank: Rank) -> Lock {
        Lock::with_child_hook(rank, None)
    }

    /// A lock of `rank` whose module runs `child` in a fork child, with the lock held, before
    /// it is released: the module forgets its parent's threads and descriptors there.
    pub const fn with_child_hook(rank: Rank, child: Option<fn()>) -> Lock {
        Lock {
            raw: SpinLock::new(),
            rank,
            child,
            enrolled: AtomicBool::new(false),
            next: AtomicPtr::new(null_mut()),
        }
    }

    /// Its rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Enrolls the lock in the fork protocol before its first acquisition (one relaxed load
    /// after that).
    #[inline]
    fn enroll(&'static self) {
        if !self.enrolled.load(Acquire) {
            fork::enroll(self, &self.enrolled);
        }
    }

    /// Takes the lock (debug builds: asserting that this thread holds none of its rank or
    /// higher).
    pub fn lock(&'static self) -> Guard<'static> {
        self.enroll();
        let witness = Witness::record(self.rank, Order::Wait);
        Guard {
            _raw: self.raw.lock(),
            _witness: witness,
        }
    }

    /// Takes the lock if it is free (which cannot deadlock: no order is asserted).
    pub fn try_lock(&'static self) -> Option<Guard<'static>> {
        self.enroll();
        let raw = self.raw.try_lock()?;
        Some(Guard {
            _raw: raw,
            _witness: Witness::record(self.rank, Order::Try),
        })
    }

    /// Runs `f` under the lock.
    pub fn with<R>(&'static self, f: impl FnOnce() -> R) -> R {
        let _held = self.lock();
        f()
    }

    /// For the fork protocol's prepare handler: takes the lock and keeps it.
    pub(super) fn hold_for_fork(&self) {
        std::mem::forget(Witness::record(self.rank, Order::Fork));
        self.raw.lock_for_fork();
    }

    /// For the parent and child handlers: runs the child hook (in the child) and releases the
    /// lock taken by [`Lock::hold_for_fork`].
    ///
    /// # Safety
    /// The lock must be held by `hold_for_fork` in this thread, and by no live guard.
    pub(super) unsafe fn release_after_fork(&self, in_child: bool) {
        if in_child {
            if let Some(hook) = self.child {
                hook();
            }
        }
        // SAFETY: the caller's contract is force_unlock's.
        unsafe { self.raw.force_unlock() };
        Witness::released(self.rank);
    }

    /// Whether it has been enrolled (for tests).
    pub fn is_enrolled(&self) -> bool {
        self.enrolled.load(Relaxed)
    }
}
