//! Which mappings a range lies in, asked of the kernel without allocating.
//!
//! Owns every read of `/proc/self/maps`. Uses the PROCMAP_QUERY ioctl (Linux 6.11) on a cached
//! descriptor, one call per mapping, and falls back to a streaming, byte-at-a-time parse of the
//! file through a stack buffer on older kernels. Everything here is async-signal-safe: only
//! open, read, ioctl and close are called, no allocation, no lock. It must stay that way,
//! because unmarking from a signal handler depends on it.

use super::fd::{self, SelfFile};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// `_IOWR('f', 17, struct procmap_query)` from `<linux/fs.h>`.
const PROCMAP_QUERY: u64 = 0xC068_6611;
const QUERY_VMA_READABLE: u64 = 0x01;
const QUERY_VMA_WRITABLE: u64 = 0x02;
const QUERY_VMA_SHARED: u64 = 0x08;

#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// One mapping, as much of it as vrange needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Vma {
    /// First address.
    pub start: usize,
    /// One past the last address.
    pub end: usize,
    /// Mapped readable.
    pub readable: bool,
    /// Mapped writable.
    pub writable: bool,
    /// MAP_SHARED (includes shared anonymous memory, which is shmem).
    pub shared: bool,
    /// Not backed by a file (no device, no inode).
    pub anonymous: bool,
}

impl Vma {
    /// Whether the kernel purge path can serve this mapping.
    fn is_private_anon_rw(&self) -> bool {
        self.readable && self.writable && !self.shared && self.anonymous
    }
}

/// The `/proc/self/maps` descriptor PROCMAP_QUERY is asked on.
static MAPS: SelfFile = SelfFile::new(c"/proc/self/maps");
/// Set once PROCMAP_QUERY has answered ENOTTY/EINVAL: this kernel lacks it.
static NO_QUERY: AtomicBool = AtomicBool::new(false);

fn open_maps() -> io::Result<OwnedFd> {
    fd::open_path(MAPS.path(), libc::O_RDONLY)
}

fn last_errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// What PROCMAP_QUERY said about an address.
enum Answer {
    Mapped(Vma),
    Unmapped,
    /// The kernel lacks the ioctl (before 6.11).
    NoQuery,
}

/// The mapping containing `addr`, by PROCMAP_QUERY.
fn query(addr: usize) -> io::Result<Answer> {
    let fd = MAPS.get()?;
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_addr: addr as u64,
        ..Default::default()
    };
    // SAFETY: q is a properly sized, writable procmap_query whose size field says so; the
    // name and build-id buffers are absent (sizes 0), so the kernel writes only into q.
    let rc = unsafe { libc::ioctl(fd, PROCMAP_QUERY as _, &mut q as *mut ProcmapQuery) };
    if rc == 0 {
        return Ok(Answer::Mapped(Vma {
            start: q.vma_start as usize,
            end: q.vma_end as usize,
            readable: q.vma_flags & QUERY_VMA_READABLE != 0,
            writable: q.vma_flags & QUERY_VMA_WRITABLE != 0,
            shared: q.vma_flags & QUERY_VMA_SHARED != 0,
            anonymous: q.inode == 0 && q.dev_major == 0 && q.dev_minor == 0,
        }));
    }
    match last_errno() {
        libc::ENOENT => Ok(Answer::Unmapped),
        libc::ENOTTY | libc::EINVAL | libc::EOPNOTSUPP => Ok(Answer::NoQuery),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// What a range is mapped as, for the kernel purge path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Entirely private anonymous read-write memory.
    PrivateAnon,
    /// Not entirely mapped.
    Hole,
    /// Mapped, but (partly) shared, file-backed, read-only or inaccessible.
    Other,
}

/// How `[start, end)` is mapped: whether it is entirely private anonymous read-write memory.
///
/// Async-signal-safe.
///
/// # Errors
/// The errno of opening or reading `/proc/self/maps`.
pub fn check_private_anon(start: usize, end: usize) -> io::Result<Coverage> {
    if !NO_QUERY.load(Ordering::Relaxed) {
        match check_by_query(start, end)? {
            None => NO_QUERY.store(true, Ordering::Relaxed),
            Some(coverage) => return Ok(coverage),
        }
    }
    check_by_parsing(start, end)
}

/// `None` when the kernel lacks PROCMAP_QUERY.
fn check_by_query(start: usize, end: usize) -> io::Result<Option<Coverage>> {
    let mut cursor = start;
    while cursor < end {
        let vma = match query(cursor)? {
            Answer::Mapped(vma) => vma,
            // A hole is an error path: confirm it by reading the maps, so that a lookup that
            // raced with another thread's mmap/munmap never turns into a false error.
            Answer::Unmapped => return check_by_parsing(start, end).map(Some),
            Answer::NoQuery => return Ok(None),
        };
        if !vma.is_private_anon_rw() {
            return Ok(Some(Coverage::Other));
        }
        cursor = vma.end;
    }
    Ok(Some(Coverage::PrivateAnon))
}

/// Whether this kernel answers PROCMAP_QUERY (probed by trying it once).
pub fn has_procmap_query() -> bool {
    if NO_QUERY.load(Ordering::Relaxed) {
        return false;
    }
    let probe = &NO_QUERY as *const AtomicBool as usize;
    match query(probe) {
        Ok(Answer::NoQuery) => {
            NO_QUERY.store(true, Ordering::Relaxed);
            false
        }
        _ => true,
    }
}

/// Forces the `/proc/self/maps` parsing fallback, for tests of old-kernel behaviour.
#[doc(hidden)]
pub fn force_parsing_fallback(on: bool) {
    NO_QUERY.store(on, Ordering::Relaxed);
}

fn check_by_parsing(start: usize, end: usize) -> io::Result<Coverage> {
    let mut cursor = start;
    let mut verdict = Coverage::Hole;
    for_each_vma(|vma| {
        if vma.end <= cursor {
            return true;
        }
        if vma.start > cursor {
            verdict = Coverage::Hole;
            return false;
        }
        if !vma.is_private_anon_rw() {
            verdict = Coverage::Other;
            return false;
        }
        cursor = vma.end;
        if cursor >= end {
            verdict = Coverage::PrivateAnon;
            return false;
        }
        true
    })?;
    Ok(verdict)
}

/// Calls `visit` for each mapping of this process in address order until it returns false.
/// Reads `/proc/self/maps` through a stack buffer with a fresh descriptor (a shared one would
/// race on the file position).
pub fn for_each_vma(mut visit: impl FnMut(&Vma) -> bool) -> io::Result<()> {
    let fd = open_maps()?;
    let mut parser = LineParser::default();
    let mut buf = [0u8; 4096];
    let result = 'read: loop {
        // SAFETY: buf is a writable buffer of buf.len() bytes owned by this frame.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = last_errno();
            if e == libc::EINTR {
                continue;
            }
            break Err(io::Error::from_raw_os_error(e));
        }
        if n == 0 {
            break Ok(());
        }
        for &b in &buf[..n as usize] {
            if let Some(vma) = parser.feed(b) {
                if !visit(&vma) {
                    break 'read Ok(());
                }
            }
        }
    };
    drop(fd);
    result
}

/// Parses `start-end perms offset major:minor inode [path]` lines one byte at a time, so that
/// arbitrarily long path names need no buffer.
#[derive(Default)]
struct LineParser {
    field: u8,
    start: usize,
    end: usize,
    perm_index: u8,
    vma: Vma,
    dev_nonzero: bool,
    inode_nonzero: bool,
}

impl LineParser {
    fn feed(&mut self, b: u8) -> Option<Vma> {
        if b == b'\n' {
            let vma = Vma {
                start: self.start,
                end: self.end,
                anonymous: !self.dev_nonzero && !self.inode_nonzero,
                ..self.vma
            };
            *self = LineParser::default();
            return Some(vma);
        }
        match (self.field, b) {
            (0, b'-') => self.field = 1,
            (0, _) => self.start = hex_push(self.start, b),
            (1, b' ') => self.field = 2,
            (1, _) => self.end = hex_push(self.end, b),
            (2, b' ') => self.field = 3,
            (2, _) => {
                match (self.perm_index, b) {
                    (0, b'r') => self.vma.readable = true,
                    (1, b'w') => self.vma.writable = true,
                    (3, b's') => self.vma.shared = true,
                    _ => {}
                }
                self.perm_index += 1;
            }
            (3, b' ') => self.field = 4,
            (4, b' ') => self.field = 5,
            (4, b'0' | b':') => {}
            (4, _) => self.dev_nonzero = true,
            (5, b' ') => self.field = 6,
            (5, b'0') => {}
            (5, _) => self.inode_nonzero = true,
            _ => {}
        }
        None
    }
}

fn hex_push(acc: usize, b: u8) -> usize {
    let digit = match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => return acc,
    };
    acc.wrapping_shl(4) | usize::from(digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<Vma> {
        let mut p = LineParser::default();
        text.bytes().filter_map(|b| p.feed(b)).collect()
    }

    #[test]
    fn parser_reads_anonymous_and_file_lines() {
        let v = parse(
            "7f00a000-7f00c000 rw-p 00000000 00:00 0 \n\
             55d0-55e0 r-xp 00001000 fd:01 1234567 /usr/bin/cat\n\
             7ffd000-7ffe000 rw-s 00000000 00:05 42 /dev/zero (deleted)\n\
             1000-2000 ---p 00000000 00:00 0\n",
        );
        assert_eq!(v.len(), 4);
        assert_eq!((v[0].start, v[0].end), (0x7f00a000, 0x7f00c000));
        assert!(v[0].is_private_anon_rw());
        assert!(!v[1].anonymous && !v[1].writable);
        assert!(v[2].shared && !v[2].anonymous);
        assert!(!v[3].readable && v[3].anonymous);
    }

    #[test]
    fn query_and_parsing_agree_on_this_process() {
        let mut seen = 0;
        for_each_vma(|vma| {
            // Other test threads map and unmap concurrently, so compare only what a
            // mapping's own flags say, and only where it is still there.
            if let Ok(Answer::Mapped(q)) = query(vma.start) {
                if q.start == vma.start && q.end == vma.end {
                    assert_eq!(
                        (q.writable, q.shared, q.anonymous),
                        (vma.writable, vma.shared, vma.anonymous),
                        "{vma:?}"
                    );
                }
            }
            seen += 1;
            true
        })
        .unwrap();
        assert!(seen > 3);
    }
}
