//! When memory counts as short, and by how much: the one rule, with every threshold it uses,
//! for every purger and for every client that gives back memory of its own instead of taking
//! more. Callers pass their own numbers in (the bytes they are about to take, the headroom
//! they read); the comparisons are this file's.
//!
//! *Headroom* is what the process's memory cgroup can still charge before anything but clean
//! page cache must go: the ceiling (the hard limit, or v2's `memory.high` where lower) less the
//! usage, with clean page cache counted as free (`vrange_sys::pressure::Headroom::bytes`, one
//! formula for every reader).
//!
//! | question | rule | asked by |
//! |---|---|---|
//! | the threshold | `VRANGE_HEADROOM` bytes, or `auto`: the ceiling / 16, between 4 and 256 MiB ([`auto_threshold`]) | everything below |
//! | is memory short for one about to take `bytes`? | headroom − `bytes` < twice the threshold, the level every purge restores ([`Room::short_for`]) | vrange-cache before a new slab (it recycles its oldest instead), the SQLite page cache before new pages (it reuses its oldest) |
//! | should one able to recycle its oldest for less than the kernel's reclaim costs do so before taking `bytes`? | memory is short for them, or taking them would pass the ceiling, so that the kernel reclaims in the taker's path (free = ceiling − usage, page cache not counted as free, < `bytes`) ([`Room::recycle_for`]) | a refill region before a fill (it makes the block in its oldest block's pages, or gives those back) |
//! | by how much? | back to twice the threshold: 2 × threshold − (headroom − `bytes`), nothing while headroom − `bytes` ≥ threshold ([`deficit`]) | the reclaimer at each tick (`bytes` 0), [`make_room`](crate::reclaimer::make_room) before a client maps memory, the coordinator for its container |
//! | how much a pressure event asks | vmpressure critical: every volatile byte; medium and PSI: `VRANGE_PRESSURE_SHARE` % of them, at least 2 MiB | the reclaimer |
//! | does a vmpressure event ask at all? | only while the headroom is under twice the threshold (the `auto` one where `VRANGE_HEADROOM` is off), or cannot be read ([`vmpressure_purges`]); above it the cgroup's reclaim is cycling clean page cache, which the kernel drops itself | the reclaimer, the coordinator |
//! | is the machine short? (a stall on the system's PSI file purges only then) | MemAvailable < MemTotal / 10 (earlyoom's line) | the reclaimer |
//! | is memory tight? | headroom under what a neighbour faults in within one tick (4 GiB/s × tick), at least 64 MiB; relaxed again above twice that (`watermark`) | `crate::approach` |
//! | how much must the kernel be able to take at once (the armed reserve)? | what can be charged before the reclaimer acts again, beyond the headroom: the faster of 4 GiB/s and twice the measured charge rate, over the tick and the reclaimer's reaction, at least 64 MiB, less the headroom (`burst`, `reserve`) | the reclaimer, which arms the coldest volatile ranges to keep it |
//!
//! A leaf: it names no other module of the crate.

use std::time::Duration;

/// The headroom threshold for a ceiling under `VRANGE_HEADROOM=auto`: a sixteenth of it,
/// between 4 and 256 MiB.
pub fn auto_threshold(ceiling: u64) -> u64 {
    (ceiling / 16).clamp(4 << 20, 256 << 20)
}

/// `VRANGE_HEADROOM`'s value meaning `auto` (the setting is otherwise bytes; 0 is `off`).
pub(crate) const AUTO: u64 = u64::MAX;

/// The threshold a `VRANGE_HEADROOM` setting (bytes, or [`AUTO`]) gives for a ceiling.
pub(crate) fn threshold(setting: u64, ceiling: u64) -> u64 {
    if setting == AUTO {
        auto_threshold(ceiling)
    } else {
        setting
    }
}

/// Bytes to purge so that `headroom` returns to twice `threshold`: none while it is at least
/// the threshold.
pub fn deficit(headroom: u64, threshold: u64) -> u64 {
    if headroom >= threshold {
        0
    } else {
        threshold.saturating_mul(2) - headroom
    }
}

/// How the process's memory stands: its cgroup's headroom and the threshold it must keep
/// (see the module documentation). From [`crate::reclaimer::room`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Bytes the memory cgroup can still charge before anything but clean page cache must go.
    pub headroom: u64,
    /// The headroom to keep (`VRANGE_HEADROOM`).
    pub threshold: u64,
    /// Bytes it can still charge before the kernel reclaims anything, page cache included (the
    /// ceiling less the usage).
    pub free: u64,
}

impl Room {
    /// Bytes that can still be charged before the headroom falls under twice the threshold,
    /// the level every purge restores.
    pub fn left(&self) -> u64 {
        self.headroom
            .saturating_sub(self.threshold.saturating_mul(2))
    }

    /// Whether memory is short for one about to take `bytes` more: the headroom would fall
    /// under twice the threshold. A client that can give back memory of its own (recycle its
    /// oldest slab, page or block) does so instead of taking more. Not the threshold itself:
    /// the reclaimer purges only once that is crossed, and memory charged faster than its
    /// tick (a cache or SQLite reading at memory speed, from several threads) would pass the
    /// limit before it acts; the band between one and two thresholds is the margin for that,
    /// which a client able to recycle must leave alone.
    pub fn short_for(&self, bytes: u64) -> bool {
        self.left() < bytes
    }

    /// Whether one about to take `bytes` more, who can recycle its own oldest memory for less
    /// than the kernel's reclaim costs, should recycle it first: memory is short for them
    /// ([`Room::short_for`]), or taking them would pass the ceiling, and the kernel would
    /// reclaim in the taker's fault or copy, scanning for the oldest pages (this memory's
    /// oldest, lazily freed, among them) while the taker waits. Clean page cache is room by
    /// [`Room::short_for`], because the kernel drops it without anyone purging; it is not free
    /// here, because the kernel drops it only by that reclaim. A refill region asks this before
    /// each fill: its oldest block's pages become the new block (moved, not reclaimed and
    /// allocated again). Not a reason to purge.
    pub fn recycle_for(&self, bytes: u64) -> bool {
        self.short_for(bytes) || self.free < bytes
    }

    /// Bytes to purge before `bytes` more are taken (see [`deficit`]).
    pub fn deficit_after(&self, bytes: u64) -> u64 {
        deficit(self.headroom.saturating_sub(bytes), self.threshold)
    }
}

/// Whether a vmpressure event of a cgroup asks for a purge, given its headroom read at the
/// event (`None`: unreadable) and the threshold (the `auto` one where a process's
/// `VRANGE_HEADROOM` is off: the event still speaks): only while the headroom is under twice
/// the threshold, the level every purge restores. A cgroup whose page cache fills it reclaims
/// at its limit all the time and cgroup v1 reports medium and critical levels for it; while
/// clean page cache is there the kernel drops it by itself, and a purge answering the event
/// (every volatile byte, for a critical one) only makes the program read again what it
/// purged: SQLite's page cache in a 256 MiB container lost its pages to such purges several
/// times a second. Asked by the reclaimer and the coordinator.
pub fn vmpressure_purges(headroom: Option<u64>, threshold: u64) -> bool {
    headroom.is_none_or(|headroom| headroom < threshold.saturating_mul(2))
}

/// The threshold a process's `VRANGE_HEADROOM` `setting` gives a vmpressure event
/// ([`vmpressure_purges`]) under `ceiling`: the `auto` one where the setting is off.
pub(crate) fn event_threshold(setting: u64, ceiling: u64) -> u64 {
    match setting {
        0 => auto_threshold(ceiling),
        s => threshold(s, ceiling),
    }
}

/// Which pressure event asks for a share of the volatile bytes (see [`pressure_share`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// vmpressure's critical level: the cgroup is about to OOM.
    Critical,
    /// vmpressure's medium level, or a PSI trigger.
    Stall,
}

/// Bytes a pressure event asks to purge, given the resident volatile bytes now and
/// `VRANGE_PRESSURE_SHARE`.
pub(crate) fn pressure_share(event: Event, volatile: u64, share_percent: u64) -> u64 {
    const MIN_PURGE: u64 = 2 << 20;
    match event {
        Event::Critical => volatile,
        Event::Stall => (volatile.saturating_mul(share_percent) / 100).max(MIN_PURGE),
    }
}

/// Whether the machine as a whole is short of memory, so that a stall on the system's PSI file
/// should purge: MemAvailable below a tenth of MemTotal (earlyoom's default line). The system
/// file counts stalls of every cgroup, one thrashing at its own limit too; purging here does
/// not relieve that cgroup, and while the machine has memory available it is not this
/// process's to give back (its own cgroup's pressure comes from vmpressure, headroom and v2's
/// `memory.pressure`). Unknown (`None`: no MemAvailable, or /proc unreadable): short.
pub(crate) fn machine_short(meminfo_kb: Option<(u64, u64)>) -> bool {
    match meminfo_kb {
        Some((total_kb, avail_kb)) => avail_kb < total_kb / 10,
        None => true,
    }
}

/// The charge rate assumed of a neighbour, and the least ever assumed: one thread touching fresh
/// 4 KiB pages manages 2-4 GiB/s on the machines vrange is tested on, and a neighbour that has
/// not faulted yet (the burst right after a mark) is measured at nothing.
pub(crate) const FAULT_RATE: u64 = 4 << 30;
/// The factor on a measured charge rate: a rate is measured over a tick, as an average, and a
/// burst inside the tick runs faster than that; two threads faulting at once double it.
const RATE_SAFETY: u64 = 2;
/// The smallest burst (and tight watermark).
const MIN_WATERMARK: u64 = 64 << 20;

/// What can be charged to the memory cgroup before the reclaimer acts again: the faster of
/// [`FAULT_RATE`] and twice the measured charge rate (bytes per second), over `window` (until
/// the reclaimer's next tick, plus its reaction), and at least 64 MiB.
pub(crate) fn burst(measured_rate: u64, window: Duration) -> u64 {
    let rate = FAULT_RATE.max(measured_rate.saturating_mul(RATE_SAFETY));
    let bytes = rate as u128 * window.as_nanos() / 1_000_000_000;
    u64::try_from(bytes).unwrap_or(u64::MAX).max(MIN_WATERMARK)
}

/// Headroom under which memory is tight: what a neighbour faulting at [`FAULT_RATE`] takes
/// within one tick of `poll`, and at least 64 MiB. Relaxed again above twice it.
pub(crate) fn watermark(poll: Duration) -> u64 {
    burst(0, poll)
}

/// The armed reserve: volatile bytes the kernel must be able to take at any moment, by itself,
/// so that a `burst` charged before the reclaimer acts again finds room: what the burst would
/// charge beyond the `headroom` (which counts clean page cache, also the kernel's to drop).
pub(crate) fn reserve(headroom: u64, burst: u64) -> u64 {
    burst.saturating_sub(headroom)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_vmpressure_event_purges_only_while_memory_is_short() {
        let ceiling = 256 * MIB;
        // auto: a threshold of 16 MiB, short under 32 MiB of headroom.
        let auto = event_threshold(AUTO, ceiling);
        assert_eq!(auto, 16 * MIB);
        assert!(vmpressure_purges(Some(31 * MIB), auto));
        assert!(!vmpressure_purges(Some(32 * MIB), auto));
        assert!(vmpressure_purges(None, auto));
        // Headroom purges off: the event still speaks, by the auto threshold.
        assert_eq!(event_threshold(0, ceiling), auto);
        // A set threshold.
        let set = event_threshold(50 * MIB, ceiling);
        assert!(vmpressure_purges(Some(99 * MIB), set));
        assert!(!vmpressure_purges(Some(100 * MIB), set));
    }

    #[test]
    fn thresholds_and_deficits() {
        assert_eq!(auto_threshold(128 * MIB), 8 * MIB);
        assert_eq!(auto_threshold(MIB), 4 * MIB);
        assert_eq!(auto_threshold(16 * MIB), 4 * MIB);
        assert_eq!(auto_threshold(64 << 30), 256 * MIB);
        assert_eq!(threshold(AUTO, 128 * MIB), 8 * MIB);
        assert_eq!(threshold(5 * MIB, 128 * MIB), 5 * MIB);
        assert_eq!(deficit(10, 8), 0);
        assert_eq!(deficit(3, 8), 13);
    }

    #[test]
    fn short_for_a_taker_and_by_how_much() {
        let room = Room {
            headroom: 20 * MIB,
            threshold: 8 * MIB,
            free: 2 * MIB,
        };
        assert_eq!(room.left(), 4 * MIB);
        assert!(!room.short_for(4 * MIB));
        assert!(room.short_for(4 * MIB + 1));
        // Page cache is room, not free: past 2 MiB the kernel reclaims in the taker's path.
        assert!(!room.recycle_for(2 * MIB));
        assert!(room.recycle_for(2 * MIB + 1));
        assert!(
            Room {
                free: 64 * MIB,
                ..room
            }
            .recycle_for(4 * MIB + 1),
            "short"
        );
        assert_eq!(room.deficit_after(0), 0);
        assert_eq!(room.deficit_after(12 * MIB), 0);
        // 16 MiB taken would leave 4: purge back to twice the threshold.
        assert_eq!(room.deficit_after(16 * MIB), 12 * MIB);
        // Over the limit already.
        let over = Room {
            headroom: 0,
            threshold: 8 * MIB,
            free: 0,
        };
        assert!(over.short_for(1));
        assert_eq!(over.deficit_after(u64::MAX), 16 * MIB);
    }

    #[test]
    fn pressure_events_ask_for_a_share() {
        let v = 100 * MIB;
        assert_eq!(pressure_share(Event::Critical, v, 25), v);
        assert_eq!(pressure_share(Event::Stall, v, 25), 25 * MIB);
        assert_eq!(pressure_share(Event::Stall, MIB, 25), 2 * MIB);
        assert_eq!(pressure_share(Event::Stall, u64::MAX, 100), u64::MAX / 100);
    }

    #[test]
    fn the_machine_is_short_under_a_tenth_available() {
        let total = 24 << 20; // KiB
        assert!(!machine_short(Some((total, total / 2))));
        assert!(!machine_short(Some((total, total / 10))));
        assert!(machine_short(Some((total, total / 10 - 1))));
        assert!(machine_short(Some((total, 0))));
        assert!(machine_short(None));
    }

    #[test]
    fn the_watermark_is_what_a_tick_of_faulting_takes() {
        assert_eq!(watermark(Duration::from_millis(100)), 4096 * MIB / 10);
        assert_eq!(watermark(Duration::from_millis(1)), MIN_WATERMARK);
        assert_eq!(watermark(Duration::from_secs(1)), 4096 * MIB);
    }

    #[test]
    fn the_reserve_is_the_burst_beyond_the_headroom() {
        let tick = Duration::from_millis(10);
        // Nothing measured, or slower than the floor: the floor, at least 64 MiB.
        assert_eq!(burst(0, tick), 64 * MIB);
        assert_eq!(burst(MIB, Duration::from_millis(100)), 4096 * MIB / 10);
        // A measured rate counts twice.
        assert_eq!(burst(8 << 30, Duration::from_millis(100)), 1_717_986_918);
        assert_eq!(burst(u64::MAX, Duration::from_secs(1 << 20)), u64::MAX);
        assert_eq!(reserve(40 * MIB, 64 * MIB), 24 * MIB);
        assert_eq!(reserve(100 * MIB, 64 * MIB), 0);
    }
}
