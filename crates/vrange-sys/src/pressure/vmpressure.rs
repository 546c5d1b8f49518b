//! cgroup v1 `memory.pressure_level` listeners: an eventfd registered through
//! `cgroup.event_control`.

use super::*;

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

    /// Listens for `level` (and above) of reclaim aimed at `cg` itself ([`Propagation::Local`]):
    /// a descendant that reaches its own limit is reclaimed from its own pages, which purging
    /// memory charged to `cg` does not relieve. Kernels before 4.13 have no modes (EINVAL);
    /// there the listener falls back to [`Propagation::Default`], and descendants' events
    /// unhandled below reach it too.
    ///
    /// # Errors
    /// As [`VmPressure::register`].
    pub fn register_own(cg: &MemCgroup, level: Level) -> io::Result<VmPressure> {
        match VmPressure::register_with(cg, level, Propagation::Local) {
            // EINVAL, as the error's kind (its message names the files).
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => VmPressure::register(cg, level),
            r => r,
        }
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
        let level_file = crate::fd::open_path_buf(&level_path, libc::O_RDONLY)
            .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", level_path.display())))?;
        let level_file = GuestFd::adopt(level_file, Inherit::Private)?;
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
        // cgroup files take one command per write(2).
        crate::fd::write_once(&control, line.as_bytes())
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
