//! The reclaimer thread's loop: wait for a source or the tick, answer what fired, keep the
//! headroom and the budget, arm hybrid ranges, read the headroom for refill fills that cannot,
//! publish statistics.

use super::budget::check_budget;
use super::config;
use super::flush;
use super::participant;
use super::purge::respond;
use super::sources::needs_sources;
use super::sources::sources_without_descriptors;
use super::sources::Watch;
use super::victims;
use super::waker;
use super::ACTIVE;
use super::RUNNING;
use super::STATE;
use super::WAKE_BUDGET;
use super::WAKE_CONFIG;
use super::WAKE_REASONS;
use crate::approach;
use crate::registry::pause;
use crate::short;
use crate::stats;
use crate::stats::Source;
use std::sync::atomic::Ordering::AcqRel;
use std::sync::atomic::Ordering::Acquire;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use vrange_sys::cgroup::MemCgroup;
use vrange_sys::clock::now_ns;
use vrange_sys::futex;
use vrange_sys::pressure::OwnHeadroom;
use vrange_sys::pressure::Ready;
use vrange_sys::pressure::Signal;

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

pub(super) fn run() {
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
    // The headroom read for refill regions filled on the faulting thread (in this thread's own
    // descriptor table, never in the program's).
    let mut refill_room = OwnHeadroom::new();
    // The armed reserve's candidates, kept from tick to tick (no allocation once grown).
    let mut reserve = victims::Scratch::default();
    // When dead holders of shared regions were last looked for (ns).
    let mut reaped_at = 0;
    // Before the first tick: a process that starts close to its limit arms at once.
    let mut measured = now_ns();
    let mut pace = Pace::default();
    let first_poll = Duration::from_millis(cfg.poll_ms.load(Relaxed));
    if let Some(headroom) = approach_check(None, measured, first_poll, true, &mut pace) {
        if approach::is_tight() {
            let delay_ns = cfg.arm_delay_ms.load(Relaxed).saturating_mul(1_000_000);
            // Tight: its ticks come every TIGHT_POLL from now on.
            let ticks = (approach::TIGHT_POLL, Duration::ZERO);
            arm(headroom, &mut pace, ticks, delay_ns, &mut reserve);
        }
    }
    while STATE.load(Acquire) == RUNNING {
        let configured = Duration::from_millis(cfg.poll_ms.load(Relaxed));
        let poll = if approach::is_tight() {
            configured.min(approach::TIGHT_POLL)
        } else {
            configured
        };
        let ready = wait(&mut watch, &mut bell, &mut volatile_since, poll);
        let t = now_ns();
        pace.ticked(t, poll);
        // The last tick's work: part of the reclaimer's reaction to what a tick finds.
        let reaction = Duration::from_nanos(pace.worked);
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
        // A pressure share of everything this process could purge, shared regions included.
        let volatile = || stats::volatile_resident() + crate::managed::shared_volatile_bytes();
        let share = cfg.pressure_share.load(Relaxed);
        let gap = cfg.poll_ms.load(Relaxed).saturating_mul(1_000_000);
        // Whether memory is short for a vmpressure event, read at the tick's first one.
        let mut vm_short = None;
        for (i, (signal, source)) in [
            (Signal::VmpressureCritical, Source::VmpressureCritical),
            (Signal::VmpressureMedium, Source::VmpressureMedium),
            (Signal::PsiCgroup, Source::PsiCgroup),
            (Signal::PsiSystem, Source::Psi),
        ]
        .into_iter()
        .enumerate()
        {
            // A source switched off since its descriptor was opened (the settings changed
            // while this thread could not run): its event is stale, not pressure to answer.
            let enabled = match source {
                Source::VmpressureCritical | Source::VmpressureMedium => {
                    cfg.vmpressure.load(Relaxed)
                }
                _ => cfg.psi_kind.load(Relaxed) != 0,
            };
            if enabled && ready.contains(signal) && t.saturating_sub(answered[i]) >= gap {
                answered[i] = t;
                let short = source != Source::Psi || machine_short();
                if short {
                    // Arming is this process's own safety: even while a coordinator orders
                    // the purges.
                    approach::pressure_event(t);
                }
                let vmpressure = matches!(
                    source,
                    Source::VmpressureCritical | Source::VmpressureMedium
                );
                let short = short
                    && (!vmpressure
                        || *vm_short.get_or_insert_with(|| vmpressure_short(watch.as_ref())));
                if !short {
                    // Some cgroup stalled at its own limit, not the machine, or this one
                    // reclaims page cache it can drop: counted, no purge.
                    stats::record(source, 0, 0, 0);
                } else if coordinated {
                    stats::count_deferred();
                } else {
                    respond(source, t, victims::amount(source, volatile(), share));
                }
            }
        }
        // Opening files (sources, /proc, the statistics file) waits for the thread's own table
        // (see `waker`).
        let files_ok = waker::files_ok();
        // Shared regions' holders whose process died: their pins released once per configured
        // tick (not at every tight tick: each look reads /proc for every other holder), so
        // that what only they pinned is purgeable from then on, by this process or another.
        if files_ok && t.saturating_sub(reaped_at) >= gap {
            reaped_at = t;
            crate::managed::reap_dead();
        }
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
        // Fills in a SIGBUS handler cannot read the headroom: they use this tick's reading
        // (`room::recent`).
        if crate::refill_here::live() {
            if files_ok {
                let _ = super::room::measure(&mut refill_room);
            }
            // Their blocks made since the last tick, lazily freed (a fault leaves a run).
            crate::refill_here::flush_lazy();
        }
        // Headroom from the open source each tick; by short-lived reads once a second, or each
        // tick while tight (no limit: the machine's MemAvailable).
        let open = watch.as_ref().and_then(|w| w.headroom.as_ref());
        let mut headroom = None;
        if open.is_some() || approach::is_tight() || t.saturating_sub(measured) >= 1_000_000_000 {
            measured = t;
            headroom = approach_check(watch.as_ref(), t, configured, false, &mut pace);
        }
        let delay_ns = cfg.arm_delay_ms.load(Relaxed).saturating_mul(1_000_000);
        match headroom {
            Some(h) if approach::is_tight() => {
                let ticks = (pace.look(poll), reaction);
                arm(h, &mut pace, ticks, delay_ns, &mut reserve)
            }
            // Tight, and nothing measured this tick (no volatile memory, or no file could be
            // read): the reserve and its deficit stay as the last measure left them.
            _ if approach::is_tight() => {}
            _ => {
                approach::set_reserve(0, 0);
                let p = pause();
                stats::count_armed(victims::arm_due(now_ns(), delay_ns) as usize);
                drop(p);
            }
        }
        if files_ok {
            crate::publish::tick(now_ns());
        }
        pace.worked = now_ns().saturating_sub(t);
    }
    coordinator.disconnect();
    drop(watch);
    drop(bell);
    ACTIVE.store(0, Relaxed);
    approach::reset();
    waker::thread_ended();
}

/// Whether a stall on the system's PSI file comes with the machine short of memory (see
/// `crate::short::machine_short`). Reads /proc/meminfo only where the thread may open files
/// (`waker::files_ok`); otherwise it cannot tell, and takes the stall at its word.
/// Whether a vmpressure event asks for a purge (`short::vmpressure_purges`): the headroom
/// read from the watch's open source.
fn vmpressure_short(watch: Option<&Watch>) -> bool {
    let Some(h) = watch.and_then(|w| w.headroom.as_ref()) else {
        return true;
    };
    let threshold = short::event_threshold(config::get().headroom.load(Relaxed), h.ceiling());
    short::vmpressure_purges(h.read().ok().map(|r| r.headroom), threshold)
}

fn machine_short() -> bool {
    let meminfo = if waker::files_ok() {
        vrange_sys::procfs::mem_available_kb().ok().flatten()
    } else {
        None
    };
    short::machine_short(meminfo)
}

/// A recent peak: the largest value seen, halved for every `HALF_MS` milliseconds since it was
/// seen.
#[derive(Debug, Default, Clone, Copy)]
struct Peak<const HALF_MS: u64> {
    value: u64,
    at: u64,
}

impl<const HALF_MS: u64> Peak<HALF_MS> {
    /// The peak at `now` (ns).
    fn at(&self, now: u64) -> u64 {
        let halvings = (now.saturating_sub(self.at) / (HALF_MS * 1_000_000)).min(63) as u32;
        self.value >> halvings
    }

    /// `sample` seen at `now`.
    fn saw(&mut self, sample: u64, now: u64) {
        if sample >= self.at(now) {
            *self = Peak {
                value: sample,
                at: now,
            };
        }
    }
}

/// The charge rate the reclaimer measures from one headroom reading to the next, the time
/// between its ticks, and how long its last tick's work took.
#[derive(Debug, Default)]
struct Pace {
    /// The last reading: (ns, headroom).
    last: Option<(u64, u64)>,
    /// Bytes per second: how fast the headroom fell from one reading to the next.
    rate: Peak<500>,
    /// When the last tick began (ns).
    tick_at: u64,
    /// ns by which a tick came later than its poll asked. On a busy machine the thread runs
    /// later than that (ticks of 10 ms came hundreds of ms apart under a load of 11 on two
    /// cores), and the reserve must cover the time until it really looks. Remembered for
    /// seconds (halved every 5 s), not for a moment as the charge rate is: CPU contention lasts
    /// as long as what causes it (a build, a batch job), and a thread starved once is starved
    /// again; a neighbour's kill came from a reserve sized on the last half second's ticks
    /// after a stretch of starved ones (BENCHMARKS.md, stress, 2026-11-28).
    late: Peak<5000>,
    /// ns of the last tick's work.
    worked: u64,
    /// The machine's count of lazily freed pages the kernel discarded (`pglazyfreed`), at the
    /// last look.
    lazyfreed: Option<u64>,
}

impl Pace {
    /// Whether the kernel has discarded lazily freed pages on the machine since the last look
    /// (or it cannot be told): then the armed ranges are counted again page by page
    /// (`victims::keep_reserve`). One read of /proc/vmstat, where the thread may open files.
    fn discarded(&mut self) -> bool {
        let now = if waker::files_ok() {
            vrange_sys::procfs::vmstat("pglazyfreed").ok().flatten()
        } else {
            None
        };
        let before = std::mem::replace(&mut self.lazyfreed, now);
        now.is_none() || before != now
    }

    /// A tick began at `t`, after the last tick's work and a wait of at most `poll`.
    fn ticked(&mut self, t: u64, poll: Duration) {
        if self.tick_at != 0 {
            // The work is the reaction, counted apart (`worked`).
            let waited = t.saturating_sub(self.tick_at).saturating_sub(self.worked);
            let late = waited.saturating_sub(u64::try_from(poll.as_nanos()).unwrap_or(u64::MAX));
            self.late.saw(late, t);
        }
        self.tick_at = t;
    }

    /// How long until the thread looks again: `poll`, and as much later as its ticks have come
    /// recently.
    fn look(&self, poll: Duration) -> Duration {
        poll.saturating_add(Duration::from_nanos(self.late.at(self.tick_at)))
    }

    /// The charge rate now (bytes per second).
    fn rate(&self) -> u64 {
        self.rate.at(self.tick_at)
    }

    fn measured(&mut self, t: u64, headroom: u64) {
        if let Some((t0, h0)) = self.last {
            let dt = t.saturating_sub(t0).max(1);
            let fallen = h0.saturating_sub(headroom);
            let rate = fallen as u128 * 1_000_000_000 / dt as u128;
            self.rate.saw(u64::try_from(rate).unwrap_or(u64::MAX), t);
        }
        self.last = Some((t, headroom));
    }
}

/// The longest a tick spends arming the reserve (`victims::keep_reserve`): a fifth of a
/// tight tick.
const ARM_WORK: Duration = Duration::from_millis(approach::TIGHT_POLL.as_millis() as u64 / 5);

/// Keeps the armed reserve while memory is tight (`crate::approach`, `crate::short::reserve`):
/// arms the coldest volatile hybrid ranges until the kernel could take, by itself, what can
/// be charged before this thread looks again (`look`: its poll, plus the most its recent ticks
/// came late) and reacts (`reaction`) beyond `headroom`; what could not be armed is left to the next marks (the deficit). Ranges volatile
/// for the arm delay (`delay_ns`) are armed as well, as away from the limit.
/// Candidates are looked for only when the reserve is short (`buf` holds them, kept from tick
/// to tick).
fn arm(
    headroom: u64,
    pace: &mut Pace,
    (look, reaction): (Duration, Duration),
    delay_ns: u64,
    buf: &mut victims::Scratch,
) {
    let target = short::reserve(headroom, short::burst(pace.rate(), look + reaction));
    let now = now_ns();
    let armed = victims::armed(pace.discarded(), buf);
    buf.candidates.clear();
    if armed.bytes < target {
        victims::reserve_candidates(now, target - armed.bytes, &mut buf.candidates);
    }
    let p = pause();
    let until = now_ns().saturating_add(ARM_WORK.as_nanos() as u64);
    let (done, missing) = victims::keep_reserve(&armed, &buf.candidates, target, until);
    let aged = victims::arm_due(now, delay_ns);
    drop(p);
    approach::set_reserve(target, missing);
    stats::count_armed((done + aged) as usize);
}

/// Measures headroom (the watch's open source; else short-lived reads of the cgroup's files,
/// or of MemAvailable without a limit) and updates the approach state and the charge rate;
/// while the process has volatile memory (or `first`: the reclaimer just started, its process
/// about to have some) and the thread may open files (`waker::files_ok`); otherwise the state
/// stays as it is. Returns the headroom read, if one was.
fn approach_check(
    watch: Option<&Watch>,
    t: u64,
    poll: Duration,
    first: bool,
    pace: &mut Pace,
) -> Option<u64> {
    if (!first && stats::volatile_resident() == 0) || !waker::files_ok() {
        return None;
    }
    let headroom = match watch {
        Some(Watch {
            headroom: Some(h), ..
        }) => h.bytes().ok(),
        Some(Watch { cgroup, .. }) => cgroup.as_ref().and_then(MemCgroup::headroom),
        None => MemCgroup::current().and_then(|cg| cg.headroom()),
    }
    .or_else(approach::machine_headroom);
    approach::update(headroom, poll, t);
    if let Some(h) = headroom {
        pace.measured(t, h);
    }
    headroom
}

fn check_headroom(watch: &Watch, t: u64, coordinated: bool) {
    let setting = config::get().headroom.load(Relaxed);
    let Some(h) = watch.headroom.as_ref() else {
        return;
    };
    // Nothing to purge, unless shared regions hold some (their bytes are not counted there).
    if setting == 0 || (stats::volatile_resident() == 0 && !crate::managed::maps_shared()) {
        return;
    }
    // Two preads (usage, memory.stat) on open descriptors: cheap enough for every tick.
    let Ok(read) = h.read() else {
        return;
    };
    let room = short::Room {
        headroom: read.headroom,
        threshold: short::threshold(setting, h.ceiling()),
        free: read.free,
    };
    let deficit = room.deficit_after(0);
    if deficit > 0 && coordinated {
        stats::count_deferred();
    } else if deficit > 0 {
        respond(Source::Headroom, t, deficit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peak_halves_every_half_second() {
        let ms = 1_000_000u64;
        let mut p = Peak::<500>::default();
        p.saw(800, 0);
        p.saw(100, 10 * ms);
        assert_eq!(p.at(10 * ms), 800, "a smaller sample keeps the peak");
        assert_eq!(p.at(500 * ms), 400);
        assert_eq!(p.at(1000 * ms), 200);
        p.saw(300, 1000 * ms);
        assert_eq!(
            p.at(1000 * ms),
            300,
            "a sample above the decayed peak replaces it"
        );
        assert_eq!(p.at(u64::MAX), 0);
    }

    #[test]
    fn the_look_adds_the_latest_recent_lateness_of_a_tick() {
        let ms = 1_000_000u64;
        let mut pace = Pace::default();
        let poll = Duration::from_millis(10);
        for t in [1, 11, 21, 231, 241] {
            pace.ticked(t * ms, poll);
        }
        assert_eq!(
            pace.look(poll),
            Duration::from_millis(210),
            "a tick 200 ms late counts"
        );
        // Ticks every 10 ms, on time, from `from` ms to before `to` ms.
        let on_time = |pace: &mut Pace, from: u64, to: u64| {
            for t in (from..to).step_by(10) {
                pace.ticked(t * ms, poll);
            }
        };
        // On time for 4 s: the lateness is still remembered whole (a starved thread is
        // starved again).
        on_time(&mut pace, 251, 4251);
        assert_eq!(pace.look(poll), Duration::from_millis(210));
        on_time(&mut pace, 4251, 5261);
        assert_eq!(
            pace.look(poll),
            Duration::from_millis(110),
            "halved after 5 s"
        );
        on_time(&mut pace, 5261, 60_000);
        assert!(
            pace.look(poll) < poll + Duration::from_millis(1),
            "forgotten in a minute"
        );
        // A relaxed poll of 100 ms followed by a tight one: the wait was the longer poll's,
        // not a late tick.
        let before = pace.look(poll);
        pace.ticked(60_090 * ms, Duration::from_millis(100));
        assert_eq!(pace.look(poll), before);
        pace.measured(0, 100 << 20);
        pace.measured(10 * ms, 60 << 20);
        assert_eq!(pace.rate.at(10 * ms), 4000 << 20, "40 MiB in 10 ms");
    }
}
