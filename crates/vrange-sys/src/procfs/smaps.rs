//! /proc/PID/smaps, smaps_rollup and maps: a process's address space, VMA by VMA or summed.

use super::{field_line, read};
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
///
/// # Errors
/// The errno of reading /proc/self/smaps.
pub fn smaps_of(addr: usize) -> io::Result<Option<Smaps>> {
    let text = read(None, "smaps")?;
    Ok(vma_blocks(&text)
        .into_iter()
        .find(|b| b.start <= addr && addr < b.end)
        .map(|b| parse_smaps_block(b.text)))
}

/// The smaps counters summed over every VMA of this process that overlaps
/// `[start, start + len)`.
///
/// A VMA that lies partly outside the range counts whole: smaps has no finer granularity.
///
/// # Errors
/// The errno of reading /proc/self/smaps.
pub fn smaps_range(start: usize, len: usize) -> io::Result<Smaps> {
    let end = start.saturating_add(len);
    let text = read(None, "smaps")?;
    let mut sum = Smaps::default();
    for b in vma_blocks(&text) {
        if b.start < end && start < b.end {
            sum.accumulate(&parse_smaps_block(b.text));
        }
    }
    Ok(sum)
}

/// One VMA of /proc/PID/smaps: its address range and its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmaSmaps {
    /// First address.
    pub start: usize,
    /// One past the last address.
    pub end: usize,
    /// Its counters.
    pub smaps: Smaps,
}

/// Each VMA of process `pid` (this process if `None`), from /proc/PID/smaps. Each VMA is read
/// under the kernel's lock for it; `smaps_rollup` sums in one pass that drops that lock when a
/// writer waits, and some kernels then miss a VMA.
///
/// # Errors
/// As [`smaps_rollup`].
pub fn smaps_vmas(pid: Option<u32>) -> io::Result<Vec<VmaSmaps>> {
    let text = read(pid, "smaps")?;
    Ok(vma_blocks(&text)
        .into_iter()
        .map(|b| VmaSmaps {
            start: b.start,
            end: b.end,
            smaps: parse_smaps_block(b.text),
        })
        .collect())
}

/// The counters of the whole address space of process `pid` (this process if `None`), from
/// smaps_rollup; `size_kb` is zero there.
///
/// # Errors
/// As the module `procfs` says; EACCES when the kernel's ptrace access check (read mode)
/// refuses: smaps_rollup, like smaps, maps and mem, needs the same user or CAP_SYS_PTRACE.
pub fn smaps_rollup(pid: Option<u32>) -> io::Result<Smaps> {
    Ok(parse_smaps_block(&read(pid, "smaps_rollup")?))
}

/// One line of /proc/PID/maps: a mapping's address range and the line as the kernel wrote it
/// (permissions, offset, device, inode, path), for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: usize,
    /// One past the last address.
    pub end: usize,
    /// The whole line, without its newline.
    pub line: String,
}

/// The mappings of process `pid` (this process if `None`), from /proc/PID/maps. What runs in a
/// signal handler or must not allocate asks `vma` instead.
///
/// # Errors
/// As [`smaps_rollup`].
pub fn maps(pid: Option<u32>) -> io::Result<Vec<Mapping>> {
    Ok(parse_maps(&read(pid, "maps")?))
}

/// Parses /proc/PID/maps text; lines that are not mappings are skipped.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let (start, end) = vma_header(line)?;
            Some(Mapping {
                start,
                end,
                line: line.to_string(),
            })
        })
        .collect()
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
    fn maps_lines() {
        let text = "55de57207000-55de57209000 r--p 00000000 fe:00 247278    /usr/bin/head\n\
                    7ffd1c5e9000-7ffd1c60a000 rw-p 00000000 00:00 0        [stack]\n";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 2);
        assert_eq!(
            (maps[1].start, maps[1].end),
            (0x7ffd1c5e9000, 0x7ffd1c60a000)
        );
        assert!(maps[1].line.ends_with("[stack]"));
        assert!(parse_maps("").is_empty());
    }

    #[test]
    fn real_rollup_and_maps() {
        assert!(smaps_rollup(None).unwrap().rss_kb > 0);
        // A function of this program lies in a mapping of its executable.
        let here = real_rollup_and_maps as *const () as usize;
        let own = maps(Some(std::process::id())).unwrap();
        let m = own
            .iter()
            .find(|m| m.start <= here && here < m.end)
            .expect("this function's mapping");
        let perms = m.line.split_whitespace().nth(1).unwrap();
        assert!(perms.contains('x'), "{}", m.line);
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
        let by_pid = smaps_vmas(Some(std::process::id())).unwrap();
        let vma = by_pid
            .iter()
            .find(|v| v.start <= addr && addr < v.end)
            .expect("the mapping among this process's VMAs");
        assert!(vma.smaps.rss_kb >= 4096, "{vma:?}");

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
        // LazyFree counts a page once it leaves the per-CPU LRU batch (31 folios) that
        // MADV_FREE queues it on; the last partial batch may still be pending. And MADV_FREE
        // passes over a folio not on the LRU yet: up to a batch of the pages just faulted in
        // may still wait in the batch of the CPU that faulted them (a busy machine left 32
        // pages out). Two batches, then.
        // SAFETY: sysconf only reads a configuration value.
        let page_kb = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64 / 1024;
        assert!(after.lazy_free_kb + 2 * 31 * page_kb >= 4096, "{after:?}");
        assert!(
            after.rss_kb >= 4096 && after.private_dirty_kb == 0,
            "{after:?}"
        );
    }
}
