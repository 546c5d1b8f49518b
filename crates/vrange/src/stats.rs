//! Statistics of managed purging: gauges computed from the registry when asked (exact, and free
//! on the hot path), counters of purges by pressure source with reaction times, and the one
//! counter the mark path keeps, resident volatile bytes, striped so that threads marking
//! different ranges do not contend on one cache line.

use crate::registry;
use crate::state;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};

/// What made the reclaimer purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Source {
    /// A PSI trigger on /proc/pressure/memory.
    Psi = 0,
    /// A PSI trigger on the process's cgroup v2 memory.pressure.
    PsiCgroup = 1,
    /// cgroup v1 memory.pressure_level "medium".
    VmpressureMedium = 2,
    /// cgroup v1 memory.pressure_level "critical".
    VmpressureCritical = 3,
    /// The cgroup's limit minus its usage fell under the headroom threshold.
    Headroom = 4,
    /// Resident volatile bytes exceeded the budget.
    Budget = 5,
    /// `purge()` / `vrange_purge()`.
    Explicit = 6,
}

impl Source {
    /// Every source, in the order of [`Stats::sources`].
    pub const ALL: [Source; 7] = [
        Source::Psi,
        Source::PsiCgroup,
        Source::VmpressureMedium,
        Source::VmpressureCritical,
        Source::Headroom,
        Source::Budget,
        Source::Explicit,
    ];

    /// A short lower-case name (as in `VRANGE_*` settings and reports).
    pub fn name(self) -> &'static str {
        match self {
            Source::Psi => "psi",
            Source::PsiCgroup => "psi-cgroup",
            Source::VmpressureMedium => "vmpressure-medium",
            Source::VmpressureCritical => "vmpressure-critical",
            Source::Headroom => "headroom",
            Source::Budget => "budget",
            Source::Explicit => "explicit",
        }
    }
}

/// Counters of one pressure source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Times the source fired (or, for polled sources, was found over its threshold).
    pub events: u64,
    /// Ranges purged in response.
    pub ranges: u64,
    /// Bytes purged in response.
    pub bytes: u64,
    /// Signal to bytes freed, for the last event that purged anything (ns).
    pub reaction_last_ns: u64,
    /// The slowest such reaction (ns).
    pub reaction_max_ns: u64,
    /// Sum of reaction times over events that purged anything (ns); divide by `purging_events`.
    pub reaction_total_ns: u64,
    /// Events that purged anything.
    pub purging_events: u64,
}

/// A snapshot of managed purging in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Managed ranges volatile now (including armed ones), and their bytes.
    pub volatile_ranges: u64,
    pub volatile_bytes: u64,
    /// Of those, ranges handed to the kernel path (hybrid, after the arm delay), and bytes.
    pub armed_ranges: u64,
    pub armed_bytes: u64,
    /// Ranges purged and not yet unmarked, and their bytes.
    pub purged_ranges: u64,
    pub purged_bytes: u64,
    /// Pinned managed ranges and their bytes.
    pub pinned_ranges: u64,
    pub pinned_bytes: u64,
    /// Bytes purged by this process since start, all sources.
    pub purged_total_bytes: u64,
    /// Bytes handed to the kernel path since start.
    pub armed_total_bytes: u64,
    /// Unmarks that reported a loss.
    pub losses_reported: u64,
    /// Holders of shared regions (other processes' mappings) whose process died, whose pins
    /// this process released.
    pub dead_holders_released: u64,
    /// Whether the reclaimer thread is running.
    pub reclaimer_running: bool,
    /// Descriptors vrange holds now (its pressure sources; shared regions' not included).
    pub descriptors_held: u64,
    /// Times vrange found one of its descriptors closed or replaced by the program (it
    /// forgot it, never closing or using it, and opened a new one where it could).
    pub descriptors_lost: u64,
    /// Descriptors vrange did not open because no number above its floor was free.
    pub descriptors_no_room: u64,
    /// Scratch regions live now, and the bytes they reserve (address space, not what is
    /// resident: see [`ScratchRegion::resident_bytes`](crate::ScratchRegion::resident_bytes)).
    pub scratch_regions: u64,
    pub scratch_bytes: u64,
    /// Blocks of refill regions filled since the start, their bytes, and fills that failed
    /// (each raised SIGBUS in the faulting thread).
    pub refill_fills: u64,
    pub refill_bytes: u64,
    pub refill_failures: u64,
    /// Bytes of refill blocks the kernel had not taken that a fill gave back first, because
    /// the memory cgroup could not take the new block without reclaim (the pages kept): moved
    /// into the fill's buffer where the kernel moves pages (`UFFDIO_MOVE`), else dropped.
    pub refill_recycled_bytes: u64,
    /// Of `refill_recycled_bytes`, those moved into a fill's buffer (`UFFDIO_MOVE`) rather than
    /// given back; the kernel refuses to move a page shared with a fork child, which is given
    /// back instead.
    pub refill_recycled_moved_bytes: u64,
    /// The armed reserve the reclaimer aimed for at its last look: volatile bytes it arms so
    /// that the kernel can take them by itself (what it could not arm is left to the next
    /// marks; 0 away from the limit; see README, "Against a neighbour writing at memory
    /// speed").
    pub reserve_bytes: u64,
    /// Bytes of refill blocks put in place by moving the fill buffer's pages (`UFFDIO_MOVE`,
    /// Linux 6.8) rather than copying them (`UFFDIO_COPY`).
    pub refill_moved_bytes: u64,
    /// 2 MiB huge pages an unmark proved with one locked write, the rest of their pages read
    /// plainly, because one page-table entry mapped each (kernel path, PAGEMAP_SCAN).
    pub huge_proofs: u64,
    /// Per source, indexed like [`Source::ALL`].
    pub sources: [SourceStats; 7],
    /// What a client allocator built on vrange reports (zero without one).
    pub allocator: AllocatorStats,
    /// This process as a participant of a coordinator (`vrange daemon`).
    pub coordinator: CoordinatorStats,
}

/// This process's dealings with a coordinator (see [`coordination`](crate::coordination)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Whether a live coordinator orders this process's pressure purges now.
    pub connected: bool,
    /// Times this process connected to a coordinator.
    pub connections: u64,
    /// Purge requests obeyed, and the ranges and bytes they freed.
    pub requests: u64,
    pub ranges: u64,
    pub bytes: u64,
    /// Pressure signals left to the coordinator (this process's own reclaimer would have
    /// purged on them).
    pub deferred: u64,
}

static COORD_CONNECTED: AtomicBool = AtomicBool::new(false);
static COORD: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

/// Whether a live coordinator orders this process's purges (for [`stats`]).
pub(crate) fn set_coordinated(on: bool) {
    COORD_CONNECTED.store(on, Relaxed);
}

/// A connection to a coordinator was made.
pub(crate) fn count_coordinator_connection() {
    COORD[0].fetch_add(1, Relaxed);
}

/// A coordinator's purge request freed `ranges` ranges, `bytes` bytes.
pub(crate) fn record_coordinated(ranges: u64, bytes: u64) {
    COORD[1].fetch_add(1, Relaxed);
    COORD[2].fetch_add(ranges, Relaxed);
    COORD[3].fetch_add(bytes, Relaxed);
}

/// A pressure signal was left to the coordinator.
pub(crate) fn count_deferred() {
    COORD[4].fetch_add(1, Relaxed);
}

fn coordinator_stats() -> CoordinatorStats {
    CoordinatorStats {
        connected: COORD_CONNECTED.load(Relaxed),
        connections: COORD[0].load(Relaxed),
        requests: COORD[1].load(Relaxed),
        ranges: COORD[2].load(Relaxed),
        bytes: COORD[3].load(Relaxed),
        deferred: COORD[4].load(Relaxed),
    }
}

/// The counters of an allocator whose free memory is volatile (vrange-malloc), reported with
/// the core's statistics. Its free volatile and purged bytes are in the core's own gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes handed out and not yet freed (rounded to the allocator's units).
    pub allocated_bytes: u64,
    /// Bytes free in the allocator's hands (volatile, armed or purged).
    pub free_bytes: u64,
    /// Address space the allocator holds.
    pub mapped_bytes: u64,
    /// Bytes handed out from free memory found intact: reuse without a page fault.
    pub reused_intact_bytes: u64,
    /// Bytes handed out from never-touched or purged memory: they read as zero and fault in
    /// on first touch.
    pub zero_filled_bytes: u64,
    /// Allocations and frees served.
    pub allocations: u64,
    pub frees: u64,
}

static ALLOCATOR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Registers the function [`stats`] calls to fill [`Stats::allocator`] (one allocator per
/// process; a later registration replaces an earlier one).
pub fn register_allocator(report: fn() -> AllocatorStats) {
    ALLOCATOR.store(report as usize, Relaxed);
}

fn allocator_stats() -> AllocatorStats {
    match ALLOCATOR.load(Relaxed) {
        0 => AllocatorStats::default(),
        f => {
            // SAFETY: the only non-zero value stored is a `fn() -> AllocatorStats`.
            let report: fn() -> AllocatorStats = unsafe { std::mem::transmute(f) };
            report()
        }
    }
}

impl Stats {
    /// The counters of one source.
    pub fn source(&self, s: Source) -> &SourceStats {
        &self.sources[s as usize]
    }
}

const STRIPES: usize = 16;

#[repr(align(64))]
struct Padded(AtomicI64);

static VOLATILE: [Padded; STRIPES] = [const { Padded(AtomicI64::new(0)) }; STRIPES];

fn stripe(idx: u32) -> &'static AtomicI64 {
    &VOLATILE[idx as usize % STRIPES].0
}

/// A private range of slot `idx` became volatile (`bytes` resident volatile bytes more).
pub(crate) fn volatile_add(idx: u32, bytes: usize) {
    stripe(idx).fetch_add(bytes as i64, Relaxed);
}

/// A private range of slot `idx` stopped being resident and volatile.
pub(crate) fn volatile_sub(idx: u32, bytes: usize) {
    stripe(idx).fetch_sub(bytes as i64, Relaxed);
}

static REFILLS: AtomicU64 = AtomicU64::new(0);
static REFILL_BYTES: AtomicU64 = AtomicU64::new(0);
static REFILL_FAILURES: AtomicU64 = AtomicU64::new(0);
static REFILL_RECYCLED: AtomicU64 = AtomicU64::new(0);
static REFILL_MOVED: AtomicU64 = AtomicU64::new(0);
static REFILL_RECYCLED_MOVED: AtomicU64 = AtomicU64::new(0);

/// Bytes of a refill block put in place by moving pages (`refill_block`).
pub(crate) fn count_refill_moved(bytes: usize) {
    if bytes > 0 {
        REFILL_MOVED.fetch_add(bytes as u64, Relaxed);
    }
}

/// Bytes of refill blocks given back before a fill (`refill_block::recycle`), `moved` of them
/// into the fill's buffer.
pub(crate) fn count_refill_recycled(bytes: usize, moved: usize) {
    if bytes > 0 {
        REFILL_RECYCLED.fetch_add(bytes as u64, Relaxed);
    }
    if moved > 0 {
        REFILL_RECYCLED_MOVED.fetch_add(moved as u64, Relaxed);
    }
}

/// A block of a refill region was filled.
pub(crate) fn count_refill(bytes: usize) {
    REFILLS.fetch_add(1, Relaxed);
    REFILL_BYTES.fetch_add(bytes as u64, Relaxed);
}

/// A refill region's fill failed.
pub(crate) fn count_refill_failure() {
    REFILL_FAILURES.fetch_add(1, Relaxed);
}

/// Resident volatile bytes of private managed ranges (the budget's measure). A sum of relaxed
/// counters: exact when no mark or unmark runs concurrently.
pub(crate) fn volatile_resident() -> u64 {
    VOLATILE
        .iter()
        .map(|s| s.0.load(Relaxed))
        .sum::<i64>()
        .max(0) as u64
}

#[derive(Default)]
struct SourceCounters {
    events: AtomicU64,
    ranges: AtomicU64,
    bytes: AtomicU64,
    last: AtomicU64,
    max: AtomicU64,
    total: AtomicU64,
    purging: AtomicU64,
}

static SOURCES: [SourceCounters; 7] = [const {
    SourceCounters {
        events: AtomicU64::new(0),
        ranges: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        last: AtomicU64::new(0),
        max: AtomicU64::new(0),
        total: AtomicU64::new(0),
        purging: AtomicU64::new(0),
    }
}; 7];
static PURGED_TOTAL: AtomicU64 = AtomicU64::new(0);
static ARMED_TOTAL: AtomicU64 = AtomicU64::new(0);
static LOSSES: AtomicU64 = AtomicU64::new(0);
static HOLDERS_RELEASED: AtomicU64 = AtomicU64::new(0);

/// A source fired and its response purged `ranges` ranges, `bytes` bytes, `reaction_ns` after
/// the signal.
pub(crate) fn record(source: Source, ranges: u64, bytes: u64, reaction_ns: u64) {
    let c = &SOURCES[source as usize];
    c.events.fetch_add(1, Relaxed);
    if ranges == 0 {
        return;
    }
    c.ranges.fetch_add(ranges, Relaxed);
    c.bytes.fetch_add(bytes, Relaxed);
    c.last.store(reaction_ns, Relaxed);
    c.max.fetch_max(reaction_ns, Relaxed);
    c.total.fetch_add(reaction_ns, Relaxed);
    c.purging.fetch_add(1, Relaxed);
}

pub(crate) fn count_purged(bytes: usize) {
    PURGED_TOTAL.fetch_add(bytes as u64, Relaxed);
}

pub(crate) fn count_armed(bytes: usize) {
    ARMED_TOTAL.fetch_add(bytes as u64, Relaxed);
}

/// 2 MiB blocks unmarks proved with one pin (see `huge_proof`).
static HUGE_PROOFS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn count_huge_proofs(blocks: u32) {
    if blocks > 0 {
        HUGE_PROOFS.fetch_add(u64::from(blocks), Relaxed);
    }
}

pub(crate) fn count_purge_seen() {
    LOSSES.fetch_add(1, Relaxed);
}

pub(crate) fn count_holders_released(n: usize) {
    HOLDERS_RELEASED.fetch_add(n as u64, Relaxed);
}

/// Whether the reclaimer thread runs, as the reclaimer last said (it depends on this module,
/// not the reverse).
static RECLAIMER_RUNNING: AtomicBool = AtomicBool::new(false);

pub(crate) fn set_reclaimer_running(running: bool) {
    RECLAIMER_RUNNING.store(running, Relaxed);
}

/// Takes a snapshot: gauges from the registry, counters since start.
pub fn stats() -> Stats {
    let mut s = Stats::default();
    // Shared regions' pages live in their mappings: read under the purge lock, which freeing a
    // shared region takes (see `registry::Slot::header`).
    let p = registry::pause();
    registry::for_each_live(|_, slot| {
        if slot.policy() == crate::Policy::Lazy {
            return;
        }
        if let Some(h) = slot.header() {
            // Each state the region's pages are in counts as one range of it.
            let page = crate::page_size() as u64;
            let c = h.census(None, 0, h.pages().len());
            for (n, ranges, bytes) in [
                (c.volatile, &mut s.volatile_ranges, &mut s.volatile_bytes),
                (c.purged, &mut s.purged_ranges, &mut s.purged_bytes),
                (c.pinned, &mut s.pinned_ranges, &mut s.pinned_bytes),
            ] {
                *ranges += u64::from(n > 0);
                *bytes += n * page;
            }
            return;
        }
        let len = slot.len.load(Relaxed) as u64;
        match state::tag(slot.state().load()) {
            state::VOLATILE => {
                s.volatile_ranges += 1;
                s.volatile_bytes += len;
            }
            state::ARMING | state::ARMED => {
                s.volatile_ranges += 1;
                s.volatile_bytes += len;
                s.armed_ranges += 1;
                s.armed_bytes += slot.armed.load(Relaxed) as u64;
            }
            state::PURGING | state::PURGED => {
                s.purged_ranges += 1;
                s.purged_bytes += len;
            }
            _ => {
                s.pinned_ranges += 1;
                s.pinned_bytes += len;
            }
        }
    });
    drop(p);
    s.purged_total_bytes = PURGED_TOTAL.load(Relaxed);
    s.armed_total_bytes = ARMED_TOTAL.load(Relaxed);
    s.losses_reported = LOSSES.load(Relaxed);
    s.dead_holders_released = HOLDERS_RELEASED.load(Relaxed);
    let fds = vrange_sys::fd::counts();
    s.descriptors_held = fds.held;
    s.descriptors_lost = fds.lost;
    s.descriptors_no_room = fds.no_room;
    s.reclaimer_running = RECLAIMER_RUNNING.load(Relaxed);
    (s.scratch_regions, s.scratch_bytes) = crate::regions::totals(crate::extents::Kind::Scratch);
    s.refill_fills = REFILLS.load(Relaxed);
    s.refill_bytes = REFILL_BYTES.load(Relaxed);
    s.refill_failures = REFILL_FAILURES.load(Relaxed);
    s.refill_recycled_bytes = REFILL_RECYCLED.load(Relaxed);
    s.refill_recycled_moved_bytes = REFILL_RECYCLED_MOVED.load(Relaxed);
    s.reserve_bytes = crate::approach::reserve();
    s.refill_moved_bytes = REFILL_MOVED.load(Relaxed);
    s.huge_proofs = HUGE_PROOFS.load(Relaxed);
    s.allocator = allocator_stats();
    s.coordinator = coordinator_stats();
    for (out, c) in s.sources.iter_mut().zip(SOURCES.iter()) {
        *out = SourceStats {
            events: c.events.load(Relaxed),
            ranges: c.ranges.load(Relaxed),
            bytes: c.bytes.load(Relaxed),
            reaction_last_ns: c.last.load(Relaxed),
            reaction_max_ns: c.max.load(Relaxed),
            reaction_total_ns: c.total.load(Relaxed),
            purging_events: c.purging.load(Relaxed),
        };
    }
    s
}
