//! How other threads wake the reclaimer, and the reclaimer's own descriptor table.
//!
//! The thread does all its file work (pressure sources, `/proc` and cgroup reads, the
//! statistics file, the coordinator's socket) in an empty descriptor table of its own, entered
//! as it starts (`vrange_sys::own_table`): nothing it opens can take a number the program
//! closed a moment ago and is about to restore, and nothing the program closes can be one of
//! its sources. The program's table holds no descriptor of the reclaimer's at all.
//!
//! Other threads wake it through a futex word (`WAKE_SEQ`: a bump and a futex wake, which is
//! async-signal-safe). While the thread has no sources it sleeps on that word itself. Once it
//! polls its sources, a small bell thread sharing its table sleeps on the word instead and
//! rings an eventfd in the poll set (`Bell`); the bell exists only while the sources do.
//!
//! Where the kernel or a seccomp filter refuses an own table (`vrange features` says why), the
//! thread is a guest in the program's table as before: each open only while 0, 1 and 2 are
//! open, each descriptor verified before use, and the eventfd, which the waking threads then
//! write themselves, published in `WAKER` and recreated if the program closes it.

use super::{RUNNING, STATE};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU8};
use std::sync::Arc;
use std::time::Duration;
use vrange_sys::fd::{self, Ident};
use vrange_sys::futex;
use vrange_sys::own_table;
use vrange_sys::pressure::Waker;

/// Bumped by every wake-up; the thread (or its bell) sleeps on it.
pub(super) static WAKE_SEQ: AtomicU32 = AtomicU32::new(0);
/// The wake-up eventfd in the program's table, written by waking threads: only where an own
/// table is refused (null otherwise, and until the thread opens its sources).
static WAKER: AtomicPtr<Waker> = AtomicPtr::new(std::ptr::null_mut());

const PENDING: u8 = 0;
const OWN: u8 = 1;
const REFUSED: u8 = 2;
/// Where the running thread's descriptors live: its own table, or (`REFUSED`) the program's.
static TABLE: AtomicU8 = AtomicU8::new(PENDING);

/// Wakes the thread, whether it sleeps on the futex or in poll(2). Async-signal-safe.
pub(super) fn wake() {
    WAKE_SEQ.fetch_add(1, Release);
    futex::wake_all(&WAKE_SEQ);
    let w = WAKER.load(Acquire);
    // SAFETY: a published waker is freed only by `drop_waker` after the thread is joined, and
    // a replaced one is never freed (see `guest_ident`).
    if let Some(w) = unsafe { w.as_ref() } {
        w.wake();
    }
}

/// Called as the thread starts: enters its own table (or records the refusal).
pub(super) fn enter_table() {
    let own = own_table::enter().is_ok();
    TABLE.store(if own { OWN } else { REFUSED }, Relaxed);
}

/// Called as the thread ends, before another can start.
pub(super) fn thread_ended() {
    TABLE.store(PENDING, Relaxed);
}

/// Whether the thread may open files now: in its own table always; as a guest in the
/// program's table while 0, 1 and 2 are open.
pub(super) fn files_ok() -> bool {
    own_table::active() || (TABLE.load(Relaxed) == REFUSED && fd::std_fds_open())
}

/// The eventfd for the thread's poll set: rung by `bell` (created on first use) in its own
/// table; published for the waking threads in the program's table where an own table is
/// refused. `None` if no eventfd can be had now (the thread then wakes at its ticks).
pub(super) fn poll_ident(bell: &mut Option<Bell>) -> Option<Ident> {
    if !own_table::active() {
        return guest_ident();
    }
    if bell.is_none() {
        *bell = Bell::new();
    }
    bell.as_ref().map(Bell::ident)
}

/// As a guest: the published eventfd if it is intact, else a new one. A replaced one (its
/// eventfd closed by the program) is leaked, not freed: another thread may be inside `wake`
/// with it, and its descriptor is not ours to close any more.
fn guest_ident() -> Option<Ident> {
    let w = WAKER.load(Acquire);
    // SAFETY: as in `wake`; only the reclaimer thread replaces the waker.
    if let Some(w) = unsafe { w.as_ref() } {
        if w.is_intact() {
            return Some(w.ident());
        }
    }
    let fresh = Waker::new().ok()?;
    let ident = fresh.ident();
    // The old pointer, if any, is deliberately leaked (see above).
    WAKER.swap(Box::into_raw(Box::new(fresh)), AcqRel);
    Some(ident)
}

/// Frees the published eventfd; only once the thread that used it has been joined.
pub(super) fn drop_waker() {
    let w = WAKER.swap(std::ptr::null_mut(), AcqRel);
    if !w.is_null() {
        // SAFETY: the pointer came from Box::into_raw in `guest_ident` and was just
        // unpublished; the thread that used it has been joined (or never existed).
        drop(unsafe { Box::from_raw(w) });
    }
}

/// In a fork child: the parent's eventfd is not the child's (its copy, if any, is closed with
/// the other private descriptors). Async-signal-safe.
pub(super) fn after_fork_child() {
    WAKER.store(std::ptr::null_mut(), Release);
    TABLE.store(PENDING, Relaxed);
}

/// A thread in the reclaimer's own table that turns futex wake-ups into eventfd wake-ups for
/// its poll set. Stopped and joined on drop.
pub(super) struct Bell {
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Bell {
    /// Spawned by the reclaimer thread (so it shares the reclaimer's own table and blocks
    /// every signal, as the reclaimer does).
    fn new() -> Option<Bell> {
        let waker = Arc::new(Waker::new().ok()?);
        let stop = Arc::new(AtomicBool::new(false));
        let (w, s) = (Arc::clone(&waker), Arc::clone(&stop));
        let own = own_table::active();
        let thread = std::thread::Builder::new()
            .name("vrange-bell".into())
            .stack_size(64 << 10)
            .spawn(move || {
                own_table::spawned_by(own);
                ring(&w, &s);
            })
            .ok()?;
        Some(Bell {
            waker,
            stop,
            thread: Some(thread),
        })
    }

    fn ident(&self) -> Ident {
        self.waker.ident()
    }
}

/// The bell's loop: rings once for every change of `WAKE_SEQ` (wakes before a ring coalesce).
fn ring(waker: &Waker, stop: &AtomicBool) {
    let mut rung = WAKE_SEQ.load(Acquire);
    loop {
        let seq = WAKE_SEQ.load(Acquire);
        if seq != rung {
            rung = seq;
            waker.wake();
        }
        // After the ring: `stop` wakes the thread to tell it to end.
        if stop.load(Acquire) || STATE.load(Acquire) != RUNNING {
            return;
        }
        futex::wait(&WAKE_SEQ, seq, Duration::from_secs(1));
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        self.stop.store(true, Release);
        WAKE_SEQ.fetch_add(1, Release);
        futex::wake_all(&WAKE_SEQ);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
