//! Descriptors vrange holds inside a program it did not write: placed high, close-on-exec, and
//! verified before every use.
//!
//! A program may close every descriptor it did not open itself (`closefrom(3)`, `close_range`,
//! daemons closing 3–N) and open its own files in their place, or start with 0, 1 and 2 closed.
//! A library that uses a descriptor *by number* after that writes into, reads from or closes the
//! program's file. So every descriptor vrange keeps is a [`GuestFd`]:
//!
//! - **Placed above a floor** ([`floor`]): moved with `F_DUPFD_CLOEXEC` to the lowest free
//!   number at or above `min(RLIMIT_NOFILE soft limit, 1024) - 32` (992 with the usual limit of
//!   1024 or more; half the limit when it is below 64), the way valgrind keeps its descriptors
//!   at the top of the range. Programs take the lowest free numbers, so they meet vrange's only
//!   once they hold nearly a thousand descriptors; capping at 1024 keeps the descriptor table
//!   small under huge limits and keeps vrange's numbers usable with `select(2)`. The original,
//!   low number is closed at once. Where no number above the floor is free the source is not
//!   opened ([`Counts::no_room`]).
//! - **Close-on-exec**, so an exec'd program inherits nothing.
//! - **Verified before every use** ([`Ident::verify`]): `fstat` must give the device and inode
//!   recorded when it was placed. Eventfds all share one anonymous inode, so for them the
//!   `eventfd-id` of `/proc/self/fdinfo/<fd>` (Linux 5.16+) is compared too; on older kernels an
//!   eventfd is verified by device and inode alone. The kernel reuses an eventfd's id once it
//!   is closed, so an eventfd the program creates *after* closing vrange's and then moves onto
//!   vrange's number with `dup2` passes; one it held before does not, and nothing else does.
//! - **Never closed unverified**: a descriptor that no longer is the object vrange opened is
//!   forgotten, not closed, and counted ([`Counts::lost`]); its owner recovers by opening a new
//!   one (the reclaimer reopens its sources, see `reclaim`).
//!
//! **Types.** A descriptor something owns for its whole life (a coordinator's socket, a test's
//! file) is an `OwnedFd`, lent as `BorrowedFd`. A guest descriptor's number is a `RawFd` on
//! purpose: the program may close it at any moment, so no lifetime can promise it stays open,
//! which is what a `BorrowedFd` would claim. The functions that act on one (the userfaultfd
//! operations, poll sets, the pressure sources' `fd()`) take the `RawFd` right after
//! [`Ident::verify`]; a number the program closes in between gets `EBADF`.
//!
//! Private descriptors (the reclaimer's pressure sources) are listed in a small table so that a
//! fork child, which has no reclaimer, closes its copies ([`close_private_after_fork`]).
//!
//! Every function here that can run in a fork child or a signal handler is async-signal-safe:
//! system calls on stack buffers, atomics, no allocation, no lock.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicI32, AtomicU64};

/// Descriptors vrange keeps at most above the floor at once, the reclaimer's sources (waker,
/// two PSI triggers, four vmpressure files, four headroom files: usage, limit, `memory.high`,
/// `memory.stat`) and a margin; shared regions add one each.
pub const RESERVE: RawFd = 32;
/// The floor never goes above this much below 1024.
const CAP: RawFd = 1024;

/// The lowest number vrange places a descriptor at: `min(soft RLIMIT_NOFILE, 1024) - 32`, or
/// half the limit when it is below 64. Read at every placement, so it follows a program that
/// changes its limit.
pub fn floor() -> RawFd {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`, which lives across the call.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(CAP as libc::rlim_t) as RawFd
    } else {
        CAP
    };
    if soft >= 2 * RESERVE {
        soft - RESERVE
    } else {
        soft / 2
    }
}

/// What identifies the object behind a descriptor: its number, device, inode and, for an
/// eventfd, its `eventfd-id`. `Copy`, so a poll set can hold it without owning the descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ident {
    fd: RawFd,
    dev: u64,
    ino: u64,
    /// `eventfd-id` + 1 from fdinfo; 0 for other files or where the kernel does not show it.
    anon_id: u64,
}

impl Ident {
    /// Reads the identity of whatever `fd` is now.
    fn of(fd: RawFd) -> Option<Ident> {
        let (dev, ino, anon) = stat(fd)?;
        Some(Ident {
            fd,
            dev,
            ino,
            anon_id: if anon { eventfd_id(fd) } else { 0 },
        })
    }

    /// An identity no descriptor has, for poll-set bookkeeping tests.
    #[cfg(test)]
    pub(crate) fn fake(fd: RawFd) -> Ident {
        Ident {
            fd,
            dev: u64::MAX,
            ino: u64::MAX,
            anon_id: 0,
        }
    }

    /// An identity kept in atomics by a caller that cannot hold a [`GuestFd`] (see
    /// [`GuestFd::leak`]).
    pub fn from_parts(fd: RawFd, dev: u64, ino: u64) -> Ident {
        Ident {
            fd,
            dev,
            ino,
            anon_id: 0,
        }
    }

    /// The device recorded.
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// The inode recorded.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// Closes the descriptor if it still verifies; otherwise forgets it and counts it lost.
    /// Async-signal-safe. For identities from [`GuestFd::leak`] only.
    pub fn close(&self) {
        close_ident(self);
    }

    /// The descriptor number (valid only while [`Ident::verify`] says so).
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Whether the descriptor still refers to the object recorded, in the calling thread's
    /// table. Async-signal-safe: one fstat(2), and for an eventfd an open/read/close of its
    /// fdinfo.
    pub fn verify(&self) -> bool {
        if self.fd < 0 {
            return false;
        }
        match stat(self.fd) {
            Some((dev, ino, anon)) if dev == self.dev && ino == self.ino => {
                !anon || self.anon_id == 0 || eventfd_id(self.fd) == self.anon_id
            }
            _ => false,
        }
    }
}

/// A descriptor vrange owns: above the floor, close-on-exec, verified before use, closed only
/// if still verified. See the module documentation.
#[derive(Debug)]
pub struct GuestFd {
    ident: Ident,
    /// Slot in the private table (see [`close_private_after_fork`]), or `usize::MAX`.
    slot: usize,
}

/// Whether a fork child keeps its copy of a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inherit {
    /// Closed in a fork child (the reclaimer's sources: the child has no reclaimer).
    Private,
    /// Kept (a shared region's memfd: the child maps the region too).
    Keep,
}

impl GuestFd {
    /// Takes a descriptor just opened by vrange (at whatever number the kernel chose), moves it
    /// above the [`floor`] with close-on-exec and records its identity. The original number is
    /// closed.
    ///
    /// # Errors
    /// EMFILE when no number above the floor is free (counted in [`Counts::no_room`]); the
    /// errno of fstat(2).
    pub fn adopt(fd: OwnedFd, inherit: Inherit) -> io::Result<GuestFd> {
        let original = Ident::of(fd.as_raw_fd());
        let guest = GuestFd::copy_of(fd.as_fd(), inherit)?;
        // The original number is closed only if it still is what was opened: a program that
        // had it closed (a standard descriptor) may have put its own file there meanwhile.
        if let Some(original) = original {
            let _ = fd.into_raw_fd();
            close_ident(&original);
        }
        Ok(guest)
    }

    /// A copy of `fd` above the [`floor`], close-on-exec, that vrange owns (a private copy of
    /// stderr, say); `fd` stays open.
    ///
    /// # Errors
    /// As [`GuestFd::adopt`].
    pub fn copy_of(fd: BorrowedFd<'_>, inherit: Inherit) -> io::Result<GuestFd> {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a descriptor borrowed for the call; the result, if
        // any, is a new descriptor nothing else refers to.
        let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor()) };
        if high < 0 {
            let e = io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::EINVAL)) {
                NO_ROOM.fetch_add(1, Relaxed);
                return Err(io::Error::from_raw_os_error(libc::EMFILE));
            }
            return Err(e);
        }
        let Some(ident) = Ident::of(high) else {
            let e = io::Error::last_os_error();
            // SAFETY: `high` was created just above and nothing else knows it.
            unsafe { libc::close(high) };
            return Err(e);
        };
        // A fork child never has a copy of an own table's descriptors.
        let slot = match inherit {
            Inherit::Private if !crate::own_table::active() => track(&ident),
            Inherit::Private | Inherit::Keep => usize::MAX,
        };
        Ok(GuestFd { ident, slot })
    }

    /// The identity recorded, for a poll set.
    pub fn ident(&self) -> Ident {
        self.ident
    }

    /// The descriptor number, unverified: for handing to the kernel in the same breath as it
    /// was verified (a `cgroup.event_control` line), or for display.
    pub fn raw(&self) -> RawFd {
        self.ident.fd
    }

    /// The descriptor, if it still is the object vrange opened; `None` if the program closed or
    /// replaced it.
    pub fn get(&self) -> Option<BorrowedFd<'_>> {
        if self.ident.verify() {
            // SAFETY: verified open and ours just now; the borrow ends with `self`.
            Some(unsafe { BorrowedFd::borrow_raw(self.ident.fd) })
        } else {
            None
        }
    }

    /// Whether the descriptor still is the object vrange opened.
    pub fn is_intact(&self) -> bool {
        self.ident.verify()
    }

    /// The descriptor as the calling thread can use it: the verified one, or in a thread with
    /// a table of its own ([`crate::own_table`]) a new descriptor of the same file, opened
    /// read-write through `/proc/self/fd/<n>` (the program's table, as the thread-group leader
    /// holds it) and checked to be the same device and inode. Only for files that can be
    /// opened again that way (a memfd; not an eventfd). `None` if the program closed or
    /// replaced it, or (own table) its leader thread has exited.
    pub fn for_this_thread(&self) -> Option<ThisThread<'_>> {
        if !crate::own_table::active() {
            return self.get().map(ThisThread::Program);
        }
        let mut path = [0u8; 32];
        let prefix = b"/proc/self/fd/";
        path[..prefix.len()].copy_from_slice(prefix);
        write_decimal(&mut path[prefix.len()..], self.ident.fd as u32 as u64);
        let cpath = std::ffi::CStr::from_bytes_until_nul(&path).ok()?;
        let fd = open_path(cpath, libc::O_RDWR).ok()?;
        let same = stat(fd.as_raw_fd())
            .is_some_and(|(dev, ino, _)| (dev, ino) == (self.ident.dev, self.ident.ino));
        same.then_some(ThisThread::Own(fd))
    }

    /// Gives up ownership to a caller that keeps the identity in atomics (async-signal-safe
    /// code cannot hold a value with a destructor in a static); it closes the descriptor with
    /// [`Ident::close`]. Only for [`Inherit::Keep`] descriptors.
    pub fn leak(self) -> Ident {
        debug_assert_eq!(self.slot, usize::MAX, "private descriptors are not leaked");
        let ident = self.ident;
        std::mem::forget(self);
        ident
    }
}

/// A [`GuestFd`] as one thread can use it (see [`GuestFd::for_this_thread`]).
#[derive(Debug)]
pub enum ThisThread<'a> {
    /// The descriptor itself, verified.
    Program(BorrowedFd<'a>),
    /// A descriptor of the same file in the thread's own table, closed on drop.
    Own(OwnedFd),
}

impl AsFd for ThisThread<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            ThisThread::Program(fd) => *fd,
            ThisThread::Own(fd) => fd.as_fd(),
        }
    }
}

impl Drop for GuestFd {
    fn drop(&mut self) {
        untrack(self.slot);
        close_ident(&self.ident);
    }
}

/// Closes `ident`'s descriptor if it verifies; otherwise forgets it and counts it lost.
/// Async-signal-safe.
fn close_ident(ident: &Ident) {
    if ident.verify() {
        // SAFETY: verified to be the descriptor vrange opened, which vrange owns.
        unsafe { libc::close(ident.fd) };
    } else {
        LOST.fetch_add(1, Relaxed);
    }
}

/// Whether descriptors 0, 1 and 2 are all open. While one is closed, a file vrange opens, even
/// for a moment, takes its number, and a program that is about to restore it with `dup2`
/// (CPython's subprocess tests close their standard descriptors around a spawn) would have
/// its restored descriptor closed by vrange's close. vrange defers its own file work until
/// they are open again. Three fcntl(2) calls; async-signal-safe. Always true in a thread with a
/// table of its own ([`crate::own_table`]): nothing it opens can take the program's numbers.
pub fn std_fds_open() -> bool {
    // SAFETY: F_GETFD has no memory effects; a closed descriptor is EBADF.
    crate::own_table::active() || (0..3).all(|fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0)
}

// ---- Opening without ever touching the program's standard descriptors ----

fn stat_identity(st: &libc::stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// Opens `path` (NUL-terminated) with `flags` and close-on-exec, as a guest must: only while
/// 0, 1 and 2 are open (else EAGAIN: try later, see [`std_fds_open`]). If the program closed
/// one of them in the moment between that check and the open, the new descriptor lands there:
/// it is then moved above 2, and the low number is closed only if it still is the file at
/// `path` (compared by device and inode); if it is not, the program has already put its own
/// file there (closing ours), and nothing is closed. Async-signal-safe.
///
/// # Errors
/// EAGAIN as above; the errno of open(2).
pub fn open_path(path: &std::ffi::CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    if !std_fds_open() {
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    }
    // SAFETY: path is NUL-terminated; callers that create pass their mode through flags
    // never (no O_CREAT here).
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    settle(fd, || {
        // SAFETY: stat is plain data that stat(2) fills; path is NUL-terminated.
        let mut want: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        (unsafe { libc::stat(path.as_ptr(), &mut want) } == 0).then(|| stat_identity(&want))
    })
}

/// Takes a descriptor vrange just opened (`fd` >= 0). Above 2 it is simply owned. At 0, 1 or 2
/// the program closed that number in the moment before the open: the descriptor is moved above
/// 2, and the low number closed only if it still is the file `expected` names (device and
/// inode, found again by path or name), else left to the program (counted lost) and EAGAIN
/// returned. Async-signal-safe.
///
/// # Errors
/// EAGAIN as above; EMFILE if no number above 2 is free.
pub fn settle(fd: RawFd, expected: impl Fn() -> Option<(u64, u64)>) -> io::Result<OwnedFd> {
    if fd > 2 || crate::own_table::active() {
        // SAFETY: just opened by the caller, owned by nobody else.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let is_ours = || match (expected(), stat(fd)) {
        (Some(want), Some((dev, ino, _))) => (dev, ino) == want,
        _ => false,
    };
    if !is_ours() {
        LOST.fetch_add(1, Relaxed);
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    }
    // SAFETY: F_DUPFD_CLOEXEC on an open descriptor returns a new one or -1.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if is_ours() {
        // SAFETY: verified ours a moment ago (see the function's documentation).
        unsafe { libc::close(fd) };
    } else {
        LOST.fetch_add(1, Relaxed);
    }
    if high < 0 {
        return Err(io::Error::from_raw_os_error(libc::EMFILE));
    }
    // SAFETY: just created by fcntl, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// [`open_path`] for a `Path` (allocates the C string: not async-signal-safe).
///
/// # Errors
/// As [`open_path`]; EINVAL for a path with a NUL byte.
pub fn open_path_buf(path: &std::path::Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    open_path(&c, flags)
}

/// Creates a descriptor with `create` (eventfd(2), userfaultfd(2), memfd_create(2): the result
/// or -1) only while 0, 1 and 2 are open. A new file that landed at 0, 1 or 2 anyway (the
/// program closed one in that moment) cannot be told from one the program put there since:
/// it is left alone, never used or closed (counted in [`Counts::lost`]), and EAGAIN returned.
///
/// # Errors
/// EAGAIN as above; the errno of `create`.
pub fn create_guarded(create: impl FnOnce() -> RawFd) -> io::Result<OwnedFd> {
    if !std_fds_open() {
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    }
    let fd = create();
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    if fd <= 2 && !crate::own_table::active() {
        LOST.fetch_add(1, Relaxed);
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    }
    // SAFETY: just created, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Writes `bytes` (one line of vrange's) to the program's standard error, in one write(2),
/// ignoring failure (a closed or full stderr must never disturb the program). From a thread
/// with a table of its own ([`crate::own_table`]), whose 2 is not the program's, it writes
/// through `/proc/self/fd/2` opened for the moment (appending, non-blocking: a pipe with no
/// reader or no room loses the line; a socket cannot be opened that way). Async-signal-safe.
pub fn write_stderr(bytes: &[u8]) {
    if !crate::own_table::active() {
        // SAFETY: writes initialised bytes to fd 2; failures are ignored.
        let _ = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        return;
    }
    let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_NONBLOCK | libc::O_NOCTTY;
    if let Ok(fd) = open_path(c"/proc/self/fd/2", flags) {
        // SAFETY: writes initialised bytes to a descriptor of this thread's own table.
        let _ = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
    }
}

// ---- Descriptors for one short operation ----

/// A descriptor vrange holds for one short operation (reading a /proc or cgroup file): opened
/// only while 0, 1 and 2 are open, moved above 2 if the program closed one meanwhile, and
/// closed on drop only if it still is the file opened (see the module documentation): a
/// program that closes a standard descriptor and restores it with `dup2` must never have its
/// restored descriptor closed by vrange.
#[derive(Debug)]
pub struct Transient(Ident);

impl Transient {
    /// Takes a descriptor [`open_path`] or [`settle`] gave (above 2), recording what it is.
    ///
    /// # Errors
    /// The errno of fstat(2) (the descriptor is closed then).
    fn adopt(fd: OwnedFd) -> io::Result<Transient> {
        let ident = Ident::of(fd.as_raw_fd()).ok_or_else(io::Error::last_os_error)?;
        let _ = fd.into_raw_fd();
        Ok(Transient(ident))
    }

    /// The descriptor (valid while `self` lives).
    pub fn raw(&self) -> RawFd {
        self.0.fd
    }
}

impl Drop for Transient {
    fn drop(&mut self) {
        close_ident(&self.0);
    }
}

/// Opens `path` (O_RDONLY or O_WRONLY, no creation) for one short operation, as a
/// [`Transient`].
///
/// # Errors
/// EAGAIN while one of 0, 1 and 2 is closed (see [`std_fds_open`]: try again later); the errno
/// of open(2).
pub fn open_transient(path: &std::path::Path, flags: libc::c_int) -> io::Result<Transient> {
    Transient::adopt(open_path_buf(path, flags)?)
}

/// [`open_transient`] for a NUL-terminated path, without allocating. Async-signal-safe.
///
/// # Errors
/// As [`open_transient`].
pub fn open_transient_c(path: &std::ffi::CStr, flags: libc::c_int) -> io::Result<Transient> {
    Transient::adopt(open_path(path, flags)?)
}

/// Writes `bytes` to `path` in one write(2) (a cgroup control file takes one command per
/// write) through a [`Transient`] descriptor; returns the bytes written.
///
/// # Errors
/// As [`open_transient`]; the errno of write(2).
pub fn write_once(path: impl AsRef<std::path::Path>, bytes: &[u8]) -> io::Result<usize> {
    let t = open_transient(path.as_ref(), libc::O_WRONLY)?;
    // SAFETY: bytes is readable for its length; t's descriptor is open while t lives.
    let n = unsafe { libc::write(t.raw(), bytes.as_ptr().cast(), bytes.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// The whole content of a small file (/proc, /sys, cgroup files), read through a
/// [`Transient`] descriptor: what vrange reads while it runs inside a program.
///
/// # Errors
/// As [`open_transient`]; the errno of read(2); EINVAL for content that is not UTF-8.
pub fn read_file(path: impl AsRef<std::path::Path>) -> io::Result<String> {
    let t = open_transient(path.as_ref(), libc::O_RDONLY)?;
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: buf is writable for its length; t's descriptor is open while t lives.
        let n = unsafe { libc::read(t.raw(), buf.as_mut_ptr().cast(), buf.len()) };
        match n {
            0 => break,
            n if n > 0 => bytes.extend_from_slice(&buf[..n as usize]),
            _ => {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }
    String::from_utf8(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

// ---- Counters ----

static LOST: AtomicU64 = AtomicU64::new(0);
static NO_ROOM: AtomicU64 = AtomicU64::new(0);

/// How often vrange found its descriptors gone, or could not place one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Descriptors found closed or replaced by the program before use; each was forgotten (not
    /// closed) and its owner opened a new one where it could.
    pub lost: u64,
    /// Descriptors not opened because no number above the floor was free.
    pub no_room: u64,
    /// Private descriptors held now (the reclaimer's sources).
    pub held: u64,
}

/// The counters since the process started.
pub fn counts() -> Counts {
    Counts {
        lost: LOST.load(Relaxed),
        no_room: NO_ROOM.load(Relaxed),
        held: PRIVATE.iter().filter(|s| s.load(Relaxed) >= 0).count() as u64,
    }
}

/// Counts a descriptor found broken by its user (the reclaimer's poll set).
pub fn count_lost() {
    LOST.fetch_add(1, Relaxed);
}

// ---- Cached descriptors of this process's own /proc files ----

/// A descriptor of one of this process's `/proc/self` files (maps, pagemap), opened on first
/// use and kept for the process's life, for ioctls that answer about the calling process.
///
/// Stored as `pid << 32 | fd` (0 when unset) plus device and inode, all atomics, so that
/// [`SelfFile::get`] is async-signal-safe. The pid guards against a descriptor inherited
/// across fork, which names the parent: the child opens its own and closes the inherited copy
/// if it still is that file. A descriptor the program closed or replaced is forgotten (never
/// closed, counted as lost) and opened again. A thread with a table of its own (the
/// reclaimer's, see [`crate::own_table`]) keeps a second copy there.
pub struct SelfFile {
    program: Cached,
    own: Cached,
    path: &'static std::ffi::CStr,
}

/// One table's descriptor of a [`SelfFile`].
struct Cached {
    packed: AtomicU64,
    dev: AtomicU64,
    ino: AtomicU64,
}

impl Cached {
    const fn new() -> Cached {
        Cached {
            packed: AtomicU64::new(0),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
        }
    }

    fn ident(packed: u64, dev: u64, ino: u64) -> Ident {
        Ident::from_parts(packed as u32 as i32, dev, ino)
    }
}

impl SelfFile {
    /// A descriptor of `path` (a `/proc/self/...` file), not opened yet.
    pub const fn new(path: &'static std::ffi::CStr) -> SelfFile {
        SelfFile {
            program: Cached::new(),
            own: Cached::new(),
            path,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &'static std::ffi::CStr {
        self.path
    }

    /// The verified descriptor for this process, opening it on first use, first use after
    /// fork, or after the program closed it. Async-signal-safe.
    ///
    /// # Errors
    /// The errno of opening the file; `EAGAIN` when another thread of a fork child raced.
    pub fn get(&self) -> io::Result<RawFd> {
        let c = if crate::own_table::active() {
            &self.own
        } else {
            &self.program
        };
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        let cached = c.packed.load(Acquire);
        let (dev, ino) = (c.dev.load(Acquire), c.ino.load(Acquire));
        let mine = cached != 0 && (cached >> 32) as u32 == pid;
        if mine {
            let ident = Cached::ident(cached, dev, ino);
            if ident.verify() {
                return Ok(ident.fd());
            }
            // Closed, or replaced by a file of the program's: forget it, never close it.
            count_lost();
        }
        let fresh = GuestFd::adopt(open_path(self.path, libc::O_RDONLY)?, Inherit::Keep)?.leak();
        c.dev.store(fresh.dev(), Release);
        c.ino.store(fresh.ino(), Release);
        let packed = (u64::from(pid) << 32) | u64::from(fresh.fd() as u32);
        match c.packed.compare_exchange(cached, packed, AcqRel, Acquire) {
            Ok(_) => {
                // Inherited from the parent (it names the parent's file, whose identity was
                // recorded before this child existed): the child's copy is closed if still it.
                if cached != 0 && !mine {
                    Cached::ident(cached, dev, ino).close();
                }
                Ok(fresh.fd())
            }
            Err(winner) => {
                fresh.close();
                if (winner >> 32) as u32 == pid {
                    Ok(winner as u32 as i32)
                } else {
                    Err(io::Error::from_raw_os_error(libc::EAGAIN))
                }
            }
        }
    }
}

// ---- Private table, for fork children ----

const SLOTS: usize = 16;
const FREE: i32 = -1;
const FILLING: i32 = -2;
static PRIVATE: [AtomicI32; SLOTS] = [const { AtomicI32::new(FREE) }; SLOTS];
/// Device, inode and anonymous id of each slot's descriptor, written before the slot's number.
static PRIVATE_ID: [[AtomicU64; 3]; SLOTS] =
    [const { [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)] }; SLOTS];

fn track(ident: &Ident) -> usize {
    for (i, s) in PRIVATE.iter().enumerate() {
        if s.compare_exchange(FREE, FILLING, AcqRel, Relaxed).is_ok() {
            let id = &PRIVATE_ID[i];
            id[0].store(ident.dev, Relaxed);
            id[1].store(ident.ino, Relaxed);
            id[2].store(ident.anon_id, Relaxed);
            s.store(ident.fd, Release);
            return i;
        }
    }
    // Full: the descriptor is still closed by its owner, only not by a fork child.
    usize::MAX
}

fn untrack(slot: usize) {
    if let Some(s) = PRIVATE.get(slot) {
        s.store(FREE, Release);
    }
}

/// In a fork child: closes the child's copies of vrange's private descriptors (the parent's
/// reclaimer's sources; the child has no reclaimer and opens its own when it needs them). Only
/// descriptors that still verify are closed. Async-signal-safe; call only from a fork child
/// handler, where no other thread exists.
pub fn close_private_after_fork() {
    for (s, id) in PRIVATE.iter().zip(&PRIVATE_ID) {
        let fd = s.swap(FREE, Acquire);
        if fd >= 0 {
            close_ident(&Ident {
                fd,
                dev: id[0].load(Relaxed),
                ino: id[1].load(Relaxed),
                anon_id: id[2].load(Relaxed),
            });
        }
    }
}

// ---- System calls ----

/// (device, inode, anonymous inode?) of `fd`; async-signal-safe.
fn stat(fd: RawFd) -> Option<(u64, u64, bool)> {
    // SAFETY: an all-zero stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one stat into `st`, which lives across the call; a bad fd is EBADF.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    // Anonymous inodes (eventfd, signalfd, timerfd, ...) carry no file type bits.
    let anon = st.st_mode & libc::S_IFMT == 0;
    Some((st.st_dev, st.st_ino, anon))
}

/// `eventfd-id` + 1 from `/proc/thread-self/fdinfo/<fd>` (this thread's table, which may be
/// its own), or 0 when absent (not an eventfd, a kernel before 5.16, no /proc, or no
/// descriptor free for the read). Async-signal-safe: the path and the text live on the stack.
fn eventfd_id(fd: RawFd) -> u64 {
    let mut path = [0u8; 48];
    let prefix = b"/proc/thread-self/fdinfo/";
    path[..prefix.len()].copy_from_slice(prefix);
    let n = write_decimal(&mut path[prefix.len()..], fd as u32 as u64);
    // path ends with the NUL left by the zeroed buffer.
    debug_assert!(prefix.len() + n < path.len());
    let Ok(cpath) = std::ffi::CStr::from_bytes_until_nul(&path) else {
        return 0;
    };
    let Ok(info) = open_path(cpath, libc::O_RDONLY) else {
        return 0;
    };
    let mut text = [0u8; 512];
    // SAFETY: reads at most text.len() bytes into `text`, which lives across the call.
    let len = unsafe { libc::read(info.as_raw_fd(), text.as_mut_ptr().cast(), text.len()) };
    // Above 2 and only this thread's for the moment of the read: closed by its owner.
    drop(info);
    let text = &text[..len.max(0) as usize];
    text.split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"eventfd-id:"))
        .and_then(parse_decimal)
        .map_or(0, |id| id.saturating_add(1))
}

/// Writes `v` in decimal at the start of `buf`; returns the digits written.
fn write_decimal(buf: &mut [u8], mut v: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..n {
        buf[i] = digits[n - 1 - i];
    }
    n
}

fn parse_decimal(v: &[u8]) -> Option<u64> {
    // Not `trim_ascii`: the crate's minimum Rust predates it.
    let start = v.iter().position(|b| !b.is_ascii_whitespace())?;
    let end = v.iter().rposition(|b| !b.is_ascii_whitespace())?;
    v[start..=end].iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Transient reads and writes close their descriptors (a hundred of each leave none; the
    /// margin absorbs descriptors other tests of this binary open meanwhile).
    #[test]
    fn transient_reads_leave_no_descriptor() {
        let target = std::env::temp_dir().join(format!("vrange-fd-test-{}", std::process::id()));
        std::fs::write(&target, "").unwrap();
        let count = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        let before = count();
        for _ in 0..100 {
            read_file("/proc/self/status").unwrap();
            write_once(&target, b"x").unwrap();
        }
        let _ = std::fs::remove_file(&target);
        assert!(
            count() < before + 50,
            "{} descriptors before, {} after",
            before,
            count()
        );
    }
    use std::os::fd::FromRawFd;

    fn eventfd() -> OwnedFd {
        // SAFETY: eventfd has no memory-safety preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd was just returned by eventfd.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    #[test]
    fn placed_high_and_cloexec() {
        let g = GuestFd::adopt(eventfd(), Inherit::Private).unwrap();
        assert!(g.raw() >= floor());
        // SAFETY: F_GETFD on a descriptor owned by `g`.
        let flags = unsafe { libc::fcntl(g.raw(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        assert!(g.get().is_some());
    }

    #[test]
    fn an_eventfd_put_in_its_place_is_not_ours() {
        let g = GuestFd::adopt(eventfd(), Inherit::Private).unwrap();
        let fd = g.raw();
        // The program puts an eventfd of its own at the same number. dup2 closes ours and
        // installs theirs in one step: a close then a dup2 would leave the number free for a
        // moment, for another test thread's descriptor to take and lose.
        let theirs = eventfd();
        // SAFETY: dup2 between two descriptors of this test.
        assert_eq!(unsafe { libc::dup2(theirs.as_raw_fd(), fd) }, fd);
        let lost = counts().lost;
        assert!(g.get().is_none(), "a different eventfd passed verification");
        drop(g);
        assert!(counts().lost > lost);
        // The program's descriptor is still open: vrange did not close it.
        // SAFETY: F_GETFD has no memory effects.
        assert!(unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0);
        // SAFETY: the test's own descriptor.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn a_file_put_in_its_place_is_not_ours() {
        let g = GuestFd::adopt(eventfd(), Inherit::Private).unwrap();
        let fd = g.raw();
        let theirs = std::fs::File::open("/proc/self/status").unwrap();
        // As above, dup2 replaces ours in one step.
        // SAFETY: dup2 between two descriptors of this test.
        assert_eq!(unsafe { libc::dup2(theirs.as_raw_fd(), fd) }, fd);
        assert!(!g.is_intact());
        drop(g);
        // SAFETY: F_GETFD has no memory effects.
        assert!(unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0);
        // SAFETY: the test's own descriptor.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn decimal_round_trip() {
        let mut buf = [0u8; 20];
        for v in [0u64, 7, 10, 992, u64::MAX] {
            let n = write_decimal(&mut buf, v);
            assert_eq!(parse_decimal(&buf[..n]), Some(v));
        }
        assert_eq!(parse_decimal(b"\t12\n"), Some(12));
        assert_eq!(parse_decimal(b"x"), None);
    }

    #[test]
    fn floor_follows_the_limit() {
        let f = floor();
        assert!(f > 2 && f < CAP);
    }
}
