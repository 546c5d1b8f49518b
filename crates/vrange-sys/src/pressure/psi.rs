//! PSI triggers on `/proc/pressure/memory` and on a v2 cgroup's `memory.pressure` (see the
//! module documentation of `pressure` for the window rule and the trailing NUL).

use super::*;
use crate::unavailable::Unavailable;
use std::path::PathBuf;

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
        // Only ever polled, never read; non-blocking so that a stray read cannot stall.
        let file = crate::fd::open_path_buf(path, libc::O_RDWR | libc::O_NONBLOCK)
            .map(File::from)
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
fn check_trigger(stall_us: u64, window_us: u64, privileged: bool) -> Result<(), Unavailable> {
    let invalid = |reason: String| Unavailable {
        errno: Some(libc::EINVAL),
        reason,
    };
    if window_us == 0 || window_us > PSI_WINDOW_MAX_US {
        return Err(invalid(format!(
            "PSI window {window_us} us is outside 1..={PSI_WINDOW_MAX_US} us"
        )));
    }
    if !privileged && window_us % PSI_UNPRIVILEGED_STEP_US != 0 {
        return Err(invalid(format!(
            "PSI window {window_us} us is not a multiple of 2 s, which the kernel requires \
             without CAP_SYS_RESOURCE (try {} us)",
            psi_window_for(window_us, false)
        )));
    }
    if stall_us == 0 || stall_us > window_us {
        return Err(invalid(format!(
            "PSI stall threshold {stall_us} us is outside 1..={window_us} us (the window)"
        )));
    }
    Ok(())
}

/// One reading of a PSI file's `some` line (`/proc/pressure/memory`, a v2 cgroup's
/// `memory.pressure`): the kernel's ten-second average (percent of wall time at least one task
/// stalled) and the stalled time so far (microseconds, monotonic: two readings give the share
/// of any interval between them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PsiReading {
    pub some_avg10: f64,
    pub some_total_us: u64,
    /// The `full` line's ten-second average (all non-idle tasks stalled at once; 0 where the
    /// file has no such line).
    pub full_avg10: f64,
}

/// The stall file for the tasks of `cg`: its `memory.pressure` on v2; on v1, whose cgroups have
/// none, and for the machine (`None`), `/proc/pressure/memory` (on v1 any task's stall counts:
/// the cautious reading). `None` without PSI.
pub fn stall_file(cg: Option<&crate::cgroup::MemCgroup>) -> Option<PathBuf> {
    cg.and_then(|cg| cg.pressure_file()).or_else(|| {
        let system = PathBuf::from(SYSTEM_PSI_FILE);
        system.exists().then_some(system)
    })
}

impl PsiReading {
    /// Reads `path` (one open, read and close).
    ///
    /// # Errors
    /// The errno of reading; InvalidData when its `some` line lacks `avg10=` or `total=`.
    pub fn read(path: &Path) -> io::Result<PsiReading> {
        let text = crate::fd::read_file(path)?;
        PsiReading::parse(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: no some line with avg10 and total", path.display()),
            )
        })
    }

    /// Parses the text of a PSI file.
    pub fn parse(text: &str) -> Option<PsiReading> {
        let field = |kind: &str, name: &str| {
            let line = text.lines().find(|l| l.split(' ').next() == Some(kind))?;
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        };
        Some(PsiReading {
            some_avg10: field("some", "avg10")?.parse().ok()?,
            some_total_us: field("some", "total")?.parse().ok()?,
            full_avg10: field("full", "avg10").map_or(Some(0.0), |v| v.parse().ok())?,
        })
    }

    /// Percent of the time between `earlier` and this reading, `elapsed` apart, that some task
    /// stalled (0 for no time).
    pub fn some_pct_since(&self, earlier: &PsiReading, elapsed: std::time::Duration) -> f64 {
        let us = elapsed.as_micros() as f64;
        if us <= 0.0 {
            return 0.0;
        }
        let stalled = self.some_total_us.saturating_sub(earlier.some_total_us) as f64;
        (stalled / us * 100.0).min(100.0)
    }
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
}

#[cfg(test)]
mod reading_tests {
    use super::*;

    #[test]
    fn a_psi_file_is_read_for_its_some_line() {
        let text = "some avg10=0.25 avg60=1.00 avg300=0.50 total=3000000\n\
                    full avg10=0.10 avg60=0.00 avg300=0.00 total=1000\n";
        let r = PsiReading::parse(text).unwrap();
        assert_eq!(r.some_avg10, 0.25);
        assert_eq!(r.some_total_us, 3_000_000);
        assert_eq!(r.full_avg10, 0.10);
        let later = PsiReading {
            some_avg10: 0.0,
            some_total_us: 3_010_000,
            full_avg10: 0.0,
        };
        let pct = later.some_pct_since(&r, std::time::Duration::from_secs(1));
        assert!((pct - 1.0).abs() < 1e-9, "{pct}");
        assert_eq!(PsiReading::parse("full avg10=0.00 total=1\n"), None);
        assert_eq!(PsiReading::parse("some avg10=x total=1\n"), None);
    }
}
