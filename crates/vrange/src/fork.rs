//! The one fork protocol: which locks a fork holds, in rank order, and what each module does
//! in the child. Above every module it names (as jemalloc's `jemalloc_fork.c`); the ranks
//! themselves are `crate::lock`'s.
//!
//! One `pthread_atfork` registration ([`register`], by the first region, owned range, SIGBUS
//! mark, refill region, purge, headroom question or flush hook, even with the reclaimer off)
//! walks [`HELD_ACROSS_FORK`]:
//!
//! - prepare: takes each lock in rank order (the order every call path takes them in; debug
//!   builds assert it as they go);
//! - parent: releases them, highest rank first;
//! - child: closes the child's copies of vrange's private descriptors (each verified first),
//!   then, highest rank first, runs the module's child hook (its lock still held: the child has
//!   one thread) and releases the lock. Ranked mutexes (`crate::lock::RankedMutex`, around
//!   state that allocates) are not held across fork: the child takes over any that a thread
//!   of the parent held, so the public calls that take one register these handlers first.
//!
//! A module's hook resets only its own state.

use crate::lock::Lock;

/// A lock held across fork, and its module's hook for the child: it resets the module's own
/// state (threads and descriptors of the parent's), with the lock still held.
struct Held {
    lock: &'static Lock,
    child: fn(),
}

/// Every lock held across fork, in rank order (checked by a test, and in debug builds by the
/// ranks' witness as the prepare handler takes them).
static HELD_ACROSS_FORK: [Held; 7] = [
    Held {
        lock: &crate::refill::TABLE.lock,
        child: crate::refill::after_fork_child,
    },
    Held {
        lock: &crate::sigbus::UFFD.open,
        child: crate::sigbus::after_fork_child,
    },
    Held {
        lock: &crate::refill::UFFD.open,
        child: crate::refill::uffd_after_fork_child,
    },
    Held {
        lock: &crate::refill_here::LOCK,
        child: crate::refill_here::after_fork_child,
    },
    Held {
        lock: &crate::reclaim::START,
        child: crate::reclaim::after_fork_child,
    },
    Held {
        lock: &crate::registry::PURGES,
        child: || {},
    },
    Held {
        lock: &crate::registry::LOCK,
        child: crate::registry::after_fork_child,
    },
];

/// Installs the fork handlers once per process.
///
/// A client that calls into vrange while holding locks of its own (an allocator's arena locks)
/// calls this first and then registers its own handlers: `fork` runs prepare handlers in
/// reverse order of registration, so the client's locks are taken before vrange's, the same
/// order as on its call paths.
pub fn register() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let _ = vrange_sys::process::at_fork(prepare, parent, child);
    });
}

extern "C" fn prepare() {
    for h in &HELD_ACROSS_FORK {
        h.lock.hold_for_fork();
    }
}

extern "C" fn parent() {
    for h in HELD_ACROSS_FORK.iter().rev() {
        // SAFETY: taken by `prepare` in this thread; fork is not called with vrange's locks
        // held, so no guard of them is live.
        unsafe { h.lock.release_after_fork() };
    }
}

extern "C" fn child() {
    // Every ranked mutex still held belongs to a thread this child does not have.
    crate::lock::forked();
    // The child's copies of vrange's private descriptors (the reclaimer's sources, the
    // coordinator link, the userfaultfds) would keep the parent's registrations and triggers
    // alive: closed, each verified first, before any module forgets its own.
    vrange_sys::fd::close_private_after_fork();
    for h in HELD_ACROSS_FORK.iter().rev() {
        (h.child)();
        // SAFETY: as in `parent`.
        unsafe { h.lock.release_after_fork() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{Rank, RankedMutex};
    use std::time::Duration;
    use vrange_testkit::fork::fork_while;
    use vrange_testkit::proc::Exit;

    /// A ranked mutex held by another thread at the fork: the child takes it over (the value
    /// that thread could have been changing replaced with the default), and the parent's
    /// thread still holds and releases its own.
    #[test]
    fn a_child_takes_over_a_ranked_mutex_a_parent_thread_held() {
        static VALUE: RankedMutex<Option<u32>> = RankedMutex::new(Rank::Room, None);
        register();
        *VALUE.lock() = Some(7);
        let exit = fork_while(
            |wait| {
                let _held = VALUE.lock();
                wait();
            },
            || {
                let taken = VALUE.try_lock().map(|v| *v);
                *VALUE.lock() = Some(8);
                taken == Some(None) && *VALUE.lock() == Some(8)
            },
            Duration::from_secs(20),
        );
        assert_eq!(
            exit,
            Exit::Code(0),
            "the child took the lock and found the default"
        );
        assert_eq!(*VALUE.lock(), Some(7), "the parent's value is its own");
        assert!(
            VALUE.try_lock().is_some(),
            "released by the parent's thread"
        );
    }

    #[test]
    fn locks_held_across_fork_are_listed_in_rank_order() {
        let ranks: Vec<_> = HELD_ACROSS_FORK.iter().map(|h| h.lock.rank()).collect();
        let mut sorted = ranks.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(ranks, sorted);
    }
}
