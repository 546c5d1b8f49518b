//! One userfaultfd of the process, held the way every vrange descriptor is: a `GuestFd` (above
//! the floor, close-on-exec, verified before each use, closed only if verified), its identity
//! copied into atomics so that async-signal-safe code (`vrange::fill` in a SIGBUS handler) can
//! verify and use it without a lock. SIGBUS mode and refill regions each hold one.

use crate::Error;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicI32, AtomicU64};
use vrange_sys::fd::{GuestFd, Ident, Inherit};
use vrange_sys::lock::{Lock, Rank, RankedMutex};
use vrange_sys::uffd::Reach;

pub(crate) struct Held {
    /// Bumped by every descriptor opened: tells a user of the old one that it was replaced.
    generation: AtomicU64,
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
    /// Serialises opening; held across fork.
    pub open: Lock,
    /// The owner of the open descriptor (dropped only when replaced).
    owner: RankedMutex<Option<GuestFd>>,
}

/// What [`Held::ensure`] found.
pub(crate) struct Opened {
    pub fd: RawFd,
    /// A descriptor was open before and is gone (the program closed it): whatever was
    /// registered on it must be registered again.
    pub replaced: bool,
}

impl Held {
    /// `open` is the rank of its opening lock, `child` its module's hook in a fork child
    /// (run with that lock held).
    pub const fn new(open: Rank, child: fn()) -> Held {
        Held {
            generation: AtomicU64::new(0),
            fd: AtomicI32::new(-1),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
            open: Lock::with_child_hook(open, Some(child)),
            owner: RankedMutex::new(Rank::UffdOwner, None),
        }
    }

    /// Which descriptor is the current one: changes each time one is opened.
    pub fn generation(&self) -> u64 {
        self.generation.load(Acquire)
    }

    /// Whether a descriptor was ever opened in this process (one relaxed load).
    pub fn ever_opened(&self) -> bool {
        self.fd.load(Relaxed) >= 0
    }

    /// The descriptor if it is open and still the one vrange opened. Async-signal-safe:
    /// atomics and one fstat(2).
    pub fn current(&self) -> Option<RawFd> {
        let fd = self.fd.load(Acquire);
        if fd < 0 {
            return None;
        }
        let ident = Ident::from_parts(fd, self.dev.load(Relaxed), self.ino.load(Relaxed));
        ident.verify().then_some(fd)
    }

    /// The descriptor, opened now with `open` if there is none or the program closed it.
    ///
    /// # Errors
    /// `Error::Os(ENOTSUP)` where userfaultfd is unavailable or not allowed; `Error::Os(EAGAIN)`
    /// while the program has 0, 1 or 2 closed; the errno of placing the descriptor (EMFILE).
    pub fn ensure(
        &'static self,
        open: fn() -> io::Result<(OwnedFd, Reach)>,
    ) -> Result<Opened, Error> {
        if let Some(fd) = self.current() {
            return Ok(Opened {
                fd,
                replaced: false,
            });
        }
        let _open = self.open.lock();
        if let Some(fd) = self.current() {
            return Ok(Opened {
                fd,
                replaced: false,
            });
        }
        let (owned, _reach) = open().map_err(|e| match e.raw_os_error() {
            // EAGAIN: 0, 1 or 2 was closed at that moment (see vrange_sys::fd::create_guarded).
            Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN) => Error::from(e),
            _ => Error::Os(libc::ENOTSUP),
        })?;
        let guest = GuestFd::adopt(owned, Inherit::Private)?;
        let ident = guest.ident();
        let replaced = self.fd.load(Relaxed) >= 0;
        self.dev.store(ident.dev(), Relaxed);
        self.ino.store(ident.ino(), Relaxed);
        self.fd.store(ident.fd(), Release);
        self.generation.fetch_add(1, Release);
        // The old owner, if any, is dropped: closed only if it still verifies (it does not:
        // that is why a new one was opened), else counted lost.
        *self.owner.lock() = Some(guest);
        Ok(Opened {
            fd: ident.fd(),
            replaced,
        })
    }

    /// In a fork child (under `open`, held by the fork handlers): the parent's descriptor
    /// (whose registrations did not come along) was closed by `fd::close_private_after_fork`;
    /// forget it without running destructors. Async-signal-safe.
    pub fn after_fork_child(&self) {
        self.fd.store(-1, Relaxed);
        if let Some(mut owner) = self.owner.try_lock() {
            std::mem::forget(owner.take());
        }
    }
}
