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

use super::cgroup::{MemCgroup, Version};
use super::fd::{GuestFd, Ident, Inherit};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
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
}

impl Signal {
    /// Every signal, in bit order.
    pub const ALL: [Signal; 6] = [
        Signal::Wake,
        Signal::PsiSystem,
        Signal::PsiCgroup,
        Signal::VmpressureLow,
        Signal::VmpressureMedium,
        Signal::VmpressureCritical,
    ];

    const fn bit(self) -> u8 {
        1 << self as u8
    }

    /// Whether sources of this signal are eventfds: readable (POLLIN) until drained. PSI
    /// triggers instead report POLLPRI, and poll(2) itself consumes the event.
    const fn is_eventfd(self) -> bool {
        !matches!(self, Signal::PsiSystem | Signal::PsiCgroup)
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

// ---- PSI ----

/// A PSI trigger: its fd reports POLLPRI when tasks stalled on memory for `stall_us` within
/// `window_us`. Closing it (drop) removes the trigger.
#[derive(Debug)]
pub struct PsiTrigger {
    fd: GuestFd,
    stall_us: u64,
    window_us: u64,
    full: bool,
}

impl PsiTrigger {
    /// A trigger on `/proc/pressure/memory`: stalls of any task on the machine. `full` selects
    /// "full" (all non-idle tasks stalled at once) instead of "some" (at least one).
    ///
    /// # Errors
    /// InvalidInput when the kernel would reject the numbers (see the module documentation;
    /// [`psi_window_us`] gives an acceptable window); NotFound without PSI (also when booted
    /// with `psi=0`); Unsupported when the kernel reports PSI disabled (EOPNOTSUPP);
    /// PermissionDenied before Linux 6.4 without CAP_SYS_RESOURCE.
    pub fn system(stall_us: u64, window_us: u64, full: bool) -> io::Result<PsiTrigger> {
        PsiTrigger::file(Path::new(SYSTEM_PSI_FILE), stall_us, window_us, full)
    }

    /// A trigger on the `memory.pressure` file of the v2 cgroup `cg`: stalls of its tasks.
    ///
    /// # Errors
    /// Unsupported for a v1 cgroup (no such file: use [`VmPressure`], or [`PsiTrigger::file`]
    /// on the v2 cgroup of a hybrid setup); NotFound when the kernel has no cgroup PSI; and the
    /// errors of [`PsiTrigger::system`].
    pub fn cgroup(
        cg: &MemCgroup,
        stall_us: u64,
        window_us: u64,
        full: bool,
    ) -> io::Result<PsiTrigger> {
        if cg.version() == Version::V1 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} is a cgroup v1 memory cgroup, which has no memory.pressure",
                    cg.path().display()
                ),
            ));
        }
        let Some(path) = cg.pressure_file() else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} has no memory.pressure (kernel without cgroup PSI?)",
                    cg.path().display()
                ),
            ));
        };
        PsiTrigger::file(&path, stall_us, window_us, full)
    }

    /// A trigger on any memory PSI file: `/proc/pressure/memory` or a v2 cgroup's
    /// `memory.pressure` (also one of a hybrid setup whose memory controller is on v1).
    ///
    /// # Errors
    /// As [`PsiTrigger::system`]; EBUSY cannot happen (each trigger opens its own file).
    pub fn file(path: &Path, stall_us: u64, window_us: u64, full: bool) -> io::Result<PsiTrigger> {
        // The kernel checks the opener's capability, and this thread is the opener.
        let privileged = has_cap_sys_resource();
        check_trigger(stall_us, window_us, privileged)
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            // Only ever polled, never read; non-blocking so that a stray read cannot stall.
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| {
                let hint = match e.kind() {
                    io::ErrorKind::PermissionDenied => {
                        " (before Linux 6.4 PSI triggers need CAP_SYS_RESOURCE)"
                    }
                    io::ErrorKind::NotFound => " (kernel without PSI, or booted with psi=0)",
                    _ => "",
                };
                io::Error::new(e.kind(), format!("open {}: {e}{hint}", path.display()))
            })?;
        let mut buf = [0u8; 32];
        let len = trigger_text(&mut buf, stall_us, window_us, full);
        let text = &buf[..len];
        match (&file).write(text) {
            Ok(n) if n == len => {}
            Ok(n) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("{}: short trigger write ({n} of {len})", path.display()),
                ))
            }
            Err(e) => {
                let shown = String::from_utf8_lossy(&text[..len - 1]).into_owned();
                let (kind, hint) = match e.raw_os_error() {
                    Some(libc::EINVAL) => (
                        io::ErrorKind::InvalidInput,
                        " (window must be at most 10 s, a multiple of 2 s without \
                         CAP_SYS_RESOURCE, at least 500 ms before Linux 6.4; stall at most the \
                         window)",
                    ),
                    Some(libc::EOPNOTSUPP) => (io::ErrorKind::Unsupported, " (PSI disabled)"),
                    _ => (e.kind(), ""),
                };
                return Err(io::Error::new(
                    kind,
                    format!("{}: trigger {shown:?} rejected: {e}{hint}", path.display()),
                ));
            }
        }
        Ok(PsiTrigger {
            // The trigger belongs to the open file, so it survives the move above the floor.
            fd: GuestFd::adopt(file.into(), Inherit::Private)?,
            stall_us,
            window_us,
            full,
        })
    }

    /// The descriptor number (unverified; for display).
    pub fn fd(&self) -> RawFd {
        self.fd.raw()
    }

    /// The identity to poll for POLLPRI.
    pub fn ident(&self) -> Ident {
        self.fd.ident()
    }

    /// The stall threshold in microseconds.
    pub fn stall_us(&self) -> u64 {
        self.stall_us
    }

    /// The window in microseconds.
    pub fn window_us(&self) -> u64 {
        self.window_us
    }

    /// Whether this is a "full" (rather than "some") trigger.
    pub fn full(&self) -> bool {
        self.full
    }
}

/// Writes `"some|full <stall> <window>\0"` into `buf`, returning its length with the NUL.
fn trigger_text(buf: &mut [u8; 32], stall_us: u64, window_us: u64, full: bool) -> usize {
    let kind = if full { "full" } else { "some" };
    let mut cursor = io::Cursor::new(&mut buf[..]);
    // Fits: check_trigger bounds both numbers to 8 digits, 23 bytes in all.
    let written = write!(cursor, "{kind} {stall_us} {window_us}\0");
    debug_assert!(written.is_ok(), "trigger text overflows its buffer");
    cursor.position() as usize
}

/// Why the kernel would reject this trigger, checked here to give a clear message rather than
/// a bare EINVAL. `privileged`: the opener has CAP_SYS_RESOURCE.
fn check_trigger(stall_us: u64, window_us: u64, privileged: bool) -> Result<(), String> {
    if window_us == 0 || window_us > PSI_WINDOW_MAX_US {
        return Err(format!(
            "PSI window {window_us} us is outside 1..={PSI_WINDOW_MAX_US} us"
        ));
    }
    if !privileged && window_us % PSI_UNPRIVILEGED_STEP_US != 0 {
        return Err(format!(
            "PSI window {window_us} us is not a multiple of 2 s, which the kernel requires \
             without CAP_SYS_RESOURCE (try {} us)",
            psi_window_for(window_us, false)
        ));
    }
    if stall_us == 0 || stall_us > window_us {
        return Err(format!(
            "PSI stall threshold {stall_us} us is outside 1..={window_us} us (the window)"
        ));
    }
    Ok(())
}

/// The PSI window closest to `requested_us` (rounding up) that the kernel accepts from this
/// thread: without CAP_SYS_RESOURCE a multiple of 2 s in 2..=10 s, with it 500 ms..=10 s.
/// Scale the stall threshold with it if it grew.
pub fn psi_window_us(requested_us: u64) -> u64 {
    psi_window_for(requested_us, has_cap_sys_resource())
}

/// [`psi_window_us`] for a given privilege.
pub fn psi_window_for(requested_us: u64, privileged: bool) -> u64 {
    let capped = requested_us.min(PSI_WINDOW_MAX_US);
    if privileged {
        capped.max(PSI_WINDOW_MIN_US)
    } else {
        capped.div_ceil(PSI_UNPRIVILEGED_STEP_US).max(1) * PSI_UNPRIVILEGED_STEP_US
    }
}

/// Whether the calling thread has CAP_SYS_RESOURCE in its effective set, which decides the PSI
/// window rule for files it opens. Root need not have it (containers and sandboxes drop it).
/// One capget(2); no allocation.
pub fn has_cap_sys_resource() -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: version 3 of capget(2) reads one header and writes two data structs, which is
    // what `header` and `data` are (repr(C), the kernel's layout); pid 0 is this thread.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut Header,
            data.as_mut_ptr(),
        )
    };
    rc == 0 && data[0].effective & (1 << CAP_SYS_RESOURCE) != 0
}

// ---- vmpressure (cgroup v1) ----

/// A cgroup v1 vmpressure level (see the module documentation for the thresholds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Reclaim is working efficiently. Fires hundreds of times per second under steady
    /// reclaim; for completeness only.
    Low,
    /// Reclaim frees less than 40% of what it scans: caches are being squeezed.
    Medium,
    /// Reclaim frees less than 5% of what it scans, or is about to give up: OOM is near.
    Critical,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Low => "low",
            Level::Medium => "medium",
            Level::Critical => "critical",
        }
    }

    /// The [`Signal`] a listener for this level is polled as.
    pub fn signal(self) -> Signal {
        match self {
            Level::Low => Signal::VmpressureLow,
            Level::Medium => Signal::VmpressureMedium,
            Level::Critical => Signal::VmpressureCritical,
        }
    }
}

/// Which events a vmpressure listener receives, besides those of reclaim aimed at its own
/// cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    /// Also descendants' events, unless a listener of a descendant already received them.
    #[default]
    Default,
    /// Also all descendants' events, whether or not their own listeners received them.
    Hierarchy,
    /// Only reclaim aimed at this cgroup itself.
    Local,
}

/// A cgroup v1 `memory.pressure_level` listener: an eventfd the kernel signals on every
/// vmpressure event of at least its level. Closing it (drop) unregisters it.
#[derive(Debug)]
pub struct VmPressure {
    event: GuestFd,
    /// Kept open to learn whether the cgroup still exists (see [`VmPressure::is_stale`]).
    level_file: GuestFd,
    level: Level,
}

impl VmPressure {
    /// Listens for `level` (and above) on `cg`, in [`Propagation::Default`].
    ///
    /// # Errors
    /// Unsupported for a v2 cgroup; the open or write errors of the cgroup files otherwise.
    pub fn register(cg: &MemCgroup, level: Level) -> io::Result<VmPressure> {
        VmPressure::register_with(cg, level, Propagation::Default)
    }

    /// Listens for `level` (and above) on `cg`, receiving descendants' events as `propagation`
    /// says. Anything but [`Propagation::Default`] needs Linux 4.13 (EINVAL before).
    ///
    /// # Errors
    /// As [`VmPressure::register`].
    pub fn register_with(
        cg: &MemCgroup,
        level: Level,
        propagation: Propagation,
    ) -> io::Result<VmPressure> {
        if cg.version() != Version::V1 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: vmpressure needs a cgroup v1 memory cgroup (use PsiTrigger on v2)",
                    cg.path().display()
                ),
            ));
        }
        let event = GuestFd::adopt(new_eventfd()?, Inherit::Private)?;
        let level_path = cg.file("memory.pressure_level");
        let level_file = File::open(&level_path)
            .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", level_path.display())))?;
        let level_file = GuestFd::adopt(level_file.into(), Inherit::Private)?;
        let mode = match propagation {
            // No suffix, so that kernels before modes existed accept it too.
            Propagation::Default => "",
            Propagation::Hierarchy => ",hierarchy",
            Propagation::Local => ",local",
        };
        // Both were placed a moment ago by this thread: the numbers are still theirs.
        let line = format!(
            "{} {} {}{mode}",
            event.raw(),
            level_file.raw(),
            level.name()
        );
        let control = cg.file("cgroup.event_control");
        OpenOptions::new()
            .write(true)
            .open(&control)
            // cgroup files take one command per write(2).
            .and_then(|mut f| f.write(line.as_bytes()))
            .and_then(|n| {
                if n == line.len() {
                    Ok(())
                } else {
                    Err(io::Error::new(io::ErrorKind::WriteZero, "short write"))
                }
            })
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("register {line:?} in {}: {e}", control.display()),
                )
            })?;
        Ok(VmPressure {
            event,
            level_file,
            level,
        })
    }

    /// The eventfd's number (unverified; for display).
    pub fn fd(&self) -> RawFd {
        self.event.raw()
    }

    /// The eventfd's identity, to poll for POLLIN; [`Poller::wait`] drains it.
    pub fn ident(&self) -> Ident {
        self.event.ident()
    }

    /// Whether both of its descriptors are still the ones opened.
    pub fn is_intact(&self) -> bool {
        self.event.is_intact() && self.level_file.is_intact()
    }

    /// The level registered.
    pub fn level(&self) -> Level {
        self.level
    }

    /// The signal to add this listener under: `self.level().signal()`.
    pub fn signal(&self) -> Signal {
        self.level.signal()
    }

    /// Events counted since the last drain (by this call or by [`Poller::wait`]), and resets
    /// the count: how intense the pressure was, for a listener that is not in a poller. One
    /// read(2); no allocation.
    pub fn take_events(&self) -> u64 {
        self.event.get().map_or(0, read_eventfd)
    }

    /// Whether the cgroup has been removed. Its removal signals the eventfd once, which the
    /// poller reports as pressure; a listener that fired and is stale should be dropped. One
    /// pread(2) of the held `memory.pressure_level` (ENODEV once the cgroup is gone); no
    /// allocation.
    pub fn is_stale(&self) -> bool {
        let mut byte = [0u8; 1];
        match self.level_file.get() {
            Some(fd) => matches!(
                pread(fd, &mut byte),
                Err(e) if e.raw_os_error() == Some(libc::ENODEV)
            ),
            // Closed by the program: useless either way.
            None => true,
        }
    }
}

// ---- Waker ----

/// An eventfd that wakes a [`Poller`] from another thread or a signal handler. Wakes before the
/// waiter gets to them coalesce into one.
#[derive(Debug)]
pub struct Waker {
    fd: GuestFd,
}

impl Waker {
    /// A new, unsignalled waker.
    ///
    /// # Errors
    /// The errno of eventfd(2) (EMFILE, ENFILE, ENOMEM).
    pub fn new() -> io::Result<Waker> {
        Ok(Waker {
            fd: GuestFd::adopt(new_eventfd()?, Inherit::Private)?,
        })
    }

    /// Wakes the waiter (now, or at its next wait). Async-signal-safe: a verification of the
    /// eventfd (see `sys::fd`) and one write(2), no allocation, no lock. Returns false if the
    /// eventfd is no longer vrange's (the program closed it): nothing was written, and the
    /// waiter sees the loss at its next wait. The only write error, EAGAIN, means the counter
    /// is saturated, so a wake-up is pending anyway.
    pub fn wake(&self) -> bool {
        let Some(fd) = self.fd.get() else {
            return false;
        };
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, which lives across the call, to the eventfd this
        // value owns, verified just now.
        unsafe {
            libc::write(
                fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        true
    }

    /// The eventfd's number (unverified; for display).
    pub fn fd(&self) -> RawFd {
        self.fd.raw()
    }

    /// The eventfd's identity, to poll for POLLIN; [`Poller::wait`] drains it.
    pub fn ident(&self) -> Ident {
        self.fd.ident()
    }

    /// Whether its eventfd is still the one opened.
    pub fn is_intact(&self) -> bool {
        self.fd.is_intact()
    }
}

/// A non-blocking, close-on-exec eventfd with counter 0. Non-blocking because
/// [`Poller::wait`] drains it with a read that must never block.
fn new_eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd has no memory-safety preconditions.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by eventfd, is valid, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

// ---- Poller ----

/// Why [`Poller::add`] refused a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddError {
    /// The poller already holds [`POLLER_CAPACITY`] sources.
    Full,
    /// This fd is already in the set.
    Duplicate,
    /// The fd is negative.
    BadFd,
}

impl fmt::Display for AddError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddError::Full => "poller is full",
            AddError::Duplicate => "fd already in the poller",
            AddError::BadFd => "negative fd",
        })
    }
}

impl std::error::Error for AddError {}

/// A fixed-capacity poll set over up to [`POLLER_CAPACITY`] pressure sources. Nothing in it
/// allocates. Several sources may share a signal (two cgroup triggers, say).
///
/// It holds the sources' identities, not the sources: a source that fires is verified (see
/// `sys::fd`) before it is drained, and one that no longer is what was added (dropped, or
/// closed by the program and its number reused) is reported broken, never read. Remove a
/// source before dropping it all the same.
pub struct Poller {
    fds: [libc::pollfd; POLLER_CAPACITY],
    idents: [Option<Ident>; POLLER_CAPACITY],
    signals: [Signal; POLLER_CAPACITY],
    len: usize,
}

impl Poller {
    /// An empty set.
    pub fn new() -> Poller {
        Poller {
            fds: [libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }; POLLER_CAPACITY],
            idents: [None; POLLER_CAPACITY],
            signals: [Signal::Wake; POLLER_CAPACITY],
            len: 0,
        }
    }

    /// Adds a source: PSI trigger fds ([`Signal::PsiSystem`], [`Signal::PsiCgroup`]) are
    /// polled for POLLPRI, all others are eventfds polled for POLLIN and drained when they fire.
    ///
    /// # Errors
    /// [`AddError`]; the set is unchanged.
    pub fn add(&mut self, source: Ident, signal: Signal) -> Result<(), AddError> {
        let fd = source.fd();
        if fd < 0 {
            return Err(AddError::BadFd);
        }
        if self.fds[..self.len].iter().any(|p| p.fd == fd) {
            return Err(AddError::Duplicate);
        }
        if self.len == POLLER_CAPACITY {
            return Err(AddError::Full);
        }
        self.fds[self.len] = libc::pollfd {
            fd,
            events: if signal.is_eventfd() {
                libc::POLLIN
            } else {
                // A PSI fd is always readable (it shows the averages); only POLLPRI means a
                // trigger event.
                libc::POLLPRI
            },
            revents: 0,
        };
        self.idents[self.len] = Some(source);
        self.signals[self.len] = signal;
        self.len += 1;
        Ok(())
    }

    /// Removes every source of `signal`; returns how many there were.
    pub fn remove(&mut self, signal: Signal) -> usize {
        let mut removed = 0;
        let mut i = 0;
        while i < self.len {
            if self.signals[i] == signal {
                self.remove_at(i);
                removed += 1;
            } else {
                i += 1;
            }
        }
        removed
    }

    /// Removes the source with descriptor `fd`; returns whether it was there.
    pub fn remove_fd(&mut self, fd: RawFd) -> bool {
        match self.fds[..self.len].iter().position(|p| p.fd == fd) {
            Some(i) => {
                self.remove_at(i);
                true
            }
            None => false,
        }
    }

    /// Number of sources.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no sources (a wait then only times out).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the order of the others, so that signals are reported the same way every time.
    fn remove_at(&mut self, i: usize) {
        self.fds.copy_within(i + 1..self.len, i);
        self.idents.copy_within(i + 1..self.len, i);
        self.signals.copy_within(i + 1..self.len, i);
        self.len -= 1;
    }

    /// Verifies every source (see `sys::fd`): those that are no longer what was added are
    /// removed and returned, as [`Ready::broken`] would report them. One fstat(2) per source.
    pub fn check(&mut self) -> Signals {
        let mut broken = Signals::empty();
        let mut i = 0;
        while i < self.len {
            if self.idents[i].is_some_and(|id| id.verify()) {
                i += 1;
            } else {
                super::fd::count_lost();
                broken.insert(self.signals[i]);
                self.remove_at(i);
            }
        }
        broken
    }

    /// Waits up to `timeout` (`None`: forever; rounded up to whole milliseconds) for any source
    /// and returns what fired. Eventfds that fired are drained, so the same event does not fire
    /// again. Sources that report POLLERR, POLLHUP or POLLNVAL are removed from the set and
    /// reported in [`Ready::broken`], never as fired. An interrupted wait (EINTR) and a timeout
    /// both return an empty [`Ready`]. An empty set with `None` waits until a signal
    /// interrupts it. No allocation: one poll(2) plus one read(2) per eventfd that fired.
    ///
    /// # Errors
    /// The errno of poll(2) other than EINTR (EFAULT, ENOMEM).
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<Ready> {
        let ms = match timeout {
            None => -1,
            Some(d) => d
                .as_nanos()
                .div_ceil(1_000_000)
                .min(libc::c_int::MAX as u128) as libc::c_int,
        };
        for p in &mut self.fds[..self.len] {
            p.revents = 0;
        }
        // SAFETY: the first `len` entries of `fds` are initialised pollfds, and `fds` is
        // borrowed mutably for the call.
        let rc = unsafe { libc::poll(self.fds.as_mut_ptr(), self.len as libc::nfds_t, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EINTR) {
                Ok(Ready::default())
            } else {
                Err(e)
            };
        }
        let mut ready = Ready::default();
        if rc == 0 {
            return Ok(ready);
        }
        let mut i = 0;
        while i < self.len {
            let p = self.fds[i];
            let signal = self.signals[i];
            if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                // A removed cgroup's PSI file reports POLLERR|POLLPRI: broken, not pressure.
                // POLLNVAL: the descriptor was closed under us.
                ready.broken.insert(signal);
                self.remove_at(i);
                continue;
            }
            if p.revents & p.events != 0 {
                // A descriptor the program put at this number (closefrom, then open) is never
                // read: what fired is not ours.
                if !self.idents[i].is_some_and(|id| id.verify()) {
                    super::fd::count_lost();
                    ready.broken.insert(signal);
                    self.remove_at(i);
                    continue;
                }
                if signal.is_eventfd() {
                    // SAFETY: verified just above to be the eventfd that was added.
                    read_eventfd(unsafe { BorrowedFd::borrow_raw(p.fd) });
                }
                ready.fired.insert(signal);
            }
            i += 1;
        }
        Ok(ready)
    }
}

impl Default for Poller {
    fn default() -> Poller {
        Poller::new()
    }
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries((0..self.len).map(|i| (self.fds[i].fd, self.signals[i])))
            .finish()
    }
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

// ---- Headroom ----

/// How many bytes a memory cgroup can still charge before reclaim starts, for a loop that asks
/// often: holds the control files open, so [`Headroom::bytes`] is one pread(2) of the usage
/// file (about 20 bytes) into a stack buffer, no allocation, no path lookup; a few
/// microseconds. The ceiling (`min(limit, memory.high)`) is read at creation and by
/// [`Headroom::refresh_ceiling`]. [`MemCgroup::headroom`] is the one-shot version.
///
/// On v1, usage includes per-CPU charge caches, so it is exact only to some hundreds of KiB.
#[derive(Debug)]
pub struct Headroom {
    usage: GuestFd,
    limit: GuestFd,
    high: Option<GuestFd>,
    version: Version,
    ceiling: u64,
}

impl Headroom {
    /// A reader for `cg`, or `None` when it has neither a limit nor (v2) `memory.high`.
    ///
    /// # Errors
    /// Opening or reading the control files.
    pub fn new(cg: &MemCgroup) -> io::Result<Option<Headroom>> {
        let open = |name: &str| {
            let path = cg.file(name);
            let file = File::open(&path)
                .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
            GuestFd::adopt(file.into(), Inherit::Private)
        };
        let (usage, limit, high) = match cg.version() {
            Version::V1 => (
                open("memory.usage_in_bytes")?,
                open("memory.limit_in_bytes")?,
                None,
            ),
            Version::V2 => (
                open("memory.current")?,
                open("memory.max")?,
                Some(open("memory.high")?),
            ),
        };
        let mut headroom = Headroom {
            usage,
            limit,
            high,
            version: cg.version(),
            ceiling: u64::MAX,
        };
        headroom.refresh_ceiling()?;
        Ok((headroom.ceiling != u64::MAX).then_some(headroom))
    }

    /// Re-reads the limit (and `memory.high`); two preads, no allocation. Returns the ceiling,
    /// `u64::MAX` if both became unlimited.
    ///
    /// # Errors
    /// Reading the files (ENODEV once the cgroup is removed).
    pub fn refresh_ceiling(&mut self) -> io::Result<u64> {
        let limit = read_limit(&self.limit, self.version)?;
        let high = match &self.high {
            Some(f) => read_limit(f, self.version)?,
            None => u64::MAX,
        };
        self.ceiling = limit.min(high);
        Ok(self.ceiling)
    }

    /// The ceiling in bytes as last read.
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// Whether its descriptors are still the ones opened.
    pub fn is_intact(&self) -> bool {
        self.usage.is_intact()
            && self.limit.is_intact()
            && self.high.as_ref().is_none_or(GuestFd::is_intact)
    }

    /// Bytes charged to the cgroup now; one pread.
    ///
    /// # Errors
    /// Reading the file (ENODEV once the cgroup is removed).
    pub fn usage(&self) -> io::Result<u64> {
        read_number(&self.usage)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "usage file is not a number"))
    }

    /// `ceiling - usage`, 0 when over; one pread.
    ///
    /// # Errors
    /// As [`Headroom::usage`].
    pub fn bytes(&self) -> io::Result<u64> {
        Ok(self.ceiling.saturating_sub(self.usage()?))
    }
}

/// A limit file: `u64::MAX` for unlimited ("max" on v2, the huge page-rounded number on v1).
fn read_limit(file: &GuestFd, version: Version) -> io::Result<u64> {
    match (read_number(file)?, version) {
        (None, _) => Ok(u64::MAX),
        (Some(v), Version::V1) if v >= super::cgroup::V1_UNLIMITED => Ok(u64::MAX),
        (Some(v), _) => Ok(v),
    }
}

/// Reads a small control file from offset 0 into a stack buffer: the number it holds, or
/// `None` if it holds a word ("max"). Reading at offset 0 regenerates a cgroup file's content.
/// The descriptor must still be vrange's (see `sys::fd`): EBADF otherwise, nothing read.
fn read_number(file: &GuestFd) -> io::Result<Option<u64>> {
    let fd = file
        .get()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
    let mut buf = [0u8; 32];
    let n = pread(fd, &mut buf)?;
    Ok(parse_number(&buf[..n]))
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

fn parse_number(bytes: &[u8]) -> Option<u64> {
    // Not `trim_ascii`: the crate's minimum Rust (1.75) predates it.
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace());
    let digits = match (start, end) {
        (Some(s), Some(e)) => &bytes[s..=e],
        _ => return None,
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unprivileged_windows_round_up_to_two_seconds() {
        assert_eq!(psi_window_for(0, false), 2_000_000);
        assert_eq!(psi_window_for(1, false), 2_000_000);
        assert_eq!(psi_window_for(500_000, false), 2_000_000);
        assert_eq!(psi_window_for(2_000_000, false), 2_000_000);
        assert_eq!(psi_window_for(2_000_001, false), 4_000_000);
        assert_eq!(psi_window_for(9_000_000, false), 10_000_000);
        assert_eq!(psi_window_for(u64::MAX, false), 10_000_000);
    }

    #[test]
    fn privileged_windows_are_clamped() {
        assert_eq!(psi_window_for(0, true), 500_000);
        assert_eq!(psi_window_for(750_000, true), 750_000);
        assert_eq!(psi_window_for(11_000_000, true), 10_000_000);
    }

    #[test]
    fn every_rounded_window_passes_the_check() {
        for req in [
            0,
            1,
            999_999,
            2_000_000,
            3_000_000,
            7_777_777,
            10_000_000,
            u64::MAX,
        ] {
            for privileged in [false, true] {
                let w = psi_window_for(req, privileged);
                assert_eq!(
                    check_trigger(1, w, privileged),
                    Ok(()),
                    "{req} {privileged}"
                );
            }
        }
    }

    #[test]
    fn trigger_checks_match_the_kernel() {
        assert!(check_trigger(150_000, 2_000_000, false).is_ok());
        assert!(check_trigger(2_000_000, 2_000_000, false).is_ok());
        assert!(check_trigger(150_000, 1_000_000, false).is_err());
        assert!(check_trigger(150_000, 1_000_000, true).is_ok());
        assert!(check_trigger(150_000, 3_000_000, false).is_err());
        assert!(check_trigger(150_000, 12_000_000, true).is_err());
        assert!(check_trigger(0, 2_000_000, false).is_err());
        assert!(check_trigger(2_000_001, 2_000_000, false).is_err());
        assert!(check_trigger(1, 0, true).is_err());
    }

    #[test]
    fn trigger_text_ends_in_nul() {
        let mut buf = [0u8; 32];
        let n = trigger_text(&mut buf, 150_000, 2_000_000, false);
        assert_eq!(&buf[..n], b"some 150000 2000000\0");
        let n = trigger_text(&mut buf, 10_000_000, 10_000_000, true);
        assert_eq!(&buf[..n], b"full 10000000 10000000\0");
    }

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

    #[test]
    fn numbers_parse_like_cgroup_files() {
        assert_eq!(parse_number(b"24621056\n"), Some(24_621_056));
        assert_eq!(parse_number(b"max\n"), None);
        assert_eq!(parse_number(b""), None);
        assert_eq!(parse_number(b"99999999999999999999999\n"), None);
    }

    #[test]
    fn poller_bookkeeping() {
        let mut p = Poller::new();
        assert_eq!(p.add(Ident::fake(-1), Signal::Wake), Err(AddError::BadFd));
        for fd in 100..100 + POLLER_CAPACITY as RawFd {
            let signal = if fd % 2 == 0 {
                Signal::PsiCgroup
            } else {
                Signal::Wake
            };
            p.add(Ident::fake(fd), signal).unwrap();
        }
        assert_eq!(
            p.add(Ident::fake(100), Signal::Wake),
            Err(AddError::Duplicate)
        );
        assert_eq!(p.add(Ident::fake(1000), Signal::Wake), Err(AddError::Full));
        assert_eq!(p.remove(Signal::PsiCgroup), POLLER_CAPACITY / 2);
        assert_eq!(p.len(), POLLER_CAPACITY / 2);
        assert!(p.fds[..p.len].iter().all(|f| f.fd % 2 == 1));
        assert!(p.remove_fd(101));
        assert!(!p.remove_fd(101));
        assert_eq!(p.len(), POLLER_CAPACITY / 2 - 1);
    }
}
