//! Shared memory for shared volatile regions: memfd creation, shared mappings of it, and hole
//! punching, the purge that frees a shared page for every process that maps it.
//!
//! Owns `memfd_create`, `ftruncate`, `fstat`, shared `mmap`, `fallocate` and MADV_REMOVE. Never decides
//! policy.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Creates a sealed-size-free memfd of `len` bytes (content zero), close-on-exec.
///
/// # Errors
/// The errno of memfd_create(2) or ftruncate(2).
pub fn create(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: name is a valid NUL-terminated string; the flags are constants.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let size = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: fd is a valid memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Size in bytes of the file behind `fd`.
///
/// # Errors
/// The errno of fstat(2).
pub fn size(fd: BorrowedFd<'_>) -> io::Result<usize> {
    // SAFETY: an all-zero stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is a valid descriptor for the borrow's lifetime; st is writable.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    usize::try_from(st.st_size).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Maps `len` bytes of `fd` shared and read-write.
///
/// # Errors
/// The errno of mmap(2) (EACCES for a descriptor not open read-write).
pub fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping at an address of the kernel's choosing aliases no Rust
    // object; the file's content is plain bytes.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(raw.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// Frees `[offset, offset + len)` of the file for every process that maps it: the pages read
/// as zero afterwards (FALLOC_FL_PUNCH_HOLE, size kept).
///
/// # Safety
/// Destroys content seen by every process mapping the file; the caller must hold the right to
/// discard it (the range's state machine says it is purging).
///
/// # Errors
/// The errno of fallocate(2).
///
/// # References
/// fallocate(2) FALLOC_FL_PUNCH_HOLE; memfd_create(2).
pub unsafe fn punch_hole(fd: BorrowedFd<'_>, offset: usize, len: usize) -> io::Result<()> {
    let off =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let n = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: fd is valid for the borrow; fallocate checks the range itself.
    let rc = unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            n,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Punches a hole under `len` bytes of a shared mapping of a memfd at `ptr` (MADV_REMOVE): the
/// same as [`punch_hole`] over the file range the mapping shows, for every process mapping
/// the file, without the file's descriptor (a thread whose descriptor table is its own holds
/// none of the program's).
///
/// # Safety
/// As [`punch_hole`]; `ptr..ptr + len` must lie in a shared, writable mapping of the file.
///
/// # Errors
/// The errno of madvise(2) (EACCES for a private or read-only mapping, EINVAL for bad
/// alignment).
///
/// # References
/// madvise(2) MADV_REMOVE.
pub unsafe fn punch_mapped(ptr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller passes a range of a shared mapping it may discard; the kernel checks
    // the mapping's kind and the alignment.
    if unsafe { libc::madvise(ptr.cast(), len, libc::MADV_REMOVE) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Duplicates `fd` with close-on-exec set, for handing a region's descriptor to a caller.
///
/// # Errors
/// The errno of fcntl(2).
pub fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}
