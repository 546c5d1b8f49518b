//! A memory cgroup thrashing at its limit, the pressure the pressure-source tests and the
//! stress suite make: the thrasher holds anonymous memory reclaim cannot take (there is no
//! swap), then writes an unnamed file and reads it back through a shared mapping, over and over.
//! With the file larger than what the limit leaves it, the cgroup reclaims all the time over
//! pages that were just written (dirty) or just read through the mapping (young in a page
//! table, so the first scan of each keeps it): it scans far more than it frees, which is what
//! vmpressure calls medium or critical, and the thrasher stalls in reclaim, which is what PSI
//! counts. The mapped read is what makes the scans fail whatever the disk's speed: read with
//! pread(2) instead, a page is referenced only as a flag, which reclaim drops for a clean page,
//! and on a fast disk the flusher cleans the written pages before reclaim reaches them (Linux
//! 6.1 in a guest then reports only low, run after run).
//!
//! System calls only, no allocation: a forked child of a multi-threaded harness may thrash.

use std::ffi::{CStr, CString};
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use vrange_sys::mem;

/// How much the thrasher holds and cycles.
#[derive(Clone, Copy, Debug)]
pub struct Thrash {
    /// Anonymous memory, in small pages (the charge grows a page at a time).
    pub anon: usize,
    /// The unnamed file cycled through the page cache.
    pub file: usize,
    /// Its unit of write and read.
    pub chunk: usize,
}

/// The step at which a thrasher gave up, with the errno where there is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// Mapping the anonymous memory or the buffer.
    Map(i32),
    /// Making the unnamed file (O_TMPFILE) in the directory.
    File(i32),
    /// Writing or reading the file.
    Io(i32),
}

impl Thrash {
    /// Fills the anonymous memory and makes the file in `dir`, calls `ready`, then cycles the
    /// file through the page cache while `go_on()` says so. Returns `Ok` when told to stop.
    ///
    /// # Errors
    /// The step that failed ([`Failed`]); what was mapped is left to the process's exit.
    pub fn run(
        self,
        dir: &CStr,
        ready: impl FnOnce(),
        go_on: impl Fn() -> bool,
    ) -> Result<(), Failed> {
        let page = mem::page_size();
        let anon = mem::map_anon(self.anon, page).map_err(|e| Failed::Map(code(&e)))?;
        // Small pages, so the charge grows a page at a time (a failure only makes it coarser).
        let _ = mem::advise_huge(anon.as_ptr(), self.anon, false);
        for off in (0..self.anon).step_by(page) {
            // SAFETY: inside the fresh mapping.
            unsafe { anon.as_ptr().add(off).write_volatile(1) };
        }
        let buf = mem::map_anon(self.chunk, page).map_err(|e| Failed::Map(code(&e)))?;
        // SAFETY: the fresh `chunk`-byte mapping.
        unsafe { buf.as_ptr().write_bytes(0x5a, self.chunk) };
        // SAFETY: `dir` is NUL-terminated; O_TMPFILE makes a file without a name, freed when
        // the thrasher ends however it ends.
        let fd = unsafe { libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600) };
        if fd < 0 {
            return Err(Failed::File(code(&std::io::Error::last_os_error())));
        }
        // SAFETY: `fd` is the descriptor just opened, owned by this file from here on (closed
        // when the thrasher returns; the file wraps the number and allocates nothing).
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.set_len(self.file as u64)
            .map_err(|e| Failed::File(code(&e)))?;
        let mapped = mem::map_file_readonly(&file, self.file).map_err(|e| Failed::Map(code(&e)))?;
        ready();
        while go_on() {
            for off in (0..self.file).step_by(self.chunk) {
                // SAFETY: `buf` holds `chunk` bytes; `fd` is the file opened above.
                let done = unsafe {
                    libc::pwrite(fd, buf.as_ptr().cast(), self.chunk, off as libc::off_t)
                };
                if done < 0 {
                    return Err(Failed::Io(code(&std::io::Error::last_os_error())));
                }
            }
            for off in (0..self.file).step_by(page) {
                // SAFETY: inside the file's mapping, within its length (set above).
                unsafe { mapped.as_ptr().add(off).read_volatile() };
            }
        }
        // SAFETY: the mapping made above; nothing refers into it any more.
        unsafe { mem::unmap(mapped, self.file) };
        Ok(())
    }
}

fn code(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// Where a thrasher's file goes: a file system with O_TMPFILE whose pages the kernel can write
/// back and drop. `preferred` (a disk, usually) unless it lacks O_TMPFILE (9p or virtiofs in a
/// test guest), then the system's temporary directory (the guest's is a disk). Not tmpfs where
/// avoidable: without swap its pages stay.
pub fn dir(preferred: &Path) -> CString {
    let _ = fs::create_dir_all(preferred);
    let has_tmpfile = |dir: &Path| {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)
            .is_ok()
    };
    let dir = if has_tmpfile(preferred) {
        preferred.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    CString::new(dir.as_os_str().as_encoded_bytes()).expect("a directory path has no NUL byte")
}
