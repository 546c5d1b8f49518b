//! Every lock of vrange, in every crate, with its rank, and the one fork protocol that holds
//! them. Internal: the core and its clients (vrange-malloc, vrange-cache) take their locks from
//! here, so that one order covers them all. (vrange-sqlite's cache lock is a plain
//! `sync::SpinLock` outside the ranks: taken before any of these and only tried by the flush
//! hook, never held across fork; docs/DESIGN.md.)
//!
//! - A [`Lock`] is a ranked spin lock that never allocates, usable in a `const` static, and
//!   **held across `fork`**: the forking thread takes every `Lock` ever used, in rank order,
//!   before the fork, so that neither process inherits one held by a thread it does not have
//!   (the fork protocol's handlers, in `held.rs`). A thread holding one must never wait for anything a fork's
//!   preparation could be holding: a program's own code (a fill function, a callback) never
//!   runs under one.
//! - A [`RankedMutex`] guards state that allocates or opens files. It is never held across
//!   fork; a child takes over one that a thread of its parent held (see [`RankedMutex`]).
//! - A [`ForkOnce`] holds what is computed once per process (the kernel's features, the
//!   settings from the environment); a fork child computes again one that a thread of its
//!   parent was computing.
//! - A client's own mutex (vrange-cache's, around per-cache state) records its rank with a
//!   [`Witness`], for the order check alone; it is not held across fork (as any mutex: a
//!   child must not use a cache another thread was changing at the fork).
//!
//! A thread takes locks in increasing [`Rank`] only; debug builds assert it on every
//! acquisition (a per-thread set of the ranks held, as jemalloc's witnesses).

mod held;
mod mutex;
mod once;
mod witness;

pub use held::{generation, Guard, Lock};
pub use mutex::{MutexGuard, RankedMutex};
pub use once::ForkOnce;
pub use witness::Witness;

/// The rank of each of vrange's locks, in every crate: a thread holding one takes only higher
/// ones. Held across fork: every [`Lock`]; the others are [`RankedMutex`]es and clients'
/// mutexes, never held across fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Rank {
    /// The refill thread's life: the regions it serves and whether it runs (`vrange::refill`).
    RefillThread = 0,
    /// Recording and removing regions in the region table (`vrange::regions`).
    Regions,
    /// vrange-cache: a shard's open slab (taken while writing a value into it).
    CacheOpen,
    /// vrange-cache: its own evictions and their merge slabs (the budget takes it with
    /// `try_lock`; recycling waits for it).
    CacheBudget,
    /// vrange-cache: the recycling candidates of the last scan (a merge slab is recycled
    /// under the eviction's lock).
    CacheCandidates,
    /// vrange-cache: one slab's state (its holds, its region).
    CacheSlab,
    /// vrange-cache: the slabs waiting for the flush.
    CacheIdle,
    /// vrange-cache: the process's pool of regions no entry uses (taken alone).
    CachePool,
    /// vrange-malloc: one arena (several exist; a thread holds at most one except a fork's
    /// preparation, which holds them all).
    MallocArena,
    /// vrange-malloc: the shared pool of empty chunks and the segment being carved.
    MallocPool,
    /// vrange-malloc: the cache of freed large blocks.
    MallocLarge,
    /// vrange-malloc: growing the chunk map.
    MallocChunkMap,
    /// Opening the SIGBUS mode's userfaultfd (may take the registry's lock after it).
    SigbusOpen,
    /// Opening the refill regions' userfaultfd.
    RefillOpen,
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

impl Rank {
    /// How many ranks there are.
    pub const COUNT: usize = Rank::UffdOwner as usize + 1;
}
