//! userfaultfd(2): the on-access half of volatile ranges. A range registered in MISSING mode on
//! a userfaultfd opened with `UFFD_FEATURE_SIGBUS` raises SIGBUS (at the faulting address)
//! when a thread touches a page that is not there (purged by MADV_DONTNEED, or discarded by the
//! kernel after MADV_FREE), instead of faulting in a zero page; `UFFDIO_COPY` and
//! `UFFDIO_ZEROPAGE` install pages atomically without faulting.
//!
//! Owns the userfaultfd system call, `/dev/userfaultfd` and the `UFFDIO_*` ioctls. The
//! functions taking a raw descriptor ([`copy`], [`zero`], [`unregister`]) are async-signal-safe
//! (one ioctl per call, stack values only); the caller verifies the descriptor first.
//!
//! They take a `RawFd`, not a `BorrowedFd`, on purpose: the descriptor lives in the program's
//! table, which may close it (or reuse its number) at any moment, so vrange cannot promise what
//! a borrow promises (open for the borrow's lifetime). The caller verifies it (dev, ino) just
//! before the call; a number closed or reused since fails the ioctl (EBADF, ENOTTY, EINVAL)
//! without effect.
//!
//! # What a missing page does
//! | access | registered (SIGBUS feature) | not registered |
//! |---|---|---|
//! | load or store by a thread | SIGBUS, `si_addr` the address, `si_code` BUS_ADRERR | a zero page |
//! | a system call writing into it (`read(2)` into a buffer) | EFAULT; with UFFD_USER_MODE_ONLY a zero page is faulted in instead | a zero page |
//!
//! # References
//! userfaultfd(2), ioctl_userfaultfd(2), Documentation/admin-guide/mm/userfaultfd.rst.

use std::io;
use std::os::fd::{OwnedFd, RawFd};

// The ioctl numbers and structures of include/uapi/linux/userfaultfd.h (libc has none).
const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_aa01;
const UFFDIO_COPY: libc::c_ulong = 0xc028_aa03;
const UFFDIO_ZEROPAGE: libc::c_ulong = 0xc020_aa04;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_aa02;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xaa00;
const UFFD_FEATURE_MISSING_SHMEM: u64 = 1 << 5;
const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
const UFFD_FEATURE_EXACT_ADDRESS: u64 = 1 << 11;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;

#[repr(C)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
struct Register {
    range: Range,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct Copy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct Zeropage {
    range: Range,
    mode: u64,
    zeropage: i64,
}

const _: () = assert!(std::mem::size_of::<Api>() == 24);
const _: () = assert!(std::mem::size_of::<Register>() == 32);
const _: () = assert!(std::mem::size_of::<Range>() == 16);
const _: () = assert!(std::mem::size_of::<Copy>() == 40);
const _: () = assert!(std::mem::size_of::<Zeropage>() == 32);

/// How the descriptor was obtained: what a system call touching a missing page gets depends
/// on it (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Kernel-mode faults too (privileged, or `vm.unprivileged_userfaultfd=1`, or
    /// `/dev/userfaultfd`): a system call writing into a missing page fails with EFAULT.
    All,
    /// UFFD_USER_MODE_ONLY (unprivileged): a system call writing into a missing page faults in
    /// a zero page, as if the range were not registered.
    UserModeOnly,
}

fn ioctl<T>(fd: RawFd, request: libc::c_ulong, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is the structure `request` reads and writes (sizes asserted above), valid
    // for the call; an unrelated descriptor fails the ioctl (ENOTTY, EINVAL) without effect.
    let rc = unsafe { libc::ioctl(fd, request, arg as *mut T) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A new userfaultfd (close-on-exec, non-blocking) with the SIGBUS feature: tries the system
/// call for all faults, then with UFFD_USER_MODE_ONLY, then `/dev/userfaultfd`. The caller
/// places it above vrange's descriptor floor.
///
/// # Errors
/// ENOSYS (no userfaultfd), EPERM or EACCES (not allowed), EINVAL (no SIGBUS feature), the
/// errno of the last way tried otherwise.
pub fn open_sigbus() -> io::Result<(OwnedFd, Reach)> {
    // Shared memory (memfd) too, where the kernel offers it (Linux 4.11).
    match open(UFFD_FEATURE_SIGBUS | UFFD_FEATURE_MISSING_SHMEM) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(UFFD_FEATURE_SIGBUS),
        r => r,
    }
}

/// A new userfaultfd whose faults wait for a thread that reads them ([`next_faults`], with
/// the faulting thread's id and, from Linux 6.1, the exact address) and resolves them ([`copy`], [`wake`]); opened as
/// [`open_sigbus`].
///
/// # Errors
/// As [`open_sigbus`].
pub fn open_handled() -> io::Result<(OwnedFd, Reach)> {
    // The exact address (Linux 6.1) rather than the page's, where the kernel offers it.
    match open(UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_EXACT_ADDRESS) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(UFFD_FEATURE_THREAD_ID),
        r => r,
    }
}

fn open(features: u64) -> io::Result<(OwnedFd, Reach)> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let mut last = io::Error::from_raw_os_error(libc::ENOSYS);
    for (extra, reach) in [(0, Reach::All), (UFFD_USER_MODE_ONLY, Reach::UserModeOnly)] {
        // SAFETY: userfaultfd takes flags only and returns a new descriptor or -1.
        let made = crate::fd::create_guarded(|| unsafe {
            libc::syscall(libc::SYS_userfaultfd, flags | extra) as RawFd
        });
        match made {
            Ok(fd) => return handshake(fd, reach, features),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Err(e),
            Err(e) => last = e,
        }
    }
    let Ok(dev) = crate::fd::open_path(c"/dev/userfaultfd", libc::O_RDWR) else {
        return Err(last);
    };
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags by value and returns a new descriptor or -1.
    let fd = crate::fd::create_guarded(|| unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&dev),
            USERFAULTFD_IOC_NEW,
            flags as libc::c_ulong,
        )
    })?;
    handshake(fd, Reach::All, features)
}

fn handshake(fd: OwnedFd, reach: Reach, features: u64) -> io::Result<(OwnedFd, Reach)> {
    let mut api = Api {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    ioctl(std::os::fd::AsRawFd::as_raw_fd(&fd), UFFDIO_API, &mut api)?;
    Ok((fd, reach))
}

/// Registers `[start, start + len)` (page-aligned, private anonymous or shared memfd memory) in
/// MISSING mode: from now
/// on a missing page there raises SIGBUS. Registering a range already registered on `fd` again
/// is allowed.
///
/// # Errors
/// EINVAL for memory userfaultfd does not serve, EBUSY if another userfaultfd holds part of
/// it, ENOMEM for holes.
pub fn register_missing(fd: RawFd, start: usize, len: usize) -> io::Result<()> {
    let mut r = Register {
        range: Range {
            start: start as u64,
            len: len as u64,
        },
        mode: UFFDIO_REGISTER_MODE_MISSING,
        ioctls: 0,
    };
    ioctl(fd, UFFDIO_REGISTER, &mut r)
}

/// Unregisters `[start, start + len)`: missing pages fault in as zero pages again. Parts not
/// registered are skipped. Async-signal-safe.
///
/// # Errors
/// EINVAL for memory userfaultfd does not serve, ENOMEM for holes.
pub fn unregister(fd: RawFd, start: usize, len: usize) -> io::Result<()> {
    let mut r = Range {
        start: start as u64,
        len: len as u64,
    };
    ioctl(fd, UFFDIO_UNREGISTER, &mut r)
}

/// Installs the missing pages of `[dst, dst + len)` (page-aligned) with the bytes at `src`,
/// atomically per page, skipping pages that are present. Async-signal-safe.
///
/// # Errors
/// EINVAL for misaligned arguments; ENOENT where `dst` is not registered on `fd`; EFAULT for a
/// bad `src`; ENOMEM when memory for the pages cannot be charged.
///
/// # Safety
/// `src` must be readable for `len` bytes.
pub unsafe fn copy(fd: RawFd, dst: usize, src: *const u8, len: usize) -> io::Result<()> {
    fill_missing(len, |done| {
        let mut c = Copy {
            dst: (dst + done) as u64,
            src: src as u64 + done as u64,
            len: (len - done) as u64,
            mode: 0,
            copy: 0,
        };
        (ioctl(fd, UFFDIO_COPY, &mut c), c.copy)
    })
    .map(drop)
}

/// Installs zero pages at the missing pages of `[dst, dst + len)` (page-aligned), skipping
/// pages that are present, and returns how many bytes it installed: the pages that were
/// missing (a purge's holes, less what a SIGBUS handler placed). Async-signal-safe.
///
/// # Errors
/// As [`copy`].
pub fn zero(fd: RawFd, dst: usize, len: usize) -> io::Result<usize> {
    fill_missing(len, |done| {
        let mut z = Zeropage {
            range: Range {
                start: (dst + done) as u64,
                len: (len - done) as u64,
            },
            mode: 0,
            zeropage: 0,
        };
        (ioctl(fd, UFFDIO_ZEROPAGE, &mut z), z.zeropage)
    })
}

/// Runs `install(done)` (one UFFDIO_COPY or UFFDIO_ZEROPAGE from byte `done` on, giving its
/// result and the bytes it installed) until `len` bytes are done: a present page stops an
/// install (EEXIST), so it is kept and skipped; a partial install (EAGAIN) goes on where it
/// stopped. Returns the bytes installed (those of the present pages skipped not counted).
fn fill_missing(
    len: usize,
    mut install: impl FnMut(usize) -> (io::Result<()>, i64),
) -> io::Result<usize> {
    let page = crate::mem::page_size();
    let mut done = 0;
    let mut total = 0usize;
    while done < len {
        let (result, installed) = install(done);
        // The kernel reports at most what was asked, or a negative errno.
        let installed = usize::try_from(installed).unwrap_or(0).min(len - done);
        total = total.saturating_add(installed);
        match result {
            Ok(()) => return Ok(total),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                done = done.saturating_add(installed).saturating_add(page)
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => done += installed,
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// Wakes the threads waiting on faults in `[start, start + len)` (they retry the access).
///
/// # Errors
/// EINVAL for a bad range.
pub fn wake(fd: RawFd, start: usize, len: usize) -> io::Result<()> {
    let mut r = Range {
        start: start as u64,
        len: len as u64,
    };
    ioctl(fd, UFFDIO_WAKE, &mut r)
}

/// One page fault a handled userfaultfd reported: the address and the faulting thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fault {
    pub addr: usize,
    pub tid: i32,
}

/// Waits up to `timeout_ms` for faults on `fd` and stores the page faults read into `out`;
/// returns how many (0 on timeout). Other events are skipped.
///
/// # Errors
/// The errno of poll(2) or read(2) (EINTR and EAGAIN count as a timeout).
pub fn next_faults(fd: RawFd, timeout_ms: i32, out: &mut [Fault]) -> io::Result<usize> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EINTR) {
            Ok(0)
        } else {
            Err(e)
        };
    }
    if n == 0 {
        return Ok(0);
    }
    if pfd.revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // struct uffd_msg: 32 bytes; event at 0; for a page fault, the address at 16 and the
    // thread id at 24.
    let mut msgs = [[0u8; 32]; 16];
    let want = msgs.len().min(out.len());
    // SAFETY: the buffer holds `want` messages of 32 bytes.
    let got = unsafe { libc::read(fd, msgs.as_mut_ptr().cast(), want * 32) };
    if got < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
            _ => Err(e),
        };
    }
    let mut n = 0;
    for m in msgs.iter().take(got as usize / 32) {
        if m[0] == UFFD_EVENT_PAGEFAULT {
            let mut addr = [0u8; 8];
            addr.copy_from_slice(&m[16..24]);
            let mut tid = [0u8; 4];
            tid.copy_from_slice(&m[24..28]);
            out[n] = Fault {
                addr: u64::from_ne_bytes(addr) as usize,
                tid: i32::from_ne_bytes(tid),
            };
            n += 1;
        }
    }
    Ok(n)
}
