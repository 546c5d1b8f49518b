//! Kernel counters only tests and benchmarks read. The library's own `/proc` readers are
//! `vrange_sys::procfs`.

use vrange_sys::procfs;

/// A counter of /proc/vmstat (system-wide), such as `pglazyfreed`.
pub fn vmstat(name: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The Rss and LazyFree KiB of a process (zeros once it is gone).
pub fn rss_lazy_kb(pid: i32) -> (u64, u64) {
    procfs::smaps_rollup(Some(pid)).map_or((0, 0), |s| (s.rss_kb, s.lazy_free_kb))
}

/// A process's peak resident size in KiB (`VmHWM` in /proc/PID/status; 0 once it is gone).
pub fn peak_rss_kb(pid: i32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// This process's (minor, major) page faults so far.
pub fn page_faults() -> (u64, u64) {
    let f = vrange_sys::process::page_faults();
    (f.minor, f.major)
}

/// LazyFree KiB of the mapping of this process containing `ptr`.
pub fn lazy_free_kb(ptr: *const u8) -> u64 {
    procfs::smaps_of(ptr as usize)
        .unwrap()
        .expect("mapped")
        .lazy_free_kb
}

/// The running kernel's version, major and minor (`/proc/sys/kernel/osrelease`), for tests of a
/// rule that changed in a known release; `(0, 0)` if unreadable.
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}
