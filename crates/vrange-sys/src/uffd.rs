//! userfaultfd(2): the on-access half of volatile ranges. A range registered in MISSING mode on
//! a userfaultfd opened with `UFFD_FEATURE_SIGBUS` raises SIGBUS (at the faulting address)
//! when a thread touches a page that is not there (purged by MADV_DONTNEED, or discarded by the
//! kernel after MADV_FREE), instead of faulting in a zero page; `UFFDIO_COPY` and
//! `UFFDIO_ZEROPAGE` install pages atomically without faulting, and `UFFDIO_MOVE` (Linux 6.8)
//! moves pages of the process's own private anonymous memory into place by their page-table
//! entries: no copy, no allocation, no charge.
//!
//! Owns the userfaultfd system call, `/dev/userfaultfd` and the `UFFDIO_*` ioctls. The
//! functions taking a raw descriptor ([`copy`], [`zero`], [`move_pages`], [`unregister`]) are
//! async-signal-safe (ioctls only, stack values only); the caller verifies the descriptor
//! first.
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
const UFFDIO_MOVE: libc::c_ulong = 0xc028_aa05;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xaa00;
const UFFD_FEATURE_MISSING_SHMEM: u64 = 1 << 5;
const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
const UFFD_FEATURE_EXACT_ADDRESS: u64 = 1 << 11;
const UFFD_FEATURE_MOVE: u64 = 1 << 16;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFDIO_REGISTER_MODE_WP: u64 = 2;
const UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES: u64 = 2;

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
struct Move {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
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
const _: () = assert!(std::mem::size_of::<Move>() == 40);

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
    // Shared memory (memfd) too, where the kernel offers it (Linux 4.11), and moves (6.8).
    let base = UFFD_FEATURE_SIGBUS;
    open_first(&[
        base | UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_MOVE,
        base | UFFD_FEATURE_MISSING_SHMEM,
        base,
    ])
}

/// A new userfaultfd whose faults wait for a thread that reads them ([`next_faults`], with
/// the faulting thread's id and, from Linux 6.1, the exact address) and resolves them ([`copy`], [`wake`]); opened as
/// [`open_sigbus`].
///
/// # Errors
/// As [`open_sigbus`].
pub fn open_handled() -> io::Result<(OwnedFd, Reach)> {
    // The exact address (Linux 6.1) rather than the page's, and moves (6.8), where the kernel
    // offers them.
    let base = UFFD_FEATURE_THREAD_ID;
    open_first(&[
        base | UFFD_FEATURE_EXACT_ADDRESS | UFFD_FEATURE_MOVE,
        base | UFFD_FEATURE_EXACT_ADDRESS,
        base,
    ])
}

/// Opens with the first set of features the kernel accepts (it refuses one it lacks with
/// EINVAL), best first.
fn open_first(choices: &[u64]) -> io::Result<(OwnedFd, Reach)> {
    let mut last = io::Error::from_raw_os_error(libc::EINVAL);
    for &features in choices {
        match open(features) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last = e,
            r => return r,
        }
    }
    Err(last)
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

/// Registers `[start, start + len)` (page-aligned private anonymous memory) as a place
/// [`move_pages`] may move pages into (the kernel moves only into memory registered on the
/// descriptor), without taking any of its faults: the registration is for write-protect faults,
/// and nothing there is ever write-protected, so a missing page faults in as it would
/// unregistered. Linux 5.7 on x86-64 (anonymous write-protect registration).
///
/// # Errors
/// EINVAL for memory userfaultfd does not serve or a kernel without write-protect
/// registration, EBUSY if another userfaultfd holds part of it, ENOMEM for holes.
pub fn register_move_target(fd: RawFd, start: usize, len: usize) -> io::Result<()> {
    let mut r = Register {
        range: Range {
            start: start as u64,
            len: len as u64,
        },
        mode: UFFDIO_REGISTER_MODE_WP,
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

/// What [`move_pages`] does across from a source page that is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrcHole {
    /// Leaves the destination page missing.
    Skip,
    /// Installs the zero page there (as [`zero`]): the destination reads what the source read.
    Zero,
}

/// Where [`move_pages`] stopped, and why: everything before `at` (bytes from the start) was
/// done.
#[derive(Debug)]
pub struct Stopped {
    pub at: usize,
    pub error: io::Error,
}

/// Moves the pages of `[src, src + len)` to the missing pages of `[dst, dst + len)`
/// (page-aligned; `dst` registered on `fd`, in MISSING mode or by [`register_move_target`]) by
/// their page-table entries: no copy, no allocation, no charge to the memory cgroup; a thread
/// waiting on a missing destination page is woken. A present destination page is kept, and the
/// source page across from it stays where it is; a missing source page as `hole` says. Returns
/// the bytes that left the source (the pages moved; with [`SrcHole::Skip`], the holes too).
/// Async-signal-safe.
///
/// # Errors
/// [`Stopped`] at the first page that could not be moved: EBUSY for a source page that is not
/// this mapping's alone (shared with a fork child, pinned), EINVAL where the kernel has no
/// `UFFDIO_MOVE` (before Linux 6.8), `dst` is not registered on `fd`, or the two mappings
/// differ (protection, mlock, not private anonymous), ENOMEM; EAGAIN if the address space kept
/// changing under it.
///
/// # Safety
/// The source's pages leave it: `[src, src + len)` must be memory the caller owns, whose
/// content it no longer needs there (those pages are missing afterwards), with no reference
/// into it live.
pub unsafe fn move_pages(
    fd: RawFd,
    dst: usize,
    src: usize,
    len: usize,
    hole: SrcHole,
) -> Result<usize, Stopped> {
    /// Tries that move nothing (EAGAIN: the address space changed meanwhile) before giving up.
    const STILL: u32 = 8;
    let page = crate::mem::page_size();
    let mode = match hole {
        SrcHole::Skip => UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES,
        SrcHole::Zero => 0,
    };
    let (mut done, mut moved, mut still) = (0usize, 0usize, 0u32);
    while done < len {
        let mut m = Move {
            dst: (dst + done) as u64,
            src: (src + done) as u64,
            len: (len - done) as u64,
            mode,
            moved: 0,
        };
        let result = ioctl(fd, UFFDIO_MOVE, &mut m);
        // The bytes moved before it stopped, or a negative errno when none were.
        let n = usize::try_from(m.moved).unwrap_or(0).min(len - done);
        moved += n;
        done += n;
        let error = match result {
            Ok(()) => return Ok(moved),
            Err(e) => e,
        };
        match error.raw_os_error() {
            // Stopped short: the next call says why, from where it stopped.
            Some(libc::EAGAIN) if n > 0 => still = 0,
            Some(libc::EAGAIN) if still < STILL => still += 1,
            // A present destination page: kept, and its source page stays.
            Some(libc::EEXIST) => done += page,
            // A missing source page (not skipped by the mode): the zero page across from it.
            Some(libc::ENOENT) if hole == SrcHole::Zero => {
                zero(fd, dst + done, page).map_err(|error| Stopped { at: done, error })?;
                done += page;
            }
            _ => return Err(Stopped { at: done, error }),
        }
    }
    Ok(moved)
}

/// Whether `UFFDIO_MOVE` works here (Linux 6.8): moves one page of a scratch mapping into
/// another, on a descriptor of its own, and reads it there. For the feature probe.
///
/// # Errors
/// The errno of the first step that failed (EINVAL where the kernel has no moves, EPERM or
/// ENOSYS without userfaultfd); EIO if the page did not arrive intact.
pub fn move_works() -> io::Result<()> {
    let page = crate::mem::page_size();
    let (fd, _) = open(UFFD_FEATURE_MOVE)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let area = crate::mem::map_anon(2 * page, page)?;
    let (src, dst) = (area.as_ptr() as usize, area.as_ptr() as usize + page);
    let moved = register_missing(fd, dst, page).and_then(|()| {
        // SAFETY: the first page of the probe's own mapping.
        unsafe { (src as *mut u64).write_volatile(0x5eed) };
        // SAFETY: the probe's own page, whose content it reads at the destination.
        unsafe { move_pages(fd, dst, src, page, SrcHole::Skip) }.map_err(|s| s.error)?;
        // A destination left missing would make the read below wait for ever on a descriptor
        // nobody serves: look first.
        if crate::mem::resident_pages(dst as *mut u8, page)? != 1 {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        // SAFETY: the second page of the mapping, present now.
        let arrived = unsafe { (dst as *const u64).read_volatile() } == 0x5eed;
        if arrived {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::EIO))
        }
    });
    // SAFETY: the probe's own mapping; nothing refers into it.
    unsafe { crate::mem::unmap(area, 2 * page) };
    moved
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
