//! [`Lock`], the lock held across fork, and the one fork protocol that holds it: one
//! `pthread_atfork` registration for the process, made at the first use of any lock of this
//! module (nothing to remember at any call site); it holds every [`Lock`] ever taken, in rank
//! order, across the fork. One file: a lock enrolls itself in the protocol, and the protocol
//! takes and releases the locks.
//!
//! - prepare: takes each enrolled lock, lowest rank first (the order every call path takes them
//!   in; debug builds assert it as they go), then the enrollment lock; if a lock was enrolled
//!   meanwhile, it releases them all and starts again (each lock enrolls once, so this ends);
//! - parent: releases them, highest rank first;
//! - child: starts a new fork generation (every [`RankedMutex`](super::RankedMutex) still held
//!   belongs to a thread the child does not have), closes the child's copies of vrange's private
//!   descriptors (each verified first: `crate::fd::close_private_after_fork`), then, highest
//!   rank first, runs each lock's child hook (its lock still held: the child has one thread)
//!   and releases the lock.
//!
//! Locks enroll themselves at their first acquisition, under the enrollment lock, which the
//! prepare handler holds from the end of its walk to the parent or child handler: a lock is
//! either listed and held before a fork or enrolled after it. The walk itself does not hold the
//! enrollment lock: a thread holding one lock may take another for the first time (an arena's
//! lock, then the chunk map's), and a fork that waited for the first while holding the
//! enrollment lock would wait forever. Several locks of one rank (an allocator's arenas) are
//! listed together; only a fork takes more than one of them at once.

use super::witness::{Order, Witness};
use super::Rank;
use crate::sync::{SpinGuard, SpinLock};
use std::ptr::null_mut;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};

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
    next: AtomicPtr<Lock>,
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
            enroll(self, &self.enrolled);
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
    fn hold_for_fork(&self) {
        std::mem::forget(Witness::record(self.rank, Order::Fork));
        self.raw.lock_for_fork();
    }

    /// For the parent and child handlers: runs the child hook (in the child) and releases the
    /// lock taken by [`Lock::hold_for_fork`].
    ///
    /// # Safety
    /// The lock must be held by `hold_for_fork` in this thread, and by no live guard.
    unsafe fn release_after_fork(&self, in_child: bool) {
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

/// Enrolled locks by rank, each list threaded through `Lock::next`.
static HEADS: [AtomicPtr<Lock>; Rank::COUNT] = [const { AtomicPtr::new(null_mut()) }; Rank::COUNT];
/// Serialises enrollment; held by a fork from the end of prepare to parent/child.
static ENROLLING: SpinLock = SpinLock::new();
/// Locks enrolled so far (counted under `ENROLLING`): how a fork's preparation tells that its
/// walk missed none.
static ENROLLED: AtomicUsize = AtomicUsize::new(0);
/// Set while a fork's prepare handler walks the locks (tests only).
#[cfg(test)]
static PREPARING: AtomicBool = AtomicBool::new(false);

/// Fork children so far on this process's line (0 in a process that has not been forked from
/// one with these handlers): the generation a [`RankedMutex`](super::RankedMutex) records.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The fork generation of this process (fork children so far on this process's line).
pub fn generation() -> u64 {
    GENERATION.load(Relaxed)
}

/// Starts a new generation: for the child handler, before anything else of vrange runs there.
fn forked() {
    GENERATION.fetch_add(1, Relaxed);
}

/// The handlers' installation: [`NOT_INSTALLED`], [`INSTALLED`], or the pid of the process
/// whose thread is installing them. One word, so that the installer and its process are seen
/// together: a fork child that finds its parent's pid there (the installing thread did not
/// come along) installs its own, and a thread of the installing process waits. (With the pid
/// in a word of its own, stored after the state, a second thread could read the state set
/// and the pid not yet, take the installation for a parent's, and install the handlers a
/// second time: each fork then ran the preparation twice and waited for itself.)
const NOT_INSTALLED: u32 = 0;
const INSTALLED: u32 = u32::MAX;
static STATE: AtomicU32 = AtomicU32::new(NOT_INSTALLED);
/// Installations in this process (tests: exactly one).
#[cfg(test)]
static INSTALLS: AtomicU32 = AtomicU32::new(0);

/// Installs the handlers once per process; a second caller waits until they are in place.
/// Called before the first acquisition of any lock of this module, so no lock of vrange is
/// held here (registering takes the C library's fork lock, which a fork holds while it runs
/// the prepare handlers).
#[inline]
pub(super) fn ensure_installed() {
    if STATE.load(Acquire) != INSTALLED {
        install();
    }
}

#[cold]
fn install() {
    let me = std::process::id();
    loop {
        match STATE.compare_exchange(NOT_INSTALLED, me, AcqRel, Acquire) {
            Ok(_) => break,
            Err(INSTALLED) => return,
            // Another thread of this process is installing.
            Err(pid) if pid == me => std::thread::yield_now(),
            // A parent's installation, inherited by this fork child without its thread.
            Err(pid) => {
                let _ = STATE.compare_exchange(pid, NOT_INSTALLED, AcqRel, Acquire);
            }
        }
    }
    #[cfg(test)]
    INSTALLS.fetch_add(1, Relaxed);
    // Without room for the handlers (ENOMEM: the process is dying), a fork child could inherit
    // a lock held: nothing better to do than what the C library's own allocator does.
    let _ = crate::process::at_fork(prepare, parent, child);
    STATE.store(INSTALLED, Release);
}

/// Adds `lock` to the fork protocol's list, once (`enrolled` is its flag).
#[cold]
fn enroll(lock: &'static Lock, enrolled: &AtomicBool) {
    ensure_installed();
    let _held = ENROLLING.lock();
    if enrolled.load(Relaxed) {
        return;
    }
    let head = &HEADS[lock.rank() as usize];
    lock.next.store(head.load(Relaxed), Relaxed);
    head.store(lock as *const Lock as *mut Lock, Release);
    enrolled.store(true, Release);
    ENROLLED.fetch_add(1, Release);
}

/// Calls `f` on every lock of a rank's list from `head` (lists only grow at their head, so
/// the locks listed from a head read earlier are the same ones).
fn each_from(head: *mut Lock, mut f: impl FnMut(&'static Lock)) {
    let mut p = head;
    // SAFETY: only `&'static Lock`s are listed, never removed.
    while let Some(lock) = unsafe { p.as_ref() } {
        f(lock);
        p = lock.next.load(Relaxed);
    }
}

/// Calls `f` on every enrolled lock of `rank`.
fn each(rank: usize, f: impl FnMut(&'static Lock)) {
    each_from(HEADS[rank].load(Acquire), f);
}

extern "C" fn prepare() {
    #[cfg(test)]
    PREPARING.store(true, Relaxed);
    loop {
        let enrolled = ENROLLED.load(Acquire);
        let mut heads = [null_mut(); Rank::COUNT];
        for (rank, head) in heads.iter_mut().enumerate() {
            *head = HEADS[rank].load(Acquire);
            each_from(*head, Lock::hold_for_fork);
        }
        ENROLLING.lock_for_fork();
        if ENROLLED.load(Acquire) == enrolled {
            // Every lock enrolled before this point was in the walk, and none enrolls now.
            #[cfg(test)]
            PREPARING.store(false, Relaxed);
            return;
        }
        // A lock enrolled during the walk (in a rank already walked, it may be held now):
        // release all and walk again, in order.
        for head in heads.iter().rev() {
            // SAFETY: each was taken by the walk above in this thread, which holds no guard of
            // them.
            each_from(*head, |lock| unsafe { lock.release_after_fork(false) });
        }
        // SAFETY: taken just above.
        unsafe { ENROLLING.force_unlock() };
    }
}

extern "C" fn parent() {
    for rank in (0..Rank::COUNT).rev() {
        // SAFETY: each was taken by `prepare` in this thread; fork is not called with one of
        // these locks held by the forking thread, so no guard of them is live.
        each(rank, |lock| unsafe { lock.release_after_fork(false) });
    }
    // SAFETY: taken by `prepare`.
    unsafe { ENROLLING.force_unlock() };
}

extern "C" fn child() {
    forked();
    // The child's copies of vrange's private descriptors (the reclaimer's sources, the
    // coordinator link, the userfaultfds) would keep the parent's registrations and triggers
    // alive: closed, each verified first, before any module forgets its own.
    crate::fd::close_private_after_fork();
    for rank in (0..Rank::COUNT).rev() {
        // SAFETY: as in `parent`.
        each(rank, |lock| unsafe { lock.release_after_fork(true) });
    }
    // SAFETY: as in `parent`.
    unsafe { ENROLLING.force_unlock() };
}

#[cfg(test)]
mod tests {
    use super::super::RankedMutex;
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// Forks; the child runs `body` and exits with 0 if it returned true. Returns whether the
    /// child did so within `limit` (it is killed after).
    fn fork_and_check(body: impl FnOnce() -> bool, limit: Duration) -> bool {
        // SAFETY: the child runs `body` and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok = body();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let deadline = std::time::Instant::now() + limit;
        loop {
            let mut status = 0;
            // SAFETY: waits for our own child without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
            }
            if std::time::Instant::now() > deadline {
                // SAFETY: our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                // SAFETY: reaps it.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether `lock` can be taken by a try within 20 s: another test's fork takes every
    /// enrolled lock for a moment, so a single try in the parent may find it held.
    fn free_soon(lock: &'static Lock) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if lock.try_lock().is_some() {
                return true;
            }
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    static HOOKED: AtomicUsize = AtomicUsize::new(0);
    fn child_hook() {
        HOOKED.fetch_add(1, Relaxed);
    }
    static HELD: Lock = Lock::with_child_hook(Rank::Regions, Some(child_hook));
    static NEVER: Lock = Lock::new(Rank::Registry);

    /// While a thread of this process installs the handlers, another waits for it rather than
    /// installing them a second time (which made every fork prepare twice and wait for
    /// itself); an installation inherited from a parent, whose thread did not come along, is
    /// taken over. In a fork child, whose state the test may set.
    #[test]
    fn the_handlers_are_installed_once_and_a_parents_installation_is_taken_over() {
        let ok = fork_and_check(
            || {
                let me = std::process::id();
                STATE.store(me, Release);
                INSTALLS.store(0, Relaxed);
                let waiter = std::thread::spawn(ensure_installed);
                std::thread::sleep(Duration::from_millis(100));
                let waited = INSTALLS.load(Relaxed) == 0 && !waiter.is_finished();
                STATE.store(INSTALLED, Release);
                let joined = waiter.join().is_ok() && INSTALLS.load(Relaxed) == 0;
                // The parent's (a pid that is not this process's).
                STATE.store(me.wrapping_add(1).max(1), Release);
                ensure_installed();
                let taken_over = INSTALLS.load(Relaxed) == 1 && STATE.load(Acquire) == INSTALLED;
                waited && joined && taken_over
            },
            Duration::from_secs(30),
        );
        assert!(ok, "installed twice, or a parent's installation waited for");
    }

    /// A lock another thread holds when a fork starts: the fork waits for it, so the child
    /// takes it at once; the lock's child hook ran there; a lock never taken is not enrolled.
    #[test]
    fn a_fork_waits_for_a_held_lock_and_the_child_finds_it_free() {
        drop(HELD.lock());
        assert!(HELD.is_enrolled() && !NEVER.is_enrolled());
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let _g = HELD.lock();
            held_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        });
        held_rx.recv().unwrap();
        let t0 = std::time::Instant::now();
        let ok = fork_and_check(
            || HELD.try_lock().is_some() && HOOKED.load(Relaxed) == 1,
            Duration::from_secs(20),
        );
        assert!(ok, "the child found the lock free and its hook run");
        assert!(
            t0.elapsed() >= Duration::from_millis(100),
            "the fork waited for the holder"
        );
        holder.join().unwrap();
        assert_eq!(HOOKED.load(Relaxed), 0, "the hook runs in the child only");
        assert!(free_soon(&HELD), "released in the parent");
    }

    /// A thread holding one lock takes another for the first time while a fork prepares (an
    /// arena's lock, then the chunk map's): the fork waits for the first lock, the thread
    /// enrolls the second, and the fork completes with both released in the child.
    #[test]
    fn a_first_acquisition_under_a_held_lock_does_not_hang_a_fork() {
        static OUTER: Lock = Lock::new(Rank::MallocArena);
        static INNER: Lock = Lock::new(Rank::MallocChunkMap);
        let scenario = || {
            drop(OUTER.lock());
            let (held_tx, held_rx) = std::sync::mpsc::channel();
            let holder = std::thread::spawn(move || {
                let outer = OUTER.lock();
                held_tx.send(()).unwrap();
                // Until the fork's preparation runs (and has had time to reach OUTER).
                while !PREPARING.load(Relaxed) {
                    std::thread::yield_now();
                }
                std::thread::sleep(Duration::from_millis(100));
                drop(INNER.lock());
                drop(outer);
            });
            held_rx.recv().unwrap();
            let forked = fork_and_check(
                || INNER.try_lock().is_some() && OUTER.try_lock().is_some(),
                Duration::from_secs(20),
            );
            holder.join().unwrap();
            forked && INNER.is_enrolled()
        };
        assert!(
            fork_and_check(scenario, Duration::from_secs(40)),
            "the fork completed and the child found both locks free"
        );
    }

    /// A ranked mutex held by another thread at the fork: the child takes it over (the value
    /// that thread could have been changing replaced with the default), and the parent's
    /// thread still holds and releases its own.
    #[test]
    fn a_child_takes_over_a_ranked_mutex_a_parent_thread_held() {
        static VALUE: RankedMutex<Option<u32>> = RankedMutex::new(Rank::Room, None);
        *VALUE.lock() = Some(7);
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _g = VALUE.lock();
            held_tx.send(()).unwrap();
            let _ = release_rx.recv();
        });
        held_rx.recv().unwrap();
        let ok = fork_and_check(
            || {
                let taken = VALUE.try_lock().map(|v| *v);
                *VALUE.lock() = Some(8);
                taken == Some(None) && *VALUE.lock() == Some(8)
            },
            Duration::from_secs(20),
        );
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(ok, "the child took the lock and found the default");
        assert_eq!(*VALUE.lock(), Some(7), "the parent's value is its own");
    }

    #[test]
    #[cfg(debug_assertions)]
    fn taking_a_lower_rank_while_holding_a_higher_one_is_caught() {
        static HIGH: Lock = Lock::new(Rank::UffdOwner);
        static LOW: Lock = Lock::new(Rank::Purges);
        // In order: fine, and released in any order.
        let low = LOW.lock();
        let high = HIGH.lock();
        drop(low);
        drop(high);
        // Out of order: a try is allowed (it cannot deadlock), a wait is not.
        let high = HIGH.lock();
        assert!(free_soon(&LOW));
        let caught = std::panic::catch_unwind(|| drop(LOW.lock()));
        drop(high);
        assert!(caught.is_err(), "the witness catches the inversion");
        // An allocator's arena lock, taken by tries that fall back to a wait, is checked as a
        // wait before the tries (an allocation under a higher lock).
        let high = HIGH.lock();
        let caught = std::panic::catch_unwind(|| Witness::check_may_wait(Rank::Purges));
        drop(high);
        assert!(
            caught.is_err(),
            "the witness catches an arena lock under a higher one"
        );
        // Released on unwinding: the thread holds nothing now.
        drop(LOW.lock());
        drop(HIGH.lock());
    }
}
