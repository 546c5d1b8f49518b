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

/// This process's (minor, major) page faults so far (getrusage).
pub fn page_faults() -> (u64, u64) {
    // SAFETY: all-zero bytes are a valid `rusage`; getrusage fills the struct it is given.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    (u.ru_minflt as u64, u.ru_majflt as u64)
}

/// LazyFree KiB of the mapping of this process containing `ptr`.
pub fn lazy_free_kb(ptr: *const u8) -> u64 {
    procfs::smaps_of(ptr as usize)
        .unwrap()
        .expect("mapped")
        .lazy_free_kb
}

/// One VMA of a process as `/proc/PID/smaps` reports it: its range and counters.
#[derive(Debug, Clone)]
pub struct Vma {
    pub start: usize,
    pub end: usize,
    pub smaps: procfs::Smaps,
}

/// Every VMA of process `pid` from `/proc/PID/smaps` (empty once it is gone). Summing these
/// reads each VMA under the kernel's lock for it; `smaps_rollup` sums in one pass that drops
/// the lock when a writer waits, and some kernels then miss a VMA.
pub fn vmas(pid: i32) -> Vec<Vma> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out: Vec<(usize, usize, String)> = Vec::new();
    for line in text.lines() {
        let range = line.split_whitespace().next().and_then(|r| {
            let (a, b) = r.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        });
        match (range, out.last_mut()) {
            (Some((start, end)), _) => out.push((start, end, String::new())),
            (None, Some((_, _, block))) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, None) => {}
        }
    }
    out.into_iter()
        .map(|(start, end, block)| Vma {
            start,
            end,
            smaps: procfs::parse_smaps_block(&block),
        })
        .collect()
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
