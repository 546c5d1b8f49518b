//! A fixed-capacity poll set over the pressure sources; nothing in it allocates.

use super::*;

/// Why [`Poller::add`] refused a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddError {
    /// The poller already holds [`POLLER_CAPACITY`] sources.
    Full,
    /// This fd is already in the set.
    Duplicate,
    /// The fd is negative.
    BadFd,
}

impl fmt::Display for AddError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddError::Full => "poller is full",
            AddError::Duplicate => "fd already in the poller",
            AddError::BadFd => "negative fd",
        })
    }
}

impl std::error::Error for AddError {}

/// A fixed-capacity poll set over up to [`POLLER_CAPACITY`] pressure sources. Nothing in it
/// allocates. Several sources may share a signal (two cgroup triggers, say).
///
/// It holds the sources' identities, not the sources: a source that fires is verified (see
/// `vrange_sys::fd`) before it is drained, and one that no longer is what was added (dropped, or
/// closed by the program and its number reused) is reported broken, never read. Remove a
/// source before dropping it all the same.
pub struct Poller {
    fds: [libc::pollfd; POLLER_CAPACITY],
    idents: [Option<Ident>; POLLER_CAPACITY],
    signals: [Signal; POLLER_CAPACITY],
    len: usize,
}

impl Poller {
    /// An empty set.
    pub fn new() -> Poller {
        Poller {
            fds: [libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }; POLLER_CAPACITY],
            idents: [None; POLLER_CAPACITY],
            signals: [Signal::Wake; POLLER_CAPACITY],
            len: 0,
        }
    }

    /// Adds a source: PSI trigger fds ([`Signal::PsiSystem`], [`Signal::PsiCgroup`]) are
    /// polled for POLLPRI, all others are eventfds polled for POLLIN and drained when they fire.
    ///
    /// # Errors
    /// [`AddError`]; the set is unchanged.
    pub fn add(&mut self, source: Ident, signal: Signal) -> Result<(), AddError> {
        let fd = source.fd();
        if fd < 0 {
            return Err(AddError::BadFd);
        }
        if self.fds[..self.len].iter().any(|p| p.fd == fd) {
            return Err(AddError::Duplicate);
        }
        if self.len == POLLER_CAPACITY {
            return Err(AddError::Full);
        }
        self.fds[self.len] = libc::pollfd {
            fd,
            events: if signal.is_psi() {
                // A PSI fd is always readable (it shows the averages); only POLLPRI means a
                // trigger event.
                libc::POLLPRI
            } else {
                libc::POLLIN
            },
            revents: 0,
        };
        self.idents[self.len] = Some(source);
        self.signals[self.len] = signal;
        self.len += 1;
        Ok(())
    }

    /// Removes every source of `signal`; returns how many there were.
    pub fn remove(&mut self, signal: Signal) -> usize {
        let mut removed = 0;
        let mut i = 0;
        while i < self.len {
            if self.signals[i] == signal {
                self.remove_at(i);
                removed += 1;
            } else {
                i += 1;
            }
        }
        removed
    }

    /// Removes the source with descriptor `fd`; returns whether it was there.
    pub fn remove_fd(&mut self, fd: RawFd) -> bool {
        match self.fds[..self.len].iter().position(|p| p.fd == fd) {
            Some(i) => {
                self.remove_at(i);
                true
            }
            None => false,
        }
    }

    /// Number of sources.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no sources (a wait then only times out).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the order of the others, so that signals are reported the same way every time.
    fn remove_at(&mut self, i: usize) {
        self.fds.copy_within(i + 1..self.len, i);
        self.idents.copy_within(i + 1..self.len, i);
        self.signals.copy_within(i + 1..self.len, i);
        self.len -= 1;
    }

    /// Verifies every source (see `vrange_sys::fd`): those that are no longer what was added are
    /// removed and returned, as [`Ready::broken`] would report them. One fstat(2) per source.
    pub fn check(&mut self) -> Signals {
        let mut broken = Signals::empty();
        let mut i = 0;
        while i < self.len {
            if self.idents[i].is_some_and(|id| id.verify()) {
                i += 1;
            } else {
                crate::fd::count_lost();
                broken.insert(self.signals[i]);
                self.remove_at(i);
            }
        }
        broken
    }

    /// Waits up to `timeout` (`None`: forever; rounded up to whole milliseconds) for any source
    /// and returns what fired. Eventfds that fired are drained, so the same event does not fire
    /// again. Sources that report POLLERR, POLLHUP or POLLNVAL are removed from the set and
    /// reported in [`Ready::broken`], never as fired. An interrupted wait (EINTR) and a timeout
    /// both return an empty [`Ready`]. An empty set with `None` waits until a signal
    /// interrupts it. No allocation: one poll(2) plus one read(2) per eventfd that fired.
    ///
    /// # Errors
    /// The errno of poll(2) other than EINTR (EFAULT, ENOMEM).
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<Ready> {
        let ms = match timeout {
            None => -1,
            Some(d) => d
                .as_nanos()
                .div_ceil(1_000_000)
                .min(libc::c_int::MAX as u128) as libc::c_int,
        };
        for p in &mut self.fds[..self.len] {
            p.revents = 0;
        }
        // SAFETY: the first `len` entries of `fds` are initialised pollfds, and `fds` is
        // borrowed mutably for the call.
        let rc = unsafe { libc::poll(self.fds.as_mut_ptr(), self.len as libc::nfds_t, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EINTR) {
                Ok(Ready::default())
            } else {
                Err(e)
            };
        }
        let mut ready = Ready::default();
        if rc == 0 {
            return Ok(ready);
        }
        let mut i = 0;
        while i < self.len {
            let p = self.fds[i];
            let signal = self.signals[i];
            if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                // A removed cgroup's PSI file reports POLLERR|POLLPRI: broken, not pressure.
                // POLLNVAL: the descriptor was closed under us.
                ready.broken.insert(signal);
                self.remove_at(i);
                continue;
            }
            if p.revents & p.events != 0 {
                // A descriptor the program put at this number (closefrom, then open) is never
                // read: what fired is not ours.
                if !self.idents[i].is_some_and(|id| id.verify()) {
                    crate::fd::count_lost();
                    ready.broken.insert(signal);
                    self.remove_at(i);
                    continue;
                }
                if signal.is_eventfd() {
                    // SAFETY: verified just above to be the eventfd that was added.
                    read_eventfd(unsafe { BorrowedFd::borrow_raw(p.fd) });
                }
                ready.fired.insert(signal);
            }
            i += 1;
        }
        Ok(ready)
    }
}

impl Default for Poller {
    fn default() -> Poller {
        Poller::new()
    }
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries((0..self.len).map(|i| (self.fds[i].fd, self.signals[i])))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poller_bookkeeping() {
        let mut p = Poller::new();
        assert_eq!(p.add(Ident::fake(-1), Signal::Wake), Err(AddError::BadFd));
        for fd in 100..100 + POLLER_CAPACITY as RawFd {
            let signal = if fd % 2 == 0 {
                Signal::PsiCgroup
            } else {
                Signal::Wake
            };
            p.add(Ident::fake(fd), signal).unwrap();
        }
        assert_eq!(
            p.add(Ident::fake(100), Signal::Wake),
            Err(AddError::Duplicate)
        );
        assert_eq!(p.add(Ident::fake(1000), Signal::Wake), Err(AddError::Full));
        assert_eq!(p.remove(Signal::PsiCgroup), POLLER_CAPACITY / 2);
        assert_eq!(p.len(), POLLER_CAPACITY / 2);
        assert!(p.fds[..p.len].iter().all(|f| f.fd % 2 == 1));
        assert!(p.remove_fd(101));
        assert!(!p.remove_fd(101));
        assert_eq!(p.len(), POLLER_CAPACITY / 2 - 1);
    }
}
