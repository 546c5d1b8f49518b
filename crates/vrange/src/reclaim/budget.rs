//! The budget (`VRANGE_BUDGET`): the mark that crosses it wakes the thread, and a marking
//! thread that finds the thread a whole budget behind purges by itself ([`catch_up`]).

use super::config;
use super::purge::candidates;
use super::start;
use super::victims;
use super::waker::wake;
use super::DISABLED;
use super::IDLE;
use super::STATE;
use super::WAKE_BUDGET;
use super::WAKE_REASONS;
use crate::registry::pause;
use crate::stats;
use crate::stats::Source;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering::AcqRel;
use std::sync::atomic::Ordering::Acquire;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::Ordering::Release;
use vrange_sys::clock::now_ns;

pub(super) static BUDGET_SINCE: AtomicU64 = AtomicU64::new(0);

/// Called by the mark path after a private range became volatile: starts the reclaimer in a
/// fork child, and wakes it when the budget is exceeded. Two relaxed loads when under budget.
pub(crate) fn noticed_mark() {
    if STATE.load(Relaxed) == IDLE {
        start();
    }
    let budget = config::get().budget.load(Relaxed);
    if budget != 0
        && stats::volatile_resident() > budget
        && WAKE_REASONS.fetch_or(WAKE_BUDGET, AcqRel) & WAKE_BUDGET == 0
    {
        BUDGET_SINCE.store(now_ns(), Relaxed);
        wake();
    }
}

/// The slack over the budget before a marking thread stops waiting for the reclaimer thread
/// and purges by itself: the budget again, and at least 16 MiB.
fn budget_ceiling(budget: u64) -> u64 {
    budget.saturating_add(budget.max(16 << 20))
}

/// Purges, in the caller's thread, what the reclaimer thread has fallen behind on: when a
/// budget is set and resident volatile bytes exceed it by its own size again (at least
/// 16 MiB), the oldest ranges are purged down to the budget, as the thread would have done.
/// Returns the bytes freed (counted under [`Source::Budget`]).
///
/// The budget is otherwise kept by the reclaimer thread, which a busy machine may not run for
/// a while; a client that makes memory volatile in a loop (an allocator's frees) could in the
/// meantime reach its memory cgroup's limit with memory only vrange could free, and be
/// OOM-killed. Costs two relaxed loads within bounds; beyond them one caller at a time scans
/// (and after a scan that could not get back under the ceiling, none for a millisecond). The core's own mark calls do this themselves; a client of
/// [`OwnedRange`](crate::OwnedRange) calls it after making ranges volatile, holding no lock a
/// purge could wait for (vrange-malloc: after each free, outside its arena lock). Nothing is
/// purged while the reclaimer is disabled (`VRANGE_RECLAIMER=off`).
pub fn catch_up() -> usize {
    static BUSY: AtomicU8 = AtomicU8::new(0);
    // When the last scan could not get back under the ceiling (the rest was pinned, or being
    // armed): the next waits a millisecond, so that frees do not each scan the registry.
    static STUCK_AT: AtomicU64 = AtomicU64::new(0);
    let budget = config::get().budget.load(Relaxed);
    if budget == 0
        || stats::volatile_resident() <= budget_ceiling(budget)
        || STATE.load(Relaxed) == DISABLED
    {
        return 0;
    }
    let t0 = now_ns();
    if t0.saturating_sub(STUCK_AT.load(Relaxed)) < 1_000_000 || BUSY.swap(1, Acquire) != 0 {
        return 0;
    }
    let excess = stats::volatile_resident().saturating_sub(budget);
    let victims = candidates(excess);
    let p = pause();
    let (ranges, freed) = purge_over_budget(&victims);
    drop(p);
    let stuck = stats::volatile_resident() > budget_ceiling(budget);
    STUCK_AT.store(if stuck { t0 } else { 0 }, Relaxed);
    BUSY.store(0, Release);
    stats::record(Source::Budget, ranges, freed, now_ns() - t0);
    freed as usize
}

pub(super) fn check_budget(woken: bool, t: u64) {
    let budget = config::get().budget.load(Relaxed);
    let volatile = stats::volatile_resident();
    if budget == 0 || volatile <= budget {
        return;
    }
    let since = if woken { BUDGET_SINCE.load(Relaxed) } else { t };
    let victims = candidates(volatile - budget);
    let p = pause();
    let (ranges, bytes) = purge_over_budget(&victims);
    drop(p);
    stats::record(
        Source::Budget,
        ranges,
        bytes,
        now_ns().saturating_sub(since),
    );
}

/// Purges `victims` in order while resident volatile bytes exceed the budget, both read afresh
/// before each: the excess a snapshot was taken for may be stale by the time its ranges are
/// purged (the thread was descheduled between the two; the program took most of its volatile
/// memory back meanwhile, or the budget was switched off), and a purge below the budget would
/// take the newest ranges, which the budget promises to keep.
fn purge_over_budget(victims: &[victims::Candidate]) -> (u64, u64) {
    let (mut ranges, mut bytes) = (0, 0);
    for c in victims {
        let budget = config::get().budget.load(Relaxed);
        if budget == 0 || stats::volatile_resident() <= budget {
            break;
        }
        let (r, b) = victims::purge_oldest(std::slice::from_ref(c), u64::MAX);
        ranges += r;
        bytes += b;
    }
    (ranges, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Options, Policy, VolatileRegion};

    /// A snapshot taken over the budget and purged after the program took most of its volatile
    /// memory back purges nothing: the program is under the budget. (Purging the snapshot's
    /// excess oldest first, as before, took the one range left volatile, the newest.)
    #[test]
    fn a_stale_snapshot_purges_nothing_once_under_the_budget() {
        // No thread: this test is the reclaimer.
        crate::set_option("VRANGE_RECLAIMER", "off").unwrap();
        crate::set_option("VRANGE_BUDGET", "8M").unwrap();
        let regions: Vec<VolatileRegion> = (0..4)
            .map(|_| {
                let r = VolatileRegion::new(
                    4 << 20,
                    Options {
                        policy: Policy::Managed,
                        ..Options::default()
                    },
                )
                .unwrap();
                // SAFETY: the region is this test's, and nothing refers into it.
                unsafe { r.as_ptr().write_bytes(1, r.len()) };
                r
            })
            .collect();
        for r in &regions {
            // SAFETY: no reference into the region is held while it is volatile.
            unsafe { r.mark() }.unwrap();
        }
        let victims = candidates(8 << 20);
        assert_eq!(victims.len(), 4, "{victims:?}");
        for r in &regions[..3] {
            r.unmark().unwrap();
        }
        let (ranges, _) = purge_over_budget(&victims);
        crate::set_option("VRANGE_BUDGET", "0").unwrap();
        assert_eq!(ranges, 0, "a range was purged under the budget");
        assert!(
            !regions[3].unmark().unwrap().was_purged(),
            "the newest went"
        );
    }
}
