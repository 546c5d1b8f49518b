//! The eventfd another thread (or a signal handler) writes to wake a poller.

use super::*;

/// An eventfd that wakes a [`Poller`] from another thread or a signal handler. Wakes before the
/// waiter gets to them coalesce into one.
#[derive(Debug)]
pub struct Waker {
    fd: GuestFd,
}

impl Waker {
    /// A new, unsignalled waker.
    ///
    /// # Errors
    /// The errno of eventfd(2) (EMFILE, ENFILE, ENOMEM).
    pub fn new() -> io::Result<Waker> {
        Ok(Waker {
            fd: GuestFd::adopt(new_eventfd()?, Inherit::Private)?,
        })
    }

    /// Wakes the waiter (now, or at its next wait). Async-signal-safe: a verification of the
    /// eventfd (see `vrange_sys::fd`) and one write(2), no allocation, no lock. Returns false if the
    /// eventfd is no longer vrange's (the program closed it): nothing was written, and the
    /// waiter sees the loss at its next wait. The only write error, EAGAIN, means the counter
    /// is saturated, so a wake-up is pending anyway.
    pub fn wake(&self) -> bool {
        let Some(fd) = self.fd.get() else {
            return false;
        };
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, which lives across the call, to the eventfd this
        // value owns, verified just now.
        unsafe {
            libc::write(
                fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        true
    }

    /// The eventfd's number (unverified; for display).
    pub fn fd(&self) -> RawFd {
        self.fd.raw()
    }

    /// The eventfd's identity, to poll for POLLIN; [`Poller::wait`] drains it.
    pub fn ident(&self) -> Ident {
        self.fd.ident()
    }

    /// Whether its eventfd is still the one opened.
    pub fn is_intact(&self) -> bool {
        self.fd.is_intact()
    }
}
