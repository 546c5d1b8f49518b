//! The machine as /proc describes it: boot time (/proc/stat), load (/proc/loadavg), processor
//! (/proc/cpuinfo) and kernel release (/proc/sys/kernel/osrelease).

use super::malformed;
use std::io;

/// When the machine booted, in seconds since the epoch (`btime` of /proc/stat).
///
/// # Errors
/// The errno of reading /proc/stat; `InvalidData` without a `btime` line.
pub fn boot_time() -> io::Result<u64> {
    parse_boot_time(&crate::fd::read_file("/proc/stat")?)
        .ok_or_else(|| malformed("/proc/stat: no btime line"))
}

/// The `btime` line of /proc/stat text.
pub fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// /proc/loadavg: run-queue length averaged over 1, 5 and 15 minutes, and the scheduling
/// entities now.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct LoadAvg {
    /// Over the last minute.
    pub one: f64,
    /// Over the last 5 minutes.
    pub five: f64,
    /// Over the last 15 minutes.
    pub fifteen: f64,
    /// Runnable now.
    pub runnable: u32,
    /// Existing now (threads, machine-wide).
    pub total: u32,
}

/// The machine's load now.
///
/// # Errors
/// The errno of reading /proc/loadavg; `InvalidData` for text that does not parse.
pub fn loadavg() -> io::Result<LoadAvg> {
    parse_loadavg(&crate::fd::read_file("/proc/loadavg")?).ok_or_else(|| malformed("/proc/loadavg"))
}

/// Parses /proc/loadavg text ("0.52 0.58 0.59 1/234 5678").
pub fn parse_loadavg(text: &str) -> Option<LoadAvg> {
    let mut words = text.split_whitespace();
    let (one, five, fifteen) = (
        words.next()?.parse().ok()?,
        words.next()?.parse().ok()?,
        words.next()?.parse().ok()?,
    );
    let (runnable, total) = words.next()?.split_once('/')?;
    Some(LoadAvg {
        one,
        five,
        fifteen,
        runnable: runnable.parse().ok()?,
        total: total.parse().ok()?,
    })
}

/// The processor's name (`model name` of /proc/cpuinfo), or `None` where the architecture's
/// cpuinfo has no such line (arm64).
///
/// # Errors
/// The errno of reading /proc/cpuinfo.
pub fn cpu_model() -> io::Result<Option<String>> {
    Ok(parse_cpu_model(&crate::fd::read_file("/proc/cpuinfo")?))
}

/// The first `model name` of /proc/cpuinfo text.
pub fn parse_cpu_model(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// The pid most recently given out in this process's pid namespace
/// (/proc/sys/kernel/ns_last_pid): the next new process most likely gets the one after.
///
/// # Errors
/// The errno of reading the file; `InvalidData` for text that is not a number.
pub fn last_pid() -> io::Result<u32> {
    crate::fd::read_file("/proc/sys/kernel/ns_last_pid")?
        .trim()
        .parse()
        .map_err(|_| malformed("ns_last_pid"))
}

/// A kernel's major and minor version: 6.18 of release "6.18.0-1-amd64".
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

/// The running kernel's release, as `uname -r` prints it ("6.18.0-1-amd64").
///
/// # Errors
/// The errno of reading /proc/sys/kernel/osrelease.
pub fn kernel_release() -> io::Result<String> {
    Ok(crate::fd::read_file("/proc/sys/kernel/osrelease")?
        .trim()
        .to_string())
}

/// The running kernel's version, for a rule that changed in a known release.
///
/// # Errors
/// As [`kernel_release`]; `InvalidData` for a release that does not start "MAJOR.MINOR".
pub fn kernel_version() -> io::Result<KernelVersion> {
    parse_kernel_version(&kernel_release()?).ok_or_else(|| malformed("kernel release"))
}

/// The version at the start of a kernel release.
pub fn parse_kernel_version(release: &str) -> Option<KernelVersion> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    Some(KernelVersion {
        major: parts.next()?.parse().ok()?,
        minor: parts.next()?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_line() {
        let text = "cpu  10132153 290696 3084719 46828483 16683 0 25195 0 0 0\n\
                    intr 1462898 0 9 0\nctxt 2476187\nbtime 1700000000\nprocesses 12345\n";
        assert_eq!(parse_boot_time(text), Some(1_700_000_000));
        assert_eq!(parse_boot_time("cpu 1 2\n"), None);
    }

    #[test]
    fn loadavg_text() {
        assert_eq!(
            parse_loadavg("0.52 0.58 1.59 3/234 5678\n"),
            Some(LoadAvg {
                one: 0.52,
                five: 0.58,
                fifteen: 1.59,
                runnable: 3,
                total: 234,
            })
        );
        assert_eq!(parse_loadavg("0.52 0.58\n"), None);
    }

    #[test]
    fn cpu_model_line() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\
                    model\t\t: 85\nmodel name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\n";
        assert_eq!(
            parse_cpu_model(text).as_deref(),
            Some("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz")
        );
        assert_eq!(parse_cpu_model("processor\t: 0\nBogoMIPS\t: 50.00\n"), None);
    }

    #[test]
    fn kernel_versions() {
        let v = |major, minor| Some(KernelVersion { major, minor });
        assert_eq!(parse_kernel_version("6.18.0-1-amd64\n"), v(6, 18));
        assert_eq!(parse_kernel_version("6.1-rc3"), v(6, 1));
        assert_eq!(parse_kernel_version("6"), None);
        assert!(v(6, 4) > v(5, 19) && v(6, 10) > v(6, 9));
    }

    #[test]
    fn real_machine() {
        assert!(boot_time().unwrap() > 1_000_000_000);
        let load = loadavg().unwrap();
        assert!(load.total >= 1 && load.one >= 0.0, "{load:?}");
        cpu_model().unwrap();
        // uname(2) reports the same release.
        // SAFETY: all-zero bytes are a valid utsname, which uname fills.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: u is a valid out-parameter.
        assert_eq!(unsafe { libc::uname(&mut u) }, 0);
        // SAFETY: uname NUL-terminates release.
        let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
        assert_eq!(kernel_release().unwrap(), release.to_str().unwrap());
        assert!(kernel_version().unwrap().major >= 3);
        let before = last_pid().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        // Other processes may take pids meanwhile, and pids wrap at pid_max.
        let after = last_pid().unwrap();
        let id = child.id();
        assert!(
            after >= id || after < before,
            "{before}, then {id}, then {after}"
        );
    }
}
