//! The reclaimer: one thread per process, started by the first managed or hybrid region (or
//! refill region filled on the faulting thread, whose fills use the headroom it reads each
//! tick: `room::recent`) and stopped by [`stop`]. It waits on every pressure source the kernel and privileges offer (PSI
//! triggers, cgroup v1 vmpressure events, a wake-up eventfd) with a timeout, and on each wake-up
//! or tick purges whole volatile ranges, lowest class and least recently used first:
//!
//! | source | how it is noticed | bytes purged |
//! |---|---|---|
//! | PSI (system, cgroup v2) | POLLPRI on a trigger (the system's only while MemAvailable < MemTotal / 10) | `VRANGE_PRESSURE_SHARE`% of volatile bytes (at least 2 MiB) |
//! | vmpressure medium / critical (cgroup v1) | eventfd | the same / everything |
//! | headroom | limit − usage polled every `VRANGE_POLL_MS` | enough to restore twice the threshold |
//! | budget | the mark that crosses it wakes the thread; one that finds it a budget behind purges itself ([`catch_up`]) | the excess |
//! | explicit | [`purge`](crate::purge) in the caller's thread | what was asked |
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
//! source). Where an own table is refused, every source is a `vrange_sys::fd::GuestFd` in the
//! program's table: above the descriptor floor, close-on-exec, verified before each use; a
//! program that closes them (`closefrom`, `close_range`) is noticed at the next wake-up or
//! within a second, the sources are reopened and the loss is counted in `vrange_sys::fd::counts`.
//!
//! # Fork
//! A fork child has no reclaimer (threads do not survive fork). It starts its own on its next
//! mark of a managed range, new region or [`purge`](crate::purge). The start lock is held across the fork
//! (`vrange_sys::lock`), and the child forgets the parent's thread, waker and sources
//! ([`after_fork_child`]); the fork protocol closes the child's copies of their descriptors
//! (verified first), which would otherwise keep the parent's triggers alive.
//!
//! # Files
//! This file: the thread's state (start, stop, wake reasons, fork). `thread`: its loop.
//! `sources`: what it listens to. `budget`, `room`, `purge`: the budget, [`make_room`], and
//! purges in the caller's thread. `victims`: which ranges go, oldest first. `participant`: the
//! link to a coordinator. `waker`: the thread's own descriptor table and its bell. `config`:
//! the settings. `flush`: the clients' flush hooks.

mod budget;
pub(crate) mod config;
mod flush;
mod participant;
mod purge;
mod room;
mod sources;
mod thread;
mod victims;
mod waker;

pub use budget::catch_up;
pub(crate) use budget::noticed_mark;
pub use purge::purge;
pub(crate) use purge::purge_region;

pub use room::{make_room, room};

use waker::wake;

pub use flush::{on_flush, FlushHook};

pub use config::{set_option, Config, Headroom, Psi, OPTIONS};

use crate::approach;
use crate::stats::{self, Source};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU8};
use vrange_sys::lock::{Lock, Rank, RankedMutex};

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
/// Serialises start and stop; held across fork.
pub(crate) static START: Lock = Lock::with_child_hook(Rank::ReclaimerStart, Some(after_fork_child));
/// A `start` is spawning the thread or a `stop` joining it (set and cleared under [`START`], the
/// spawn or join itself outside it: both allocate, and a fork's preparation takes the
/// allocator's locks, lower ranks, before START). Each waits while the other's is in flight; a
/// fork child has no such thread and clears it.
static IN_FLIGHT: AtomicBool = AtomicBool::new(false);
static THREAD: RankedMutex<Option<std::thread::JoinHandle<()>>> =
    RankedMutex::new(Rank::ReclaimerThread, None);
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
    if STATE.load(Relaxed) == IDLE {
        start();
    }
}

/// Takes [`START`] once no spawn or join is in flight outside it.
fn start_lock() -> vrange_sys::lock::Guard<'static> {
    let mut round = 0;
    loop {
        let held = START.lock();
        if !IN_FLIGHT.load(Relaxed) {
            return held;
        }
        drop(held);
        vrange_sys::sync::backoff(&mut round);
    }
}

fn start() {
    let cfg = config::get();
    {
        let _starting = start_lock();
        if STATE.load(Acquire) != IDLE {
            return;
        }
        if !cfg.enabled.load(Relaxed) {
            set_state(DISABLED);
            return;
        }
        set_state(RUNNING);
        IN_FLIGHT.store(true, Relaxed);
    }
    // Spawned with START released: spawning allocates (through the program's allocator, which
    // may be vrange-malloc), and a fork's preparation takes the allocator's locks (lower
    // ranks) before START. A spawn under START while another thread forked could wait for an
    // allocator lock the fork holds, and the fork for START. `stop` waits while `IN_FLIGHT` is
    // set, so the handle is always where it looks.
    let spawned = vrange_sys::process::spawn_without_signals(THREAD_NAME, thread::run);
    let _starting = START.lock();
    match spawned {
        Ok(handle) => {
            *THREAD.lock() = Some(handle);
            crate::publish::started();
        }
        // Unless a fork child made it idle meanwhile (it has no spawning thread).
        Err(_) if STATE.load(Acquire) == RUNNING => set_state(IDLE),
        Err(_) => {}
    }
    IN_FLIGHT.store(false, Relaxed);
}

/// Stops the reclaimer thread and waits for it. Volatile ranges stay volatile; the next managed
/// mark, region or [`purge`](crate::purge) starts it again.
pub fn stop() {
    let handle = {
        let _stopping = start_lock();
        let handle = if STATE.load(Acquire) == RUNNING {
            set_state(STOPPING);
            wake();
            THREAD.lock().take()
        } else {
            None
        };
        let Some(handle) = handle else {
            stopped();
            return;
        };
        IN_FLIGHT.store(true, Relaxed);
        handle
    };
    // Joined with START released, as the spawn (the exiting thread frees its own memory).
    let _ = handle.join();
    let _stopping = START.lock();
    IN_FLIGHT.store(false, Relaxed);
    stopped();
}

/// The end of a stop, under [`START`].
fn stopped() {
    if STATE.load(Acquire) != DISABLED {
        set_state(IDLE);
    }
    waker::drop_waker();
}

/// A setting changed: the thread re-reads them (and a disabled reclaimer may start).
pub(crate) fn config_changed() {
    if config::get().enabled.load(Relaxed) {
        let _ = STATE.compare_exchange(DISABLED, IDLE, AcqRel, Relaxed);
    }
    WAKE_REASONS.fetch_or(WAKE_CONFIG, AcqRel);
    wake();
}

/// In a fork child (under the start lock): the thread did not survive the fork. Its handle,
/// waker and sources belong to the parent's thread: forgotten without running their
/// destructors (no allocator calls here); the fork protocol closed the child's copies of the
/// descriptors, each verified first.
fn after_fork_child() {
    IN_FLIGHT.store(false, Relaxed);
    if let Some(mut t) = THREAD.try_lock() {
        std::mem::forget(t.take());
    }
    waker::after_fork_child();
    WAKE_REASONS.store(0, Relaxed);
    ACTIVE.store(0, Relaxed);
    approach::reset();
    // The parent's link to a coordinator is not the child's (its copy is closed).
    stats::set_coordinated(false);
    if STATE.load(Relaxed) != DISABLED {
        set_state(IDLE);
    }
}
