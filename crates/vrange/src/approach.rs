//! Arming on approach: while the process's memory cgroup (or, without a limit, the machine) is
//! near its limit, the kernel must be able to take, at any moment and by itself, what a
//! neighbour writing at memory speed can charge before the reclaimer next acts: the *armed
//! reserve* (`crate::short::reserve`). The reclaimer keeps it at each tick by handing the
//! coldest volatile hybrid ranges (the victim order's first) to the kernel's lazy-free path
//! ("arming" them); what it could not arm is a *deficit* that the next marks pay off, each
//! arming its own range as it marks it. Every other volatile range stays managed: a hit on it
//! is a compare-and-swap, no system call, no page proof. Away from the limit nothing is armed
//! but what has been volatile for the arm delay.
//!
//! "Near" is the tight watermark of headroom (`crate::short::watermark`: what a neighbour
//! faults in within a tick, at least 64 MiB). The reclaimer measures headroom when it starts
//! (before any tick, with short-lived reads: no descriptor is kept yet) and at every tick, and
//! ticks at least every [`TIGHT_POLL`] while tight; until its first measure (and in a process
//! whose reclaimer is off) memory counts as tight and every mark arms its range: nothing else
//! would. A pressure event of the process's own cgroup (vmpressure, v2 `memory.pressure`) or
//! of a short machine counts as tight too, for at least [`HOLD`].
//!
//! A *hot* range (marked again within [`HOT`] of its previous mark: a cache's slab, pinned by a
//! hit and marked again by the next tick's flush; a buffer reused in a loop) is neither armed
//! at its mark nor taken for the reserve until it has been idle for [`HOT`]: arming it would
//! cost an madvise(2) over the range and a proof of each page at the next unmark, both wasted
//! when it is pinned again a moment later. The reclaimer still purges it if the headroom calls
//! for it. A range's first mark is never hot.
//!
//! This module owns the flag, the deficit and the hot rule; it never purges.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::time::Duration;

/// Not measured yet (a process whose reclaimer has not looked, or does not run): taken as
/// tight, since nothing else could give its memory back before the limit.
const UNKNOWN: u8 = 0;
const RELAXED: u8 = 1;
const TIGHT: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// The armed reserve the reclaimer aimed for at its last tick (bytes; for `stats()`).
static RESERVE: AtomicU64 = AtomicU64::new(0);
/// Bytes the reclaimer could not arm for the reserve at its last tick (a mark arms its range
/// while this is positive, and takes its bytes off).
static DEFICIT: AtomicU64 = AtomicU64::new(0);
/// When a pressure event last made memory tight (ns), to hold the state for [`HOLD`].
static EVENT_AT: AtomicU64 = AtomicU64::new(0);

/// How long a pressure event keeps memory tight without a headroom measure saying so.
pub(crate) const HOLD: Duration = Duration::from_secs(2);
/// The reclaimer's longest tick while memory is tight.
pub(crate) const TIGHT_POLL: Duration = Duration::from_millis(10);
/// A range marked again within this of its previous mark is hot: armed only once idle this
/// long. Five tight ticks. Public as `vrange::reclaimer::HOT`: a client that keeps memory its
/// user let go a moment before marking it (SQLite's page cache holding a page just unpinned)
/// keeps it at least this long, so that its marks are never hot ones.
pub const HOT: Duration = Duration::from_millis(5 * TIGHT_POLL.as_millis() as u64);

/// Whether a range marked at `now`, previously marked at `previous` (0: never), is hot.
#[inline]
pub(crate) fn is_hot(previous: u64, now: u64) -> bool {
    previous != 0 && now.saturating_sub(previous) < HOT.as_nanos() as u64
}

/// Whether the marking thread arms a hybrid range of `len` bytes it just marked (`hot`: see
/// [`is_hot`]): memory is tight, the reserve short of bytes and the range not hot (its bytes
/// are then taken off the deficit), or no reclaimer has measured (then none may arm it later
/// either). Away from the limit, one relaxed load.
#[inline]
pub(crate) fn arm_at_mark(hot: bool, len: usize) -> bool {
    match STATE.load(Relaxed) {
        RELAXED => false,
        TIGHT => !hot && take_deficit(len as u64),
        _ => true,
    }
}

/// Takes `len` bytes off the deficit if there is one: whether there was.
fn take_deficit(len: u64) -> bool {
    DEFICIT.load(Relaxed) != 0
        && DEFICIT
            .fetch_update(Relaxed, Relaxed, |d| {
                (d != 0).then(|| d.saturating_sub(len))
            })
            .is_ok()
}

/// The reclaimer's tick: it keeps a reserve of `reserve` bytes, of which `missing` could not be
/// armed (0: it is whole).
pub(crate) fn set_reserve(reserve: u64, missing: u64) {
    RESERVE.store(reserve, Relaxed);
    DEFICIT.store(missing, Relaxed);
}

/// The reserve aimed for at the last tick.
pub(crate) fn reserve() -> u64 {
    RESERVE.load(Relaxed)
}

/// Whether memory is tight, or not measured yet (one relaxed load).
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
///
/// Memory that turns tight here has no reserve yet: the reclaimer computes it and its deficit
/// after this measure (`arm`), and only while the process has volatile memory. Until then the
/// deficit is the whole reserve this measure calls for, set before the state, so that a mark
/// in between arms its range as it did before the measure (an emulated guest's first mark
/// came in that window and was left unarmed, with memory tight).
pub(crate) fn update(headroom: Option<u64>, poll: Duration, now: u64) -> bool {
    let mark = crate::short::watermark(poll);
    let was = STATE.load(Relaxed);
    let tight = next(was == TIGHT, headroom, mark, now, EVENT_AT.load(Relaxed));
    if tight && was != TIGHT {
        if let Some(h) = headroom {
            let reserve = crate::short::reserve(h, mark);
            set_reserve(reserve, reserve);
        }
    }
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
    set_reserve(0, 0);
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
    fn marks_pay_off_the_deficit() {
        STATE.store(TIGHT, Relaxed);
        set_reserve(8 * MIB, 3 * MIB);
        assert!(arm_at_mark(false, 2 << 20), "a deficit: armed");
        assert!(!arm_at_mark(true, 2 << 20), "hot: not armed, nothing taken");
        assert!(arm_at_mark(false, 2 << 20), "1 MiB left: armed");
        assert!(!arm_at_mark(false, 2 << 20), "paid off");
        STATE.store(UNKNOWN, Relaxed);
        assert!(arm_at_mark(true, 1), "not measured: every mark arms");
        STATE.store(RELAXED, Relaxed);
        set_reserve(8 * MIB, 3 * MIB);
        assert!(!arm_at_mark(false, 1), "away from the limit: none");
        reset();
        // A first measure finds memory tight: the marks arm before any tick keeps a reserve.
        let poll = Duration::from_millis(10);
        let h = crate::short::watermark(poll) - 4 * MIB;
        assert!(update(Some(h), poll, 1));
        assert!(
            arm_at_mark(false, 2 << 20),
            "tight, no reserve kept yet: armed"
        );
        assert!(arm_at_mark(false, 2 << 20), "2 MiB of 4 left: armed");
        assert!(
            !arm_at_mark(false, 2 << 20),
            "the reserve it called for: paid off"
        );
        assert!(update(Some(h), poll, 2));
        assert!(
            !arm_at_mark(false, 2 << 20),
            "still tight: the tick keeps the deficit"
        );
        reset();
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
