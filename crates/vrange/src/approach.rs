//! Arming on approach: while the process's memory cgroup (or, without a limit, the machine) is
//! near its limit, every hybrid range goes to the kernel's lazy-free path at once, so that the
//! kernel's own reclaim can take it the moment a neighbour writing at memory speed reaches the
//! limit, without waiting for the reclaimer thread (which a burst of a few milliseconds
//! outruns). Ranges marked while tight are armed by the marking thread; those already volatile,
//! and the allocator's free spans (marked under its locks), at the reclaimer's next pass, which
//! runs at least every [`TIGHT_POLL`]. Away from the limit nothing changes: a mark is one
//! compare-and-swap and hybrid ranges wait for the arm delay.
//!
//! "Near" is what a neighbour can fault in before the reclaimer next looks: the tight watermark
//! of headroom (`crate::short::watermark`). The reclaimer measures headroom when it starts
//! (before any tick, with short-lived reads: no descriptor is kept yet) and at every tick;
//! until its first measure (and in a process whose reclaimer is off) memory counts as tight.
//! A pressure event of the process's own cgroup (vmpressure, v2 `memory.pressure`) or of a
//! short machine counts as tight too, for at least [`HOLD`].
//!
//! Except a *hot* range: one marked again within [`HOT`] of its previous mark (a cache's slab,
//! pinned by a hit and marked again by the next tick's flush; a buffer reused in a loop).
//! Arming it at every mark would cost an madvise(2) over the range at the mark and a proof of
//! each page at the next unmark, both wasted when the range is pinned again a moment later
//! (half the time of a cache serving beside its limit went there). A hot range is armed by the
//! reclaimer once it has been idle for [`HOT`] (five tight ticks: a slab hit between every
//! tick is marked every tick); until then the kernel cannot take it, but the reclaimer, which
//! looks every tick, still purges it if the headroom calls for it: what the process re-marked
//! within the last [`HOT`] is the memory it is using, the last the reclaimer would drop. A
//! range's first mark is never hot: the burst right after a first mark finds it armed. Until
//! a reclaimer has measured, hot ranges are armed at the mark like the others (nothing would
//! arm them later).
//!
//! This module owns the flag and the rule; it never purges.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::time::Duration;

/// Not measured yet (a process whose reclaimer has not looked, or does not run): taken as
/// tight, since nothing else could give its memory back before the limit.
const UNKNOWN: u8 = 0;
const RELAXED: u8 = 1;
const TIGHT: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// When a pressure event last made memory tight (ns), to hold the state for [`HOLD`].
static EVENT_AT: AtomicU64 = AtomicU64::new(0);

/// How long a pressure event keeps memory tight without a headroom measure saying so.
pub(crate) const HOLD: Duration = Duration::from_secs(2);
/// The reclaimer's longest tick while memory is tight.
pub(crate) const TIGHT_POLL: Duration = Duration::from_millis(10);
/// A range marked again within this of its previous mark is hot: armed only once idle this
/// long. Five tight ticks.
pub(crate) const HOT: Duration = Duration::from_millis(5 * TIGHT_POLL.as_millis() as u64);

/// Whether a range marked at `now`, previously marked at `previous` (0: never), is hot.
#[inline]
pub(crate) fn is_hot(previous: u64, now: u64) -> bool {
    previous != 0 && now.saturating_sub(previous) < HOT.as_nanos() as u64
}

/// Whether the marking thread arms a hybrid range it just marked (`hot`: see [`is_hot`]):
/// memory is tight and the range is not hot, or no reclaimer has measured (then none may arm
/// a hot range later either).
#[inline]
pub(crate) fn arm_at_mark(hot: bool) -> bool {
    match STATE.load(Relaxed) {
        RELAXED => false,
        TIGHT => !hot,
        _ => true,
    }
}

/// Whether hybrid ranges are armed as they are marked (one relaxed load: the mark path's cost):
/// memory is tight, or not measured yet.
#[inline]
pub(crate) fn is_tight() -> bool {
    STATE.load(Relaxed) != RELAXED
}

/// The next state given headroom now (`None`: not known) and the current state: tight below
/// the watermark, relaxed above twice it (between, unchanged), held tight for [`HOLD`] after a
/// pressure event at `event_at`.
pub(crate) fn next(tight: bool, headroom: Option<u64>, mark: u64, now: u64, event_at: u64) -> bool {
    let held = event_at != 0 && now.saturating_sub(event_at) < HOLD.as_nanos() as u64;
    match headroom {
        _ if held => true,
        Some(h) if h < mark => true,
        Some(h) if h > mark.saturating_mul(2) => false,
        Some(_) => tight,
        None => false,
    }
}

/// Updates the state from a headroom measure (`None`: no limit known). Returns whether memory
/// is tight now.
pub(crate) fn update(headroom: Option<u64>, poll: Duration, now: u64) -> bool {
    let tight = next(
        STATE.load(Relaxed) == TIGHT,
        headroom,
        crate::short::watermark(poll),
        now,
        EVENT_AT.load(Relaxed),
    );
    STATE.store(if tight { TIGHT } else { RELAXED }, Relaxed);
    tight
}

/// A pressure source of this process's own memory fired at `now`: tight for at least [`HOLD`].
pub(crate) fn pressure_event(now: u64) {
    EVENT_AT.store(now, Relaxed);
    STATE.store(TIGHT, Relaxed);
}

/// Forgets the state: a fork child measures its own, and a stopped reclaimer measures nothing
/// (until then, marks arm: see [`UNKNOWN`]).
pub(crate) fn reset() {
    STATE.store(UNKNOWN, Relaxed);
    EVENT_AT.store(0, Relaxed);
}

/// Headroom of the machine for a process whose cgroup sets no limit: MemAvailable, read from
/// /proc/meminfo (a short-lived descriptor), while the program's standard descriptors are open.
pub(crate) fn machine_headroom() -> Option<u64> {
    if !vrange_sys::fd::std_fds_open() {
        return None;
    }
    let (_, avail_kb) = vrange_sys::procfs::mem_available_kb().ok().flatten()?;
    Some(avail_kb.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn tight_below_the_mark_relaxed_above_twice_it() {
        let mark = 100 * MIB;
        assert!(next(false, Some(99 * MIB), mark, 0, 0));
        assert!(!next(false, Some(150 * MIB), mark, 0, 0));
        assert!(next(true, Some(150 * MIB), mark, 0, 0), "hysteresis");
        assert!(!next(true, Some(201 * MIB), mark, 0, 0));
        assert!(!next(true, None, mark, 0, 0), "no limit known: not tight");
    }

    #[test]
    fn hot_is_marked_again_within_hot() {
        let at = 5_000_000_000;
        let hot = HOT.as_nanos() as u64;
        assert!(!is_hot(0, at), "a first mark");
        assert!(is_hot(at - hot + 1, at));
        assert!(!is_hot(at - hot, at));
    }

    #[test]
    fn a_pressure_event_holds_it_tight() {
        let mark = 100 * MIB;
        let hold = HOLD.as_nanos() as u64;
        let at = 5_000_000_000;
        assert!(next(false, Some(1 << 40), mark, at + hold - 1, at));
        assert!(!next(true, Some(1 << 40), mark, at + hold, at));
    }
}
