//! Memory-pressure sources for the reclaimer: PSI triggers, cgroup v1 vmpressure listeners, a
//! wake-up eventfd, a fixed-capacity poll set that waits on all of them, and a headroom reader.
//!
//! Owns every open, trigger write, `eventfd(2)` and `poll(2)` of the pressure machinery. It
//! never decides policy (when or how much to purge is the reclaimer's job) and never writes a
//! cgroup setting (registering a listener through `cgroup.event_control` changes none). Once
//! the sources exist, [`Poller::wait`], [`Waker::wake`] and [`Headroom::bytes`] never allocate
//! or lock: they are system calls on descriptors opened beforehand.
//!
//! # Sources
//!
//! - [`PsiTrigger::system`]: `/proc/pressure/memory`. Fires when tasks stalled on memory for
//!   `stall_us` within `window_us` ("some": at least one task stalled; "full": all non-idle
//!   tasks at once). Unprivileged triggers are checked by the kernel's 2 s averaging work, so
//!   they fire up to one period after the stall (0.2–2 s in the tests here); privileged ones by
//!   an RT kthread (`psimon`, one per PSI group) that polls every window/10 while stalls last.
//!   Needs PSI (4.20; `psi=1` on kernels built with `CONFIG_PSI_DEFAULT_DISABLED`), triggers
//!   (5.2) and, without CAP_SYS_RESOURCE, 6.4.
//! - [`PsiTrigger::cgroup`] and [`PsiTrigger::file`]: a v2 cgroup's `memory.pressure`. The
//!   same, counting only the tasks in that cgroup and below. A new cgroup's averaging clock
//!   starts at its creation (first event about 2 s after it in the tests).
//! - [`VmPressure`]: a cgroup v1 `memory.pressure_level` listener, an eventfd registered
//!   through `cgroup.event_control`. Fires when reclaim aimed at that cgroup (its limit) or at a
//!   descendant frees little of what it scans. The kernel evaluates every 512 pages (2 MiB)
//!   scanned in a work item, so it fires within milliseconds (40–120 ms after the thrasher of
//!   the tests started). Needs the v1 memory controller (3.10; `CONFIG_MEMCG_V1` from 6.11).
//! - [`Waker`]: an eventfd another thread or a signal handler writes; immediate.
//!
//! Cost while waiting: nothing; every source is a descriptor in one `poll(2)`. When something
//! fires: one wake-up of the waiter and an 8-byte `read(2)` per eventfd to drain it. In the
//! kernel, an unprivileged PSI trigger rides on averaging work that runs anyway, a privileged
//! one starts the `psimon` thread, and a vmpressure listener adds a work item per 2 MiB that
//! reclaim scans in its cgroup.
//!
//! ## PSI: the window rule
//! The kernel (kernel/sched/psi.c, `psi_trigger_create`) accepts `"some|full <stall_us>
//! <window_us>"` when `0 < window_us <= 10 s` and `0 < stall_us <= window_us`, and, unless the
//! **opener** of the file had CAP_SYS_RESOURCE in its effective set (checked on `file->f_cred`,
//! so it is about the capability, not about uid 0), only windows that are a multiple of 2 s
//! (2, 4, 6, 8 or 10 s): unprivileged triggers are evaluated by the 2 s averaging work instead
//! of an RT thread. Before 6.4 windows also had to be at least 500 ms, and unprivileged openers
//! could not write the files at all (5.13–6.3: EPERM at open without CAP_SYS_RESOURCE; 5.2–5.12:
//! root only). A trigger fires at most once per window. One trigger per open file (EBUSY on a
//! second write); closing the fd removes it.
//!
//! The string must be written in one `write(2)` *including its trailing NUL*: the /proc writer
//! overwrites the last byte written with a NUL, so `"some 150000 2000000"` without it is read as
//! a 200 ms window (EINVAL when unprivileged, silently a different trigger when privileged).
//! The cgroup (kernfs) writer terminates the buffer itself; the NUL is harmless there.
//!
//! Measured on the Linux 6.18 test VM, as root *without* CAP_SYS_RESOURCE (the capability was
//! dropped from the bounding set): 2, 4 and 10 s windows accepted; 0.5, 1, 3 and 12 s rejected
//! with EINVAL; `stall == window` accepted, `stall > window` and `stall == 0` rejected.
//! [`psi_window_us`] rounds a wish to what the kernel will take.
//!
//! ## PSI on hybrid hierarchies
//! PSI groups follow the v2 hierarchy, not the memory controller: with the memory controller
//! on v1 and cgroup2 mounted without it, every v2 cgroup still has a `memory.pressure` file that
//! counts its tasks' memory stalls (the v2 root's equals `/proc/pressure/memory`).
//! [`PsiTrigger::cgroup`] takes a [`MemCgroup`], which is a v1 cgroup there; use
//! [`PsiTrigger::file`] with the v2 directory instead. When that cgroup is removed, its fd polls
//! as POLLERR, which [`Poller::wait`] reports as [`Ready::broken`].
//!
//! ## vmpressure (cgroup v1)
//! Reclaim reports, per 512 pages scanned, a pressure of `100 * (1 - reclaimed / scanned)`:
//! below 60 is *low*, from 60 *medium*, from 95 *critical*; reclaim reaching priority 3
//! (scanning an eighth of the LRU per pass without freeing enough) also counts as critical. A
//! listener fires for its level **and every level above** (a Medium listener fires on critical
//! events too), so register both Medium and Critical to tell them apart. The report goes to the
//! cgroup whose limit caused the reclaim and then up to its ancestors ([`Propagation`]);
//! machine-wide reclaim reports only to the root memory cgroup, so listen there (or use PSI)
//! for global pressure.
//!
//! [`Level::Low`] exists for completeness and is not used by default: it fires on every
//! evaluation, also when reclaim is efficient, each time waking the reclaimer for memory the
//! kernel is reclaiming cheaply anyway. Measured on the test VM: streaming a file through a
//! 64 MiB cgroup gave about 430 low events per second and no medium or critical ones. Under
//! thrashing the others are as busy: with 48 MiB of that cgroup anonymous and a 32 MiB file
//! cycled through the rest (the tests' thrasher), the listeners counted about 2000 low, 1000
//! medium and 1000 critical events per second. The eventfd folds them into one wake-up per
//! wait, but a waiter that purges and waits again at once is woken again at once; pacing the
//! loop is the caller's policy.
//!
//! Removing the cgroup signals each listener's eventfd once ("the event is going away"), which
//! looks like pressure; [`VmPressure::is_stale`] tells the two apart.
//!
//! # Safety
//! Every `unsafe` block is a system call on a descriptor this module owns or a buffer it
//! passes with its length; each names the check it relies on.

use crate::cgroup::{MemCgroup, Version};
pub use crate::fd::Ident;
use crate::fd::{GuestFd, Inherit};
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

/// The system-wide memory PSI file.
pub const SYSTEM_PSI_FILE: &str = "/proc/pressure/memory";
/// The largest PSI window the kernel accepts (`WINDOW_MAX_US`).
pub const PSI_WINDOW_MAX_US: u64 = 10_000_000;
/// Without CAP_SYS_RESOURCE, PSI windows must be a multiple of this (the averaging period).
pub const PSI_UNPRIVILEGED_STEP_US: u64 = 2_000_000;
/// The smallest window kernels before 6.4 accept, and the smallest [`psi_window_us`] returns:
/// a privileged trigger polls every window/10, so shorter windows only burn CPU.
pub const PSI_WINDOW_MIN_US: u64 = 500_000;
/// Sources one [`Poller`] holds.
pub const POLLER_CAPACITY: usize = 8;

/// CAP_SYS_RESOURCE from linux/capability.h.
const CAP_SYS_RESOURCE: u32 = 24;
/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit capability sets, two data structs.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Which pressure signal fired; bit positions in [`Signals`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// A [`Waker`] was woken.
    Wake,
    /// A PSI trigger on `/proc/pressure/memory`.
    PsiSystem,
    /// A PSI trigger on a cgroup's `memory.pressure`.
    PsiCgroup,
    /// A [`VmPressure`] listener for [`Level::Low`] (see the module documentation for why it
    /// is not used by default).
    VmpressureLow,
    /// A [`VmPressure`] listener for [`Level::Medium`].
    VmpressureMedium,
    /// A [`VmPressure`] listener for [`Level::Critical`].
    VmpressureCritical,
    /// A message from the coordinator (a socket polled for input, never drained here).
    Coordinator,
}

impl Signal {
    /// Every signal, in bit order.
    pub const ALL: [Signal; 7] = [
        Signal::Wake,
        Signal::PsiSystem,
        Signal::PsiCgroup,
        Signal::VmpressureLow,
        Signal::VmpressureMedium,
        Signal::VmpressureCritical,
        Signal::Coordinator,
    ];

    const fn bit(self) -> u8 {
        1 << self as u8
    }

    /// Whether sources of this signal are eventfds: readable (POLLIN) until drained. PSI
    /// triggers instead report POLLPRI, and poll(2) itself consumes the event.
    const fn is_eventfd(self) -> bool {
        !matches!(
            self,
            Signal::PsiSystem | Signal::PsiCgroup | Signal::Coordinator
        )
    }

    /// Whether sources of this signal are PSI triggers (polled for POLLPRI).
    const fn is_psi(self) -> bool {
        matches!(self, Signal::PsiSystem | Signal::PsiCgroup)
    }
}

/// A set of [`Signal`]s: a bitmask, `Copy`, no allocation.
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Signals(u8);

impl Signals {
    /// The empty set.
    pub const fn empty() -> Signals {
        Signals(0)
    }

    /// Whether `signal` is in the set.
    pub const fn contains(self, signal: Signal) -> bool {
        self.0 & signal.bit() != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Adds `signal`.
    pub fn insert(&mut self, signal: Signal) {
        self.0 |= signal.bit();
    }

    /// The signals in the set, in bit order.
    pub fn iter(self) -> impl Iterator<Item = Signal> {
        Signal::ALL.into_iter().filter(move |s| self.contains(*s))
    }
}

impl fmt::Debug for Signals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// What one [`Poller::wait`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ready {
    fired: Signals,
    broken: Signals,
}

impl Ready {
    /// Whether `signal` fired.
    pub fn contains(&self, signal: Signal) -> bool {
        self.fired.contains(signal)
    }

    /// The signals that fired.
    pub fn fired(&self) -> Signals {
        self.fired
    }

    /// Signals of sources that broke (POLLERR, POLLHUP or POLLNVAL: a PSI trigger whose cgroup
    /// was removed, or a descriptor closed while still in the set). The poller has already
    /// dropped them from its set; the caller should drop the sources too.
    pub fn broken(&self) -> Signals {
        self.broken
    }

    /// True after a timeout or an interrupted wait: nothing fired and nothing broke.
    pub fn is_empty(&self) -> bool {
        self.fired.is_empty() && self.broken.is_empty()
    }
}

mod headroom;
mod poller;
mod psi;
mod vmpressure;
mod waker;

pub use headroom::{Headroom, OwnHeadroom, Reading};
pub use poller::{AddError, Poller};
pub use psi::{
    has_cap_sys_resource, psi_window_for, psi_window_us, stall_file, PsiReading, PsiTrigger,
};
pub use vmpressure::{Level, Propagation, VmPressure};
pub use waker::Waker;

/// A non-blocking, close-on-exec eventfd with counter 0. Non-blocking because
/// [`Poller::wait`] drains it with a read that must never block.
fn new_eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd has no memory-safety preconditions.
    crate::fd::create_guarded(|| unsafe {
        libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)
    })
}

/// Resets an eventfd's counter and returns what it was. Errors count as 0: EAGAIN means it is
/// already drained.
fn read_eventfd(fd: BorrowedFd<'_>) -> u64 {
    let mut count: u64 = 0;
    // SAFETY: reads at most 8 bytes into `count`, which lives across the call; the fd is
    // non-blocking (new_eventfd), so this cannot hang the waiter.
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut count as *mut u64).cast(),
            std::mem::size_of::<u64>(),
        )
    };
    if n == std::mem::size_of::<u64>() as isize {
        count
    } else {
        0
    }
}

/// One pread(2) at offset 0.
fn pread(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: reads at most buf.len() bytes into `buf`, borrowed mutably for the call.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_set() {
        let mut s = Signals::empty();
        assert!(s.is_empty());
        s.insert(Signal::PsiCgroup);
        s.insert(Signal::Wake);
        assert!(s.contains(Signal::Wake) && s.contains(Signal::PsiCgroup));
        assert!(!s.contains(Signal::VmpressureMedium));
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [Signal::Wake, Signal::PsiCgroup]
        );
        assert_eq!(format!("{s:?}"), "{Wake, PsiCgroup}");
    }
}
