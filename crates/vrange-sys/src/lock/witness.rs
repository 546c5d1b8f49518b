//! The debug order check: each thread's set of ranks held, asserted on every acquisition.

use super::Rank;

/// Records that this thread holds a lock of some rank, until dropped (debug builds; nothing in
/// release builds). Every lock of this module carries one; a client's own mutex takes one
/// before locking, so that its rank is checked with the others.
#[must_use = "the rank is held until the witness drops"]
#[derive(Debug)]
pub struct Witness {
    #[cfg(debug_assertions)]
    rank: Rank,
}

/// How an acquisition relates to the ranks held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    /// A wait: every rank held must be lower.
    Wait,
    /// A try, which cannot deadlock: nothing is asserted.
    Try,
    /// A fork's preparation taking every lock of a rank: ranks held must not be higher.
    Fork,
}

#[cfg(debug_assertions)]
thread_local! {
    /// The ranks this thread holds, one bit each. A const-initialised `Cell` without a
    /// destructor: no allocation, usable from inside an allocator.
    static HELD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

const _: () = assert!(Rank::COUNT <= 64, "the witness keeps one bit per rank");

impl Witness {
    /// Before waiting for a lock of `rank`: asserts (debug builds) that this thread holds no
    /// lock of that rank or higher, and records it.
    pub fn acquire(rank: Rank) -> Witness {
        Witness::record(rank, Order::Wait)
    }

    /// After taking a lock of `rank` without waiting (a `try_lock`, which cannot deadlock):
    /// records it, asserting nothing.
    pub fn acquired_without_waiting(rank: Rank) -> Witness {
        Witness::record(rank, Order::Try)
    }

    /// Before taking one of several locks of `rank` with tries that fall back to a wait (an
    /// allocator's arenas): asserts (debug builds) that this thread holds no lock of that rank or
    /// higher, as a wait would. A try that succeeds asserts nothing, so without this an
    /// allocation under a higher-ranked lock (which a fork's preparation would wait for while
    /// holding the arenas) passes unnoticed whenever an arena happens to be free.
    #[inline]
    pub fn check_may_wait(rank: Rank) {
        #[cfg(debug_assertions)]
        let _ = HELD.try_with(|held| {
            let h = held.get();
            assert!(
                h >> (rank as u8) == 0,
                "lock order: {rank:?} may be waited for while holding ranks {h:#b}"
            );
        });
        #[cfg(not(debug_assertions))]
        let _ = rank;
    }

    #[cfg(debug_assertions)]
    pub(super) fn record(rank: Rank, order: Order) -> Witness {
        let bit = 1u64 << rank as u8;
        // A thread being torn down (its TLS gone) is not checked.
        let _ = HELD.try_with(|held| {
            let h = held.get();
            let above = match order {
                Order::Wait => h >> (rank as u8) != 0,
                Order::Fork => h >> (rank as u8) >> 1 != 0,
                Order::Try => false,
            };
            assert!(
                !above,
                "lock order: {rank:?} taken while holding ranks {h:#b}"
            );
            held.set(h | bit);
        });
        Witness { rank }
    }

    #[cfg(not(debug_assertions))]
    #[inline(always)]
    pub(super) fn record(_rank: Rank, _order: Order) -> Witness {
        Witness {}
    }

    /// Forgets a rank recorded by a witness that was forgotten (`std::mem::forget`): the fork
    /// protocol's, whose locks stay held past the handler that took them.
    #[cfg(debug_assertions)]
    pub(super) fn released(rank: Rank) {
        let _ = HELD.try_with(|held| held.set(held.get() & !(1u64 << rank as u8)));
    }

    #[cfg(not(debug_assertions))]
    #[inline(always)]
    pub(super) fn released(_rank: Rank) {}
}

impl Drop for Witness {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        Witness::released(self.rank);
    }
}
