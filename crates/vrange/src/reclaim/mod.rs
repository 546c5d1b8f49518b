//! The reclaimer: one thread per process, started by the first managed or hybrid region and
//! stopped by [`stop`]. It waits on every pressure source the kernel and privileges offer (PSI
//! triggers, cgroup v1 vmpressure events, a wake-up eventfd) with a timeout, and on each wake-up
//! or tick purges whole volatile ranges, lowest class and least recently used first:
//!
//! | source | how it is noticed | bytes purged |
//! |---|---|---|
//! | PSI (system, cgroup v2) | POLLPRI on a trigger (the system's only while MemAvailable < MemTotal / 10) | `VRANGE_PRESSURE_SHARE`% of volatile bytes (at least 2 MiB) |
//! | vmpressure medium / critical (cgroup v1) | eventfd | the same / everything |
//! | headroom | limit − usage polled every `VRANGE_POLL_MS` | enough to restore twice the threshold |
//! | budget | the mark that crosses it wakes the thread; one that finds it a budget behind purges itself ([`catch_up`]) | the excess |
//! | explicit | [`purge`] in the caller's thread | what was asked |
//!
//! Each tick also arms hybrid ranges volatile for longer than the arm delay, and every hybrid
//! range while memory is tight (`crate::approach`: headroom under what a neighbour can fault in
//! within a tick, or a pressure event); then ticks come at least every 10 ms, and marks arm
//! their ranges themselves.
//!
//! # Descriptors
//! The thread works in an empty descriptor table of its own (see `waker`): the program's
//! table never holds a descriptor of the reclaimer's, so nothing the program closes, restores
//! or reuses can meet one. It opens its sources (and the eventfd its bell rings) only once the
//! process has had volatile memory to purge for a whole tick; until then it sleeps on a futex
//! (a short-lived process, or one that frees memory only briefly, never has the thread open a
//! source). Where an own table is refused, every source is a `sys::fd::GuestFd` in the
//! program's table: above the descriptor floor, close-on-exec, verified before each use; a
//! program that closes them (`closefrom`, `close_range`) is noticed at the next wake-up or
//! within a second, the sources are reopened and the loss is counted in `sys::fd::counts`.
//!
//! # Fork
//! A fork child has no reclaimer (threads do not survive fork). It starts its own on its next
//! mark of a managed range, new region or [`purge`]. `pthread_atfork` handlers hold the
//! registry's locks across the fork, so the child never inherits one locked, and (where the
//! sources are in the program's table) close the child's copies of them (verified first),
//! which would otherwise keep the parent's triggers alive and wake the parent's thread. The
//! child's inherited mappings of shared regions hold no pin (the pins were the parent's): it
//! unmarks them before use, like a fresh mapping.

pub(crate) mod config;
mod flush;
mod participant;
mod victims;
mod waker;

use waker::wake;

pub use flush::{on_flush, FlushHook};

pub use config::{set_option, Config, Headroom, Psi, OPTIONS};

use crate::approach;
use crate::managed::{pause, PURGES};
use crate::stats::{self, Source};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::Mutex;
use std::time::Duration;
use vrange_sys::cgroup;
use vrange_sys::cgroup::MemCgroup;
use vrange_sys::clock::now_ns;
use vrange_sys::fd::{self, Ident};
use vrange_sys::futex;
use vrange_sys::pressure::{
    Headroom as HeadroomFile, Level, Poller, PsiTrigger, Ready, Signal, VmPressure,
};
use vrange_sys::sync::SpinLock;

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const STOPPING: u8 = 2;
const DISABLED: u8 = 3;

/// Why the thread was woken (bits).
const WAKE_BUDGET: u8 = 1;
const WAKE_CONFIG: u8 = 2;

/// The reclaimer thread's name.
const THREAD_NAME: &str = "vrange-reclaim";

static STATE: AtomicU8 = AtomicU8::new(IDLE);
static WAKE_REASONS: AtomicU8 = AtomicU8::new(0);
static BUDGET_SINCE: AtomicU64 = AtomicU64::new(0);
/// Serialises start and stop; held across fork.
static START: SpinLock = SpinLock::new();
static THREAD: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);
/// Which sources the running thread listens to (bits by `Source`).
static ACTIVE: AtomicU8 = AtomicU8::new(0);

/// Whether the reclaimer thread is running.
pub fn is_running() -> bool {
    STATE.load(Relaxed) == RUNNING
}

/// Records the state for `stats()`, which must not depend on this module.
fn set_state(state: u8) {
    STATE.store(state, Release);
    stats::set_reclaimer_running(state == RUNNING);
}

/// The pressure sources the running reclaimer listens to or polls (empty when not running).
pub fn active_sources() -> Vec<Source> {
    let bits = ACTIVE.load(Relaxed);
    Source::ALL
        .into_iter()
        .filter(|s| bits & (1 << *s as u8) != 0)
        .collect()
}

/// Starts the reclaimer if it is not running (and not disabled by `VRANGE_RECLAIMER=off`).
pub(crate) fn ensure_running() {
    register_atfork();
    if STATE.load(Relaxed) == IDLE {
        start();
    }
}

fn start() {
    let cfg = config::get();
    let _starting = START.lock();
    if STATE.load(Acquire) == IDLE {
        if !cfg.enabled.load(Relaxed) {
            set_state(DISABLED);
        } else {
            set_state(RUNNING);
            let spawned = vrange_sys::process::spawn_without_signals(THREAD_NAME, run);
            match spawned {
                Ok(handle) => {
                    *THREAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
                    crate::publish::started();
                }
                Err(_) => set_state(IDLE),
            }
        }
    }
}

/// Stops the reclaimer thread and waits for it. Volatile ranges stay volatile; the next managed
/// mark, region or [`purge`] starts it again.
pub fn stop() {
    let _stopping = START.lock();
    let handle = if STATE.load(Acquire) == RUNNING {
        set_state(STOPPING);
        wake();
        THREAD.lock().unwrap_or_else(|e| e.into_inner()).take()
    } else {
        None
    };
    if let Some(h) = handle {
        let _ = h.join();
    }
    if STATE.load(Acquire) != DISABLED {
        set_state(IDLE);
    }
    waker::drop_waker();
}

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
    let (ranges, freed) = victims::purge_oldest(&victims, excess);
    drop(p);
    let stuck = stats::volatile_resident() > budget_ceiling(budget);
    STUCK_AT.store(if stuck { t0 } else { 0 }, Relaxed);
    BUSY.store(0, Release);
    stats::record(Source::Budget, ranges, freed, now_ns() - t0);
    freed as usize
}

/// The headroom file of [`make_room`]'s callers (the thread keeps its own), and when to try
/// opening it again if this process's cgroup has none.
struct Room {
    file: Option<HeadroomFile>,
    retry_at: u64,
}

static ROOM: Mutex<Room> = Mutex::new(Room {
    file: None,
    retry_at: 0,
});

/// Makes room, in the caller's thread, before it allocates `bytes` more: if its memory
/// cgroup's headroom (limit minus usage) less `bytes` is under the `VRANGE_HEADROOM` threshold,
/// volatile memory is purged until twice the threshold is free again, as the thread would do
/// at its next tick. Returns the bytes this process purged on its own (counted under
/// [`Source::Headroom`]).
///
/// For clients that fill volatile memory faster than the thread's tick (a cache filling at
/// memory speed can pass a container's limit between two ticks, and volatile memory that is
/// not yet armed is memory the kernel cannot reclaim without swap). Runs the flush hooks
/// ([`on_flush`]) first, then costs one `pread` of the cgroup's usage on a verified
/// descriptor; one caller at a time (others return 0 at once, or, coordinated, wait for the
/// answer the first is waiting for).
///
/// While a coordinator (`vrange daemon`) is live, the purge follows its global order instead
/// of this process's own: the caller asks the coordinator for the room and waits for the
/// round it runs (the oldest volatile data of any process in the container goes first, this
/// process's own only in its turn, by the coordinator's request), at most three ping
/// intervals. It purges on its own only for what the coordinator could not free (it saw
/// nothing volatile, or this process's cgroup is short where others' purges do not help) and
/// when the coordinator does not answer or is gone, as without one.
/// Nothing is purged without a cgroup limit, with `VRANGE_HEADROOM=off`, or while the
/// reclaimer is disabled.
pub fn make_room(bytes: usize) -> usize {
    /// Rounds asked of a coordinator for one call before the rest is purged here.
    const ASKS: usize = 3;
    let setting = config::get().headroom.load(Relaxed);
    if setting == 0 || STATE.load(Relaxed) == DISABLED {
        return 0;
    }
    flush::run();
    // Coordinated, the room may come from other processes' data.
    let coordinated = participant::live();
    if stats::volatile_resident() == 0 && !coordinated {
        return 0;
    }
    let t0 = now_ns();
    // The headroom file is read by one caller at a time. Uncoordinated, the others return at
    // once (a purge takes microseconds); coordinated, they wait for the read and then for the
    // coordinator's answer with the first (one request at a time), rather than map past the
    // limit meanwhile. The lock is never held while waiting for the coordinator, so that a
    // fork cannot leave it held for long.
    let deficit_now = || {
        let room = if coordinated {
            Ok(ROOM.lock().unwrap_or_else(|e| e.into_inner()))
        } else {
            ROOM.try_lock()
        };
        let mut room = room.ok()?;
        room_deficit(&mut room, bytes as u64, setting, t0)
    };
    let Some(mut deficit) = deficit_now() else {
        return 0;
    };
    for _ in 0..ASKS {
        if deficit == 0 {
            return 0;
        }
        match participant::ask_room(deficit, wake) {
            participant::Room::Answered(Some(_)) | participant::Room::Waited => {}
            // Nothing volatile in the coordinator's eyes, or no answer: on our own.
            participant::Room::Answered(None) | participant::Room::NoAnswer => break,
        }
        let Some(left) = deficit_now() else {
            return 0;
        };
        deficit = left;
    }
    if deficit == 0 {
        return 0;
    }
    let victims = candidates(deficit);
    let p = pause();
    let (ranges, freed) = victims::purge_oldest(&victims, deficit);
    drop(p);
    stats::record(Source::Headroom, ranges, freed, now_ns() - t0);
    freed as usize
}

/// Bytes [`make_room`] must free before `bytes` more are allocated: twice the threshold less
/// the headroom that would be left. `None` where there is no limit to keep under (or its file
/// cannot be read).
fn room_deficit(room: &mut Room, bytes: u64, setting: u64, now: u64) -> Option<u64> {
    if room.file.as_ref().is_some_and(|h| !h.is_intact()) {
        room.file = None;
    }
    if room.file.is_none() {
        if now < room.retry_at {
            return None;
        }
        room.file = MemCgroup::current().and_then(|cg| HeadroomFile::new(&cg).ok().flatten());
        room.retry_at = now + 1_000_000_000;
    }
    let h = room.file.as_ref()?;
    let headroom = h.bytes().ok()?;
    let threshold = if setting == config::HEADROOM_AUTO {
        victims::auto_headroom(h.ceiling())
    } else {
        setting
    };
    Some(victims::headroom_deficit(
        headroom.saturating_sub(bytes),
        threshold,
    ))
}

/// A setting changed: the thread re-reads them (and a disabled reclaimer may start).
pub(crate) fn config_changed() {
    if config::get().enabled.load(Relaxed) {
        let _ = STATE.compare_exchange(DISABLED, IDLE, AcqRel, Relaxed);
    }
    WAKE_REASONS.fetch_or(WAKE_CONFIG, AcqRel);
    wake();
}

/// Purges up to `bytes` bytes of volatile managed ranges now, lowest class and least recently
/// used first, whole ranges at a time (so it may free more than asked). Returns the bytes
/// freed: the lengths of the ranges purged. Runs in the caller's thread.
pub fn purge(bytes: usize) -> usize {
    /// Passes over fresh candidates at most (see below).
    const PASSES: usize = 3;
    let t0 = now_ns();
    let target = bytes as u64;
    let (mut ranges, mut freed) = (0, 0);
    // The reclaimer arms hybrid ranges under the purge lock, so between this thread's
    // snapshot of the candidates and its taking that lock a range may be mid-arming (no
    // candidate) or armed since (its snapshot word stale): a pass skips either. An explicit
    // purge does not leave them behind: once it has held the lock, the arming it raced is
    // over, and a fresh snapshot has them.
    for _ in 0..PASSES {
        let victims = candidates(target - freed);
        // Read before the lock: a range mid-arming now is no candidate, and is armed by the
        // time the lock is held.
        let raced = victims::arming_now();
        let p = pause();
        let (r, f) = victims::purge_oldest(&victims, target - freed);
        drop(p);
        ranges += r;
        freed += f;
        // Short of the target, every candidate was tried: some that were not purged changed
        // under the snapshot.
        let missed = victims.len() as u64 > r;
        if freed >= target || !(missed || raced) {
            break;
        }
    }
    stats::record(Source::Explicit, ranges, freed, now_ns() - t0);
    ensure_running();
    freed as usize
}

/// Purges the volatile ranges of one region now (`VolatileRegion::purge`), counted as an
/// explicit purge. Returns the bytes freed.
pub(crate) fn purge_region(span: crate::span::Span) -> Result<usize, crate::Error> {
    let t0 = now_ns();
    let p = pause();
    let done = crate::managed::purge_span(span);
    drop(p);
    let (ranges, freed) = done?;
    stats::record(Source::Explicit, ranges, freed, now_ns() - t0);
    Ok(freed as usize)
}

/// The purge candidates for a target (none for a zero target), collected before the purge lock
/// is taken: see [`victims::candidates`].
fn candidates(target: u64) -> Vec<victims::Candidate> {
    if target == 0 {
        Vec::new()
    } else {
        flush::run();
        victims::candidates()
    }
}

fn respond(source: Source, since: u64, target: u64) {
    let victims = candidates(target);
    let p = pause();
    let (ranges, bytes) = victims::purge_oldest(&victims, target);
    drop(p);
    stats::record(source, ranges, bytes, now_ns().saturating_sub(since));
}

/// The sources the thread listens to for one cgroup and one configuration.
struct Watch {
    poller: Poller,
    cgroup: Option<MemCgroup>,
    headroom: Option<HeadroomFile>,
    _psi: Vec<PsiTrigger>,
    _vmpressure: Vec<VmPressure>,
    version: u64,
}

impl Watch {
    fn open(waker: Option<Ident>) -> Watch {
        let cfg = config::get();
        let version = cfg.version.load(Acquire);
        let mut poller = Poller::new();
        let mut active = sources_without_descriptors();
        if let Some(w) = waker {
            let _ = poller.add(w, Signal::Wake);
        }
        let cgroup = MemCgroup::current();
        let mut psi = Vec::new();
        let kind = cfg.psi_kind.load(Relaxed);
        if kind != 0 {
            let (stall, window) = (
                cfg.psi_stall_us.load(Relaxed),
                vrange_sys::pressure::psi_window_us(cfg.psi_window_us.load(Relaxed)),
            );
            if let Ok(t) = PsiTrigger::system(stall, window, kind == 2) {
                if poller.add(t.ident(), Signal::PsiSystem).is_ok() {
                    active |= 1 << Source::Psi as u8;
                    psi.push(t);
                }
            }
            // The v2 directory's memory.pressure works even where memory is on v1.
            if let Some(Ok(t)) = cgroup::v2_pressure_file()
                .map(|file| PsiTrigger::file(&file, stall, window, kind == 2))
            {
                if poller.add(t.ident(), Signal::PsiCgroup).is_ok() {
                    active |= 1 << Source::PsiCgroup as u8;
                    psi.push(t);
                }
            }
        }
        let mut vmpressure = Vec::new();
        if cfg.vmpressure.load(Relaxed) {
            for (level, source) in [
                (Level::Medium, Source::VmpressureMedium),
                (Level::Critical, Source::VmpressureCritical),
            ] {
                if let Some(Ok(v)) = cgroup
                    .as_ref()
                    .map(|cg| VmPressure::register_own(cg, level))
                {
                    if poller.add(v.ident(), v.signal()).is_ok() {
                        active |= 1 << source as u8;
                        vmpressure.push(v);
                    }
                }
            }
        }
        let headroom = match (&cgroup, cfg.headroom.load(Relaxed)) {
            (Some(cg), setting) if setting != 0 => HeadroomFile::new(cg).ok().flatten(),
            _ => None,
        };
        if headroom.is_some() {
            active |= 1 << Source::Headroom as u8;
        }
        ACTIVE.store(active, Relaxed);
        Watch {
            poller,
            cgroup,
            headroom,
            _psi: psi,
            _vmpressure: vmpressure,
            version,
        }
    }

    /// Follows a changed limit (or a limit set on a cgroup that had none).
    fn refresh_limits(&mut self) {
        match (&mut self.headroom, &self.cgroup) {
            (Some(h), _) => {
                let _ = h.refresh_ceiling();
            }
            (None, Some(cg)) if config::get().headroom.load(Relaxed) != 0 => {
                self.headroom = HeadroomFile::new(cg).ok().flatten();
                if self.headroom.is_some() {
                    ACTIVE.fetch_or(1 << Source::Headroom as u8, Relaxed);
                }
            }
            _ => {}
        }
    }

    /// Whether the process moved to another cgroup, the settings changed, or the program
    /// closed or replaced one of the descriptors (then the sources are reopened).
    fn stale(&mut self) -> bool {
        let moved = MemCgroup::current().map(|c| c.path().to_path_buf())
            != self.cgroup.as_ref().map(|c| c.path().to_path_buf());
        let lost = !self.poller.check().is_empty()
            || self.headroom.as_ref().is_some_and(|h| !h.is_intact())
            || self._vmpressure.iter().any(|v| !v.is_intact());
        moved || lost || self.version != config::get().version.load(Acquire)
    }
}

/// Whether the thread needs its sources now: the process has had volatile memory (or a shared
/// region, volatile in other processes' eyes too) for a whole tick. `since` is when the thread first saw it (reset when it goes). A process that lives
/// less than a tick, or frees memory only briefly, never holds a descriptor of vrange's; the
/// budget and explicit purges need none.
fn needs_sources(since: &mut Option<u64>, now: u64, tick: Duration) -> bool {
    if stats::volatile_resident() == 0 && !crate::managed::maps_shared() {
        *since = None;
        return false;
    }
    let first = *since.get_or_insert(now);
    now.saturating_sub(first) >= tick.as_nanos() as u64
}

/// The sources that work before (and without) any descriptor: explicit purges, and the budget
/// when one is set.
fn sources_without_descriptors() -> u8 {
    let budget = config::get().budget.load(Relaxed) != 0;
    (1 << Source::Explicit as u8) | (u8::from(budget) << Source::Budget as u8)
}

/// Waits one tick: in poll(2) on the sources, or on the futex before there are any.
fn wait(
    watch: &mut Option<Watch>,
    bell: &mut Option<waker::Bell>,
    since: &mut Option<u64>,
    poll: Duration,
) -> Ready {
    let seq = waker::WAKE_SEQ.load(Acquire);
    if watch.is_none() && needs_sources(since, now_ns(), poll) && waker::files_ok() {
        *watch = Some(Watch::open(waker::poll_ident(bell)));
    }
    match watch {
        Some(w) => w.poller.wait(Some(poll)).unwrap_or_default(),
        None => {
            if STATE.load(Acquire) == RUNNING && WAKE_REASONS.load(Acquire) == 0 {
                futex::wait(&waker::WAKE_SEQ, seq, poll);
            }
            Ready::default()
        }
    }
}

fn run() {
    let cfg = config::get();
    waker::enter_table();
    let mut watch: Option<Watch> = None;
    let mut bell = None;
    let mut volatile_since = None;
    ACTIVE.store(sources_without_descriptors(), Relaxed);
    let mut last_check = now_ns();
    // Under thrashing vmpressure fires hundreds of times a second: answer each source at most
    // once per poll interval.
    let mut answered = [0u64; 4];
    let mut coordinator = participant::Participant::default();
    // Before the first tick: a process that starts close to its limit arms at once.
    let mut measured = now_ns();
    approach_check(
        None,
        measured,
        Duration::from_millis(cfg.poll_ms.load(Relaxed)),
        true,
    );
    while STATE.load(Acquire) == RUNNING {
        let configured = Duration::from_millis(cfg.poll_ms.load(Relaxed));
        let poll = if approach::is_tight() {
            configured.min(approach::TIGHT_POLL)
        } else {
            configured
        };
        let ready = wait(&mut watch, &mut bell, &mut volatile_since, poll);
        let t = now_ns();
        if STATE.load(Acquire) != RUNNING {
            break;
        }
        flush::run();
        if ready.broken().contains(Signal::Coordinator) {
            coordinator.disconnect();
        }
        coordinator.serve(t);
        // While a live coordinator orders purges across processes, pressure is its to answer.
        let coordinated = coordinator.coordinated(t);
        let reasons = WAKE_REASONS.swap(0, AcqRel);
        if reasons & WAKE_CONFIG != 0 && watch.is_none() {
            ACTIVE.store(sources_without_descriptors(), Relaxed);
        }
        let volatile = stats::volatile_resident();
        let share = cfg.pressure_share.load(Relaxed);
        let gap = cfg.poll_ms.load(Relaxed).saturating_mul(1_000_000);
        for (i, (signal, source)) in [
            (Signal::VmpressureCritical, Source::VmpressureCritical),
            (Signal::VmpressureMedium, Source::VmpressureMedium),
            (Signal::PsiCgroup, Source::PsiCgroup),
            (Signal::PsiSystem, Source::Psi),
        ]
        .into_iter()
        .enumerate()
        {
            if ready.contains(signal) && t.saturating_sub(answered[i]) >= gap {
                answered[i] = t;
                let short = source != Source::Psi || machine_short();
                if short {
                    // Arming is this process's own safety: even while a coordinator orders
                    // the purges.
                    approach::pressure_event(t);
                }
                if !short {
                    // Some cgroup stalled at its own limit, not the machine: counted, no purge.
                    stats::record(source, 0, 0, 0);
                } else if coordinated {
                    stats::count_deferred();
                } else {
                    respond(source, t, victims::amount(source, volatile, share));
                }
            }
        }
        // Opening files (sources, /proc, the statistics file) waits for the thread's own table
        // (see `waker`).
        let files_ok = waker::files_ok();
        if let Some(w) = watch.as_mut().filter(|_| files_ok) {
            let mut reopen = ready.broken().iter().any(|s| s != Signal::Coordinator)
                || reasons & WAKE_CONFIG != 0;
            if !reopen && t.saturating_sub(last_check) >= 1_000_000_000 {
                last_check = t;
                reopen = w.stale();
                if !reopen {
                    w.refresh_limits();
                }
            }
            if reopen {
                // Close the old sources before opening new ones.
                drop(watch.take());
                let mut fresh = Watch::open(waker::poll_ident(&mut bell));
                if let Some(id) = coordinator.ident() {
                    let _ = fresh.poller.add(id, Signal::Coordinator);
                }
                watch = Some(fresh);
            }
            if let Some(w) = watch.as_mut() {
                if coordinator.connect(t) {
                    match coordinator.ident() {
                        Some(id) if w.poller.add(id, Signal::Coordinator).is_ok() => {}
                        _ => coordinator.disconnect(),
                    }
                }
            }
        }
        if let Some(w) = &watch {
            check_headroom(w, t, coordinated);
        }
        check_budget(reasons & WAKE_BUDGET != 0, t);
        // Headroom from the open source each tick; by short-lived reads once a second, or each
        // tick while tight (no limit: the machine's MemAvailable).
        let open = watch.as_ref().and_then(|w| w.headroom.as_ref());
        if open.is_some() || approach::is_tight() || t.saturating_sub(measured) >= 1_000_000_000 {
            measured = t;
            approach_check(watch.as_ref(), t, configured, false);
        }
        let delay_ns = if approach::is_tight() {
            0
        } else {
            cfg.arm_delay_ms.load(Relaxed).saturating_mul(1_000_000)
        };
        let p = pause();
        stats::count_armed(victims::arm_due(now_ns(), delay_ns) as usize);
        drop(p);
        if files_ok {
            crate::publish::tick(now_ns());
        }
    }
    coordinator.disconnect();
    drop(watch);
    drop(bell);
    ACTIVE.store(0, Relaxed);
    approach::reset();
    waker::thread_ended();
}

/// Whether a stall on the system's PSI file comes with the machine short of memory (see
/// [`victims::system_short`]). Reads /proc/meminfo only where the thread may open files
/// (`waker::files_ok`); otherwise it cannot tell, and takes the stall at its word.
fn machine_short() -> bool {
    let meminfo = if waker::files_ok() {
        vrange_sys::procfs::mem_available_kb().ok().flatten()
    } else {
        None
    };
    victims::system_short(meminfo)
}

/// Measures headroom (the watch's open source; else short-lived reads of the cgroup's files,
/// or of MemAvailable without a limit) and updates the approach state; while the process has
/// volatile memory (or `first`: the reclaimer just started, its process about to have some)
/// and the thread may open files (`waker::files_ok`); otherwise the state stays as it is.
fn approach_check(watch: Option<&Watch>, t: u64, poll: Duration, first: bool) {
    if (!first && stats::volatile_resident() == 0) || !waker::files_ok() {
        return;
    }
    let headroom = match watch {
        Some(Watch {
            headroom: Some(h), ..
        }) => h.bytes().ok(),
        Some(Watch { cgroup, .. }) => cgroup.as_ref().and_then(MemCgroup::headroom),
        None => MemCgroup::current().and_then(|cg| cg.headroom()),
    }
    .or_else(approach::machine_headroom);
    if approach::update(headroom, poll, t) {
        let p = pause();
        stats::count_armed(victims::arm_due(now_ns(), 0) as usize);
        drop(p);
    }
}

fn check_headroom(watch: &Watch, t: u64, coordinated: bool) {
    let setting = config::get().headroom.load(Relaxed);
    let Some(h) = watch.headroom.as_ref() else {
        return;
    };
    if setting == 0 || stats::volatile_resident() == 0 {
        return;
    }
    // One pread of the usage file on an open descriptor: cheap enough for every tick.
    let Ok(headroom) = h.bytes() else {
        return;
    };
    let threshold = if setting == config::HEADROOM_AUTO {
        victims::auto_headroom(h.ceiling())
    } else {
        setting
    };
    let deficit = victims::headroom_deficit(headroom, threshold);
    if deficit > 0 && coordinated {
        stats::count_deferred();
    } else if deficit > 0 {
        respond(Source::Headroom, t, deficit);
    }
}

fn check_budget(woken: bool, t: u64) {
    let budget = config::get().budget.load(Relaxed);
    let volatile = stats::volatile_resident();
    if budget == 0 || volatile <= budget {
        return;
    }
    let since = if woken { BUDGET_SINCE.load(Relaxed) } else { t };
    respond(Source::Budget, since, volatile - budget);
}

/// Installs the fork handlers once per process (by the first region, even with the reclaimer
/// off: the registry's lock and shared pins need them).
///
/// A client that calls into vrange while holding locks of its own (an allocator's arena locks)
/// calls this first and then registers its own handlers: `fork` runs prepare handlers in
/// reverse order of registration, so the client's locks are taken before vrange's, the same
/// order as on its call paths.
pub fn register_fork_handlers() {
    register_atfork();
}

fn register_atfork() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let _ = vrange_sys::process::at_fork(before_fork, after_fork_parent, after_fork_child);
    });
}

extern "C" fn before_fork() {
    // First the refill table (held while a fill function runs, which may take any lock), then
    // the userfaultfds (opening one may take the registry's lock after it).
    crate::refill::TABLE.lock.lock_for_fork();
    crate::sigbus::UFFD.open.lock_for_fork();
    crate::refill::UFFD.open.lock_for_fork();
    START.lock_for_fork();
    PURGES.lock_for_fork();
    crate::registry::LOCK.lock_for_fork();
}

extern "C" fn after_fork_parent() {
    // SAFETY: all three were taken by before_fork, and no guard of them is live in this thread
    // (fork is not called with vrange's locks held).
    unsafe {
        crate::registry::LOCK.force_unlock();
        PURGES.force_unlock();
        START.force_unlock();
        crate::sigbus::UFFD.open.force_unlock();
        crate::refill::UFFD.open.force_unlock();
        crate::refill::TABLE.lock.force_unlock();
    }
}

extern "C" fn after_fork_child() {
    // SAFETY: as in after_fork_parent; START is released at the end.
    unsafe {
        crate::registry::LOCK.force_unlock();
        PURGES.force_unlock();
    }
    // The thread did not survive the fork. Its handle, waker and sources belong to the parent's
    // thread: forget them without running their destructors (no allocator calls here), closing
    // only the child's copies of the descriptors, each verified first.
    if let Ok(mut t) = THREAD.try_lock() {
        std::mem::forget(t.take());
    }
    waker::after_fork_child();
    fd::close_private_after_fork();
    crate::sigbus::UFFD.after_fork_child();
    crate::refill::after_fork_child();
    // The parent's pins on shared regions are the parent's: the child's inherited mappings
    // hold none, like fresh mappings, until the child unmarks them.
    crate::registry::for_each_live(|_, slot| {
        if slot.header().is_some() {
            slot.holding.store(false, Relaxed);
        }
    });
    WAKE_REASONS.store(0, Relaxed);
    ACTIVE.store(0, Relaxed);
    approach::reset();
    // The parent's link to a coordinator is not the child's (its copy is closed above).
    stats::set_coordinated(false);
    if STATE.load(Relaxed) != DISABLED {
        set_state(IDLE);
    }
    // SAFETY: taken by before_fork, no live guard.
    unsafe { START.force_unlock() };
}
