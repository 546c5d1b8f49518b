//! Kernel counters as tests and benchmarks want them: thin calls into `vrange_sys::procfs`
//! (which parses every /proc file), reading a process that is gone as zeros.

use vrange_sys::procfs;

/// A counter of /proc/vmstat (system-wide), such as `pglazyfreed`.
pub fn vmstat(name: &str) -> Option<u64> {
    procfs::vmstat(name).ok().flatten()
}

/// The Rss and LazyFree KiB of a process (zeros once it is gone).
pub fn rss_lazy_kb(pid: i32) -> (u64, u64) {
    procfs::smaps_rollup(Some(pid as u32)).map_or((0, 0), |s| (s.rss_kb, s.lazy_free_kb))
}

/// A process's peak resident size in KiB (`VmHWM`; 0 once it is gone).
pub fn peak_rss_kb(pid: i32) -> u64 {
    procfs::status(Some(pid as u32)).map_or(0, |s| s.vm_hwm_kb)
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

/// The running kernel's version, major and minor, for tests of a rule that changed in a known
/// release; `(0, 0)` if unreadable.
pub fn kernel_version() -> (u32, u32) {
    procfs::kernel_version().map_or((0, 0), |v| (v.major, v.minor))
}
