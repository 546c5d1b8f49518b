//! How many bytes a memory cgroup can still take before anything but cheap page cache must go,
//! read with two pread(2)s per question.

use super::*;

/// How many bytes a memory cgroup can still take before anything but cheap page cache must go,
/// for a loop that asks often: holds the control files open, so [`Headroom::bytes`] is a
/// pread(2) of the usage file (about 20 bytes) and one of `memory.stat` (about 1 KiB) into
/// stack buffers, no allocation, no path lookup; some microseconds. The ceiling
/// (`min(limit, memory.high)`) is read at creation and by [`Headroom::refresh_ceiling`].
/// [`MemCgroup::headroom`] is the one-shot version.
///
/// Usage counts the cgroup's page cache, which fills any limit a program reading files runs
/// under and which the kernel drops before anything else: [`Headroom::bytes`] counts its clean
/// part as room, as the machine's MemAvailable does (else volatile memory would be purged to
/// make room for cache the kernel drops for free, and a program caching its own file, SQLite
/// on `vrange_sqlite_pcache()`, would purge its cache to keep the kernel's copy of it).
///
/// On v1, usage includes per-CPU charge caches, so it is exact only to some hundreds of KiB.
#[derive(Debug)]
pub struct Headroom {
    usage: GuestFd,
    /// `memory.stat`, for the reclaimable page cache (`None`: not readable, none counted).
    stat: Option<GuestFd>,
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
            let file = crate::fd::open_path_buf(&path, libc::O_RDONLY)
                .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
            GuestFd::adopt(file, Inherit::Private)
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
            stat: open("memory.stat").ok(),
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
            && self.stat.as_ref().is_none_or(GuestFd::is_intact)
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

    /// Page cache the kernel drops first and cheaply: clean, not shared memory (see
    /// `cgroup::reclaimable_file`); one pread of `memory.stat`, 0 if it cannot be read.
    pub fn reclaimable_cache(&self) -> u64 {
        let Some(fd) = self.stat.as_ref().and_then(GuestFd::get) else {
            return 0;
        };
        // The lines needed come in the first 4 KiB (v1's whole file is about 1 KiB; v2's are
        // among its first 20 lines); a line cut short at the end is not trusted.
        let mut buf = [0u8; 4096];
        match pread(fd, &mut buf) {
            Ok(n) => {
                let whole = buf[..n]
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                crate::cgroup::reclaimable_file(&buf[..whole], self.version)
            }
            Err(_) => 0,
        }
    }

    /// `ceiling - (usage - reclaimable page cache)`, 0 when over; two preads.
    ///
    /// # Errors
    /// As [`Headroom::usage`].
    pub fn bytes(&self) -> io::Result<u64> {
        self.read().map(|r| r.headroom)
    }

    /// The headroom ([`Headroom::bytes`]) and, from the same usage, what can be charged before
    /// the kernel reclaims anything; two preads.
    ///
    /// # Errors
    /// As [`Headroom::usage`].
    pub fn read(&self) -> io::Result<Reading> {
        let usage = self.usage()?;
        Ok(Reading {
            headroom: crate::cgroup::headroom(self.ceiling, usage, self.reclaimable_cache()),
            free: crate::cgroup::free(self.ceiling, usage),
        })
    }
}

/// One reading of a [`Headroom`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Bytes the cgroup can still take before anything but clean page cache must go.
    pub headroom: u64,
    /// Bytes it can still take before the kernel reclaims anything (page cache included): the
    /// ceiling less the usage, 0 when over.
    pub free: u64,
}

/// The [`Headroom`] of the calling process's memory cgroup, for a caller that asks now and then
/// from any thread: opened at the first question, again once the program closed or replaced
/// one of its descriptors; where the cgroup has no limit (or its files cannot be opened), tried
/// again a second later, not at every question.
#[derive(Debug)]
pub struct OwnHeadroom {
    file: Option<Headroom>,
    retry_at: u64,
}

impl OwnHeadroom {
    /// None opened yet.
    pub const fn new() -> OwnHeadroom {
        OwnHeadroom {
            file: None,
            retry_at: 0,
        }
    }

    /// The reader at `now` (ns, `clock::now_ns`), `None` where there is no limit to keep
    /// under (or its files could not be opened).
    pub fn get(&mut self, now: u64) -> Option<&Headroom> {
        if self.file.as_ref().is_some_and(|h| !h.is_intact()) {
            self.file = None;
        }
        if self.file.is_none() {
            if now < self.retry_at {
                return None;
            }
            self.file = MemCgroup::current().and_then(|cg| Headroom::new(&cg).ok().flatten());
            self.retry_at = now.saturating_add(1_000_000_000);
        }
        self.file.as_ref()
    }
}

impl Default for OwnHeadroom {
    fn default() -> Self {
        OwnHeadroom::new()
    }
}

/// A limit file: `u64::MAX` for unlimited ("max" on v2, the huge page-rounded number on v1).
fn read_limit(file: &GuestFd, version: Version) -> io::Result<u64> {
    match (read_number(file)?, version) {
        (None, _) => Ok(u64::MAX),
        (Some(v), Version::V1) if v >= crate::cgroup::V1_UNLIMITED => Ok(u64::MAX),
        (Some(v), _) => Ok(v),
    }
}

/// Reads a small control file from offset 0 into a stack buffer: the number it holds, or
/// `None` if it holds a word ("max"). Reading at offset 0 regenerates a cgroup file's content.
/// The descriptor must still be vrange's (see `vrange_sys::fd`): EBADF otherwise, nothing read.
fn read_number(file: &GuestFd) -> io::Result<Option<u64>> {
    let fd = file
        .get()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
    let mut buf = [0u8; 32];
    let n = pread(fd, &mut buf)?;
    Ok(parse_number(&buf[..n]))
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
    fn numbers_parse_like_cgroup_files() {
        assert_eq!(parse_number(b"24621056\n"), Some(24_621_056));
        assert_eq!(parse_number(b"max\n"), None);
        assert_eq!(parse_number(b""), None);
        assert_eq!(parse_number(b"99999999999999999999999\n"), None);
    }

    #[test]
    fn reclaimable_cache_is_clean_page_cache() {
        use crate::cgroup::reclaimable_file;
        let v1 = b"cache 100\ninactive_file 7\ndirty 1\ntotal_cache 80\ntotal_shmem 10\n\
                   total_dirty 3\ntotal_writeback 2\ntotal_inactive_file 50\n";
        assert_eq!(reclaimable_file(v1, Version::V1), 65);
        let v2 = b"anon 5\nfile 90\nshmem 0\nfile_dirty 10\nfile_writeback 0\ninactive_file 40\n";
        assert_eq!(reclaimable_file(v2, Version::V2), 80);
        // Lazily freed anonymous pages sit on the inactive file list but are no page cache.
        let lazy = b"file 20\nshmem 5\nfile_dirty 0\nfile_writeback 0\ninactive_file 300\n";
        assert_eq!(reclaimable_file(lazy, Version::V2), 15);
        assert_eq!(reclaimable_file(b"file 4\nfile_dirty 9\n", Version::V2), 0);
        assert_eq!(reclaimable_file(b"anon 5\nfile_mapped 9\n", Version::V2), 0);
        assert_eq!(reclaimable_file(b"file 4x\n", Version::V2), 0);
    }
}
