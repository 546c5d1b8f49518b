//! Reading /proc/self (and /proc/PID) status, smaps and /proc/meminfo for memory reporting
//! and tests.
//!
//! Never use it on a hot path or from a signal handler: it reads whole files into freshly
//! allocated strings.

use std::io;

/// Memory counters of one VMA, or summed over several, in KiB, as smaps reports them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Smaps {
    /// Virtual size (`Size`); zero when read from smaps_rollup, which has no such line.
    pub size_kb: u64,
    /// Resident (`Rss`).
    pub rss_kb: u64,
    /// `Private_Dirty`.
    pub private_dirty_kb: u64,
    /// `Private_Clean`.
    pub private_clean_kb: u64,
    /// Pages freed with MADV_FREE that the kernel has not reclaimed yet (`LazyFree`).
    pub lazy_free_kb: u64,
    /// `AnonHugePages`.
    pub anon_huge_kb: u64,
    /// `Swap`.
    pub swap_kb: u64,
}

impl Smaps {
    fn accumulate(&mut self, other: &Smaps) {
        self.size_kb += other.size_kb;
        self.rss_kb += other.rss_kb;
        self.private_dirty_kb += other.private_dirty_kb;
        self.private_clean_kb += other.private_clean_kb;
        self.lazy_free_kb += other.lazy_free_kb;
        self.anon_huge_kb += other.anon_huge_kb;
        self.swap_kb += other.swap_kb;
    }
}

/// The smaps counters of the VMA of this process that contains `addr`, or `None` if no VMA
/// contains it.
pub fn smaps_of(addr: usize) -> io::Result<Option<Smaps>> {
    let text = crate::fd::read_file("/proc/self/smaps")?;
    Ok(vma_blocks(&text)
        .into_iter()
        .find(|b| b.start <= addr && addr < b.end)
        .map(|b| parse_smaps_block(b.text)))
}

/// The smaps counters summed over every VMA of this process that overlaps
/// `[start, start + len)`.
///
/// A VMA that lies partly outside the range counts whole: smaps has no finer granularity.
pub fn smaps_range(start: usize, len: usize) -> io::Result<Smaps> {
    let end = start.saturating_add(len);
    let text = crate::fd::read_file("/proc/self/smaps")?;
    let mut sum = Smaps::default();
    for b in vma_blocks(&text) {
        if b.start < end && start < b.end {
            sum.accumulate(&parse_smaps_block(b.text));
        }
    }
    Ok(sum)
}

/// Each VMA of process `pid` (this process if `None`): its start, end and counters, from
/// /proc/PID/smaps. Each VMA is read under the kernel's lock for it; `smaps_rollup` sums in
/// one pass that drops that lock when a writer waits, and some kernels then miss a VMA.
pub fn smaps_vmas(pid: Option<i32>) -> io::Result<Vec<(usize, usize, Smaps)>> {
    let text = crate::fd::read_file(proc_path(pid, "smaps"))?;
    Ok(vma_blocks(&text)
        .into_iter()
        .map(|b| (b.start, b.end, parse_smaps_block(b.text)))
        .collect())
}

/// The counters of the whole address space of process `pid` (this process if `None`), from
/// smaps_rollup; `size_kb` is zero there.
pub fn smaps_rollup(pid: Option<i32>) -> io::Result<Smaps> {
    Ok(parse_smaps_block(&crate::fd::read_file(proc_path(
        pid,
        "smaps_rollup",
    ))?))
}

/// Memory lines of /proc/PID/status, in KiB.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// `VmRSS`.
    pub vm_rss_kb: u64,
    /// Peak resident size (`VmHWM`).
    pub vm_hwm_kb: u64,
    /// Page-table size (`VmPTE`).
    pub vm_pte_kb: u64,
    /// `VmSwap`.
    pub vm_swap_kb: u64,
    /// `RssAnon`.
    pub rss_anon_kb: u64,
}

/// The memory lines of /proc/PID/status of process `pid` (this process if `None`). Kernel
/// threads have none, which reads as all zeros.
pub fn status(pid: Option<i32>) -> io::Result<Status> {
    Ok(parse_status(&crate::fd::read_file(proc_path(
        pid, "status",
    ))?))
}

/// The effective user id of process `pid` (the second number of the `Uid:` line of
/// /proc/PID/status), or `None` if there is no such process.
pub fn euid_of(pid: u32) -> Option<u32> {
    let text = crate::fd::read_file(format!("/proc/{pid}/status")).ok()?;
    let ids = text.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    ids.split_whitespace().nth(1)?.parse().ok()
}

/// When process `pid` (this process for `None`) started, in clock ticks after boot (field 22
/// of /proc/PID/stat): with the pid, it names one process even after pids are reused.
pub fn start_ticks(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let text = crate::fd::read_file(path).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The value of line `field` (without its colon, e.g. "MemAvailable") of /proc/meminfo, or
/// `None` if the kernel has no such line. The unit is KiB except for the `HugePages_` counts.
pub fn meminfo_kb(field: &str) -> io::Result<Option<u64>> {
    let text = crate::fd::read_file("/proc/meminfo")?;
    Ok(text
        .lines()
        .filter_map(field_line)
        .find(|&(name, _)| name == field)
        .map(|(_, v)| v))
}

/// MemTotal and MemAvailable of /proc/meminfo in KiB, from one read (`None` before Linux 3.14,
/// which has no MemAvailable).
pub fn mem_available_kb() -> io::Result<Option<(u64, u64)>> {
    let text = crate::fd::read_file("/proc/meminfo")?;
    let (mut total, mut avail) = (None, None);
    for (name, v) in text.lines().filter_map(field_line) {
        match name {
            "MemTotal" => total = Some(v),
            "MemAvailable" => avail = Some(v),
            _ => {}
        }
    }
    Ok(total.zip(avail))
}

/// Parses the field lines of one smaps block, or of smaps_rollup; header lines are skipped and
/// unknown fields ignored.
pub fn parse_smaps_block(text: &str) -> Smaps {
    let mut s = Smaps::default();
    for (name, v) in text.lines().filter_map(field_line) {
        let slot = match name {
            "Size" => &mut s.size_kb,
            "Rss" => &mut s.rss_kb,
            "Private_Dirty" => &mut s.private_dirty_kb,
            "Private_Clean" => &mut s.private_clean_kb,
            "LazyFree" => &mut s.lazy_free_kb,
            "AnonHugePages" => &mut s.anon_huge_kb,
            "Swap" => &mut s.swap_kb,
            _ => continue,
        };
        *slot += v;
    }
    s
}

/// Parses the memory lines of /proc/PID/status text; missing lines read as zero.
pub fn parse_status(text: &str) -> Status {
    let mut s = Status::default();
    for (name, v) in text.lines().filter_map(field_line) {
        let slot = match name {
            "VmRSS" => &mut s.vm_rss_kb,
            "VmHWM" => &mut s.vm_hwm_kb,
            "VmPTE" => &mut s.vm_pte_kb,
            "VmSwap" => &mut s.vm_swap_kb,
            "RssAnon" => &mut s.rss_anon_kb,
            _ => continue,
        };
        *slot = v;
    }
    s
}

fn proc_path(pid: Option<i32>, name: &str) -> String {
    match pid {
        Some(pid) => format!("/proc/{pid}/{name}"),
        None => format!("/proc/self/{name}"),
    }
}

/// A "Name:   123 kB" line as its name and number; `None` for headers and for lines whose
/// value is not a number ("VmFlags: rd wr").
fn field_line(line: &str) -> Option<(&str, u64)> {
    let (name, rest) = line.split_once(':')?;
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name.trim(), value))
}

/// One VMA's part of /proc/PID/smaps: its address range and its text, header included.
#[derive(Debug, PartialEq, Eq)]
struct VmaBlock<'a> {
    start: usize,
    end: usize,
    text: &'a str,
}

/// Splits smaps text at its header lines (`7f12a000-7f12c000 rw-p 00000000 00:00 0 [heap]`).
fn vma_blocks(text: &str) -> Vec<VmaBlock<'_>> {
    let mut blocks: Vec<VmaBlock<'_>> = Vec::new();
    let mut block_start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if let Some((start, end)) = vma_header(line) {
            if let Some(last) = blocks.last_mut() {
                last.text = &text[block_start..offset];
            }
            blocks.push(VmaBlock {
                start,
                end,
                text: "",
            });
            block_start = offset;
        }
        offset += line.len();
    }
    if let Some(last) = blocks.last_mut() {
        last.text = &text[block_start..];
    }
    blocks
}

/// The address range of an smaps header line; `None` for field lines.
fn vma_header(line: &str) -> Option<(usize, usize)> {
    let mut words = line.split_whitespace();
    let (start, end) = words.next()?.split_once('-')?;
    // The permissions word ("rw-p") tells a header from any stray hex-looking line.
    if words.next()?.len() != 4 {
        return None;
    }
    Some((
        usize::from_str_radix(start, 16).ok()?,
        usize::from_str_radix(end, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55de57207000-55de57209000 r--p 00000000 fe:00 247278                     /usr/bin/head
Size:                  8 kB
Rss:                   8 kB
Private_Clean:         8 kB
Private_Dirty:         0 kB
LazyFree:              0 kB
THPeligible:           0
VmFlags: rd mr mw me
7f12a000-7f12c000 rw-p 00000000 00:00 0   [heap]
Size:                  8 kB
KernelPageSize:        4 kB
Rss:                   4 kB
Private_Clean:         0 kB
Private_Dirty:         4 kB
LazyFree:              4 kB
AnonHugePages:      2048 kB
Swap:                 12 kB
VmFlags: rd wr mr mw me ac
";

    #[test]
    fn smaps_block_fields() {
        let blocks = vma_blocks(SMAPS);
        assert_eq!(blocks.len(), 2);
        assert_eq!((blocks[1].start, blocks[1].end), (0x7f12a000, 0x7f12c000));
        assert!(blocks[1].text.starts_with("7f12a000-"));
        assert!(blocks[0].text.ends_with("VmFlags: rd mr mw me\n"));
        assert_eq!(
            parse_smaps_block(blocks[1].text),
            Smaps {
                size_kb: 8,
                rss_kb: 4,
                private_dirty_kb: 4,
                private_clean_kb: 0,
                lazy_free_kb: 4,
                anon_huge_kb: 2048,
                swap_kb: 12,
            }
        );
        assert_eq!(parse_smaps_block(blocks[0].text).private_clean_kb, 8);
    }

    #[test]
    fn smaps_rollup_text() {
        let text = "55d430bad000-7ffebb616000 ---p 00000000 00:00 0      [rollup]\n\
                    Rss:                1724 kB\n\
                    Pss:                 630 kB\n\
                    LazyFree:             16 kB\n";
        let s = parse_smaps_block(text);
        assert_eq!((s.size_kb, s.rss_kb, s.lazy_free_kb), (0, 1724, 16));
    }

    #[test]
    fn no_blocks_in_empty_text() {
        assert!(vma_blocks("").is_empty());
    }

    #[test]
    fn status_fields() {
        let text = "Name:\tcat\nVmHWM:\t    1000 kB\nVmRSS:\t     900 kB\n\
                    RssAnon:\t     100 kB\nRssFile:\t     800 kB\n\
                    VmPTE:\t      48 kB\nVmSwap:\t       0 kB\nThreads:\t1\n";
        assert_eq!(
            parse_status(text),
            Status {
                vm_rss_kb: 900,
                vm_hwm_kb: 1000,
                vm_pte_kb: 48,
                vm_swap_kb: 0,
                rss_anon_kb: 100,
            }
        );
    }

    #[test]
    fn real_status_and_meminfo() {
        assert!(status(None).unwrap().vm_rss_kb > 0);
        assert!(meminfo_kb("MemTotal").unwrap().unwrap() > 0);
        assert_eq!(meminfo_kb("NoSuchField").unwrap(), None);
        let (total, avail) = mem_available_kb().unwrap().unwrap();
        assert!(avail <= total && total > 0);
        assert!(smaps_rollup(None).unwrap().rss_kb > 0);
    }

    #[test]
    fn real_mapping_rss_then_lazy_free() {
        const LEN: usize = 4 << 20;
        // SAFETY: a fresh private anonymous mapping at an address the kernel picks cannot alias
        // any existing Rust object; the result is checked against MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: ptr is the start of the LEN-byte writable mapping checked just above.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0xa5, LEN) };

        let addr = ptr as usize;
        let before = smaps_of(addr).unwrap().expect("VMA of the mapping");
        assert!(before.rss_kb >= 4096, "{before:?}");
        assert!(smaps_range(addr, LEN).unwrap().rss_kb >= 4096);
        let by_pid = smaps_vmas(Some(std::process::id() as i32)).unwrap();
        let (_, _, vma) = by_pid
            .iter()
            .find(|(start, end, _)| *start <= addr && addr < *end)
            .expect("the mapping among this process's VMAs");
        assert!(vma.rss_kb >= 4096, "{vma:?}");

        // MADV_FREE queues the pages on the per-CPU batch of the CPU the thread runs on: a
        // thread that migrates in the middle (a busy machine) leaves two partial batches
        // pending, not one.
        crate::mem::pin_thread_to_current_cpu().expect("pin to a CPU");
        // SAFETY: the range is exactly the mapping made above; MADV_FREE only lets the kernel
        // drop its contents, which this test never reads again.
        let rc = unsafe { libc::madvise(ptr, LEN, libc::MADV_FREE) };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        let after = smaps_of(addr).unwrap().expect("VMA of the mapping");

        // SAFETY: unmaps exactly the mapping made above; no reference into it outlives this.
        let rc = unsafe { libc::munmap(ptr, LEN) };
        assert_eq!(rc, 0);
        // LazyFree counts a page once it leaves the per-CPU LRU batch (PAGEVEC_SIZE = 31
        // folios) that MADV_FREE queues it on; the last partial batch may still be pending.
        // SAFETY: sysconf only reads a configuration value.
        let page_kb = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64 / 1024;
        assert!(after.lazy_free_kb + 31 * page_kb >= 4096, "{after:?}");
        assert!(
            after.rss_kb >= 4096 && after.private_dirty_kb == 0,
            "{after:?}"
        );
    }
}
