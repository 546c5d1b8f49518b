//! Forked children of the test harness, and a pipe pair to talk to them.
//!
//! A test process has many threads (libtest runs tests in parallel), so a forked child may only
//! do simple things: no allocation it can avoid, no locks (no `println!`). Everything here that
//! a child calls makes system calls only. Tests that fork hold [`crate::serial`].

// A forked child closes the descriptors it inherited by number (it leaves with `_exit`, so no
// destructor runs there); the OS layer's descriptor types are for vrange's own descriptors.
#![allow(clippy::disallowed_methods)]

use crate::proc::Exit;
use std::time::{Duration, Instant};

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Why [`Link::recv`] returned no message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkError {
    /// The other end closed (exited or crashed) after sending this many bytes of the message.
    Closed(usize),
    /// Nothing complete arrived in time.
    Timeout,
    /// poll(2) or read(2) failed with this errno.
    Os(i32),
}

/// One end of a two-way channel between forked processes: messages of `u64` words over a pair
/// of pipes. Allocation-free, so a forked child may use it. Closes its descriptors on drop.
#[derive(Debug)]
pub struct Link {
    rx: i32,
    tx: i32,
}

impl Link {
    /// A connected pair: what one end sends, the other receives.
    pub fn pair() -> (Link, Link) {
        let (mut a, mut b) = ([0i32; 2], [0i32; 2]);
        // SAFETY: pipe2 writes two descriptors into each two-element array.
        let ok = unsafe {
            libc::pipe2(a.as_mut_ptr(), libc::O_CLOEXEC) == 0
                && libc::pipe2(b.as_mut_ptr(), libc::O_CLOEXEC) == 0
        };
        assert!(ok, "pipe2: {}", std::io::Error::last_os_error());
        (Link { rx: a[0], tx: b[1] }, Link { rx: b[0], tx: a[1] })
    }

    /// Sends `words` as one write(2), atomic below PIPE_BUF; false if the other end is gone.
    pub fn send(&self, words: &[u64]) -> bool {
        let bytes = std::mem::size_of_val(words);
        debug_assert!(bytes <= libc::PIPE_BUF);
        loop {
            // SAFETY: words is readable for `bytes` bytes.
            let n = unsafe { libc::write(self.tx, words.as_ptr().cast(), bytes) };
            if n < 0 && last_errno() == libc::EINTR {
                continue;
            }
            return n == bytes as isize;
        }
    }

    /// Receives one message of `N` words, waiting at most `timeout` for all of it.
    pub fn recv<const N: usize>(&self, timeout: Duration) -> Result<[u64; N], LinkError> {
        let deadline = Instant::now() + timeout;
        let mut words = [0u64; N];
        let total = std::mem::size_of_val(&words);
        let mut got = 0;
        while got < total {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.rx,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: pfd is one valid pollfd.
            match unsafe { libc::poll(&mut pfd, 1, ms) } {
                0 => return Err(LinkError::Timeout),
                rc if rc < 0 && last_errno() == libc::EINTR => continue,
                rc if rc < 0 => return Err(LinkError::Os(last_errno())),
                _ => {}
            }
            // SAFETY: the destination is the unfilled tail of `words`, total - got bytes long.
            let n = unsafe {
                libc::read(
                    self.rx,
                    words.as_mut_ptr().cast::<u8>().add(got).cast(),
                    total - got,
                )
            };
            match n {
                0 => return Err(LinkError::Closed(got)),
                n if n < 0 && last_errno() == libc::EINTR => continue,
                n if n < 0 => return Err(LinkError::Os(last_errno())),
                n => got += n as usize,
            }
        }
        Ok(words)
    }

    /// Closes this end's descriptors in a forked process that inherited a link it does not use
    /// and will leave with `_exit` (so `Drop` never runs there).
    pub fn close_inherited(&self) {
        // SAFETY: closing descriptors this process owns; nothing in it uses them afterwards.
        unsafe {
            libc::close(self.rx);
            libc::close(self.tx);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.close_inherited();
    }
}

/// A forked child process. Dropping it without [`Forked::wait`] kills (SIGKILL) and reaps it,
/// so a failing test never leaves one behind.
#[derive(Debug)]
pub struct Forked {
    pid: i32,
    reaped: bool,
}

impl Forked {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for the child to end, at most `timeout`; past it the child is killed and reaped
    /// and [`Exit::TimedOut`] returned. Allocation-free.
    pub fn wait(&mut self, timeout: Duration) -> Exit {
        self.ended_within(timeout).unwrap_or_else(|| {
            self.kill();
            Exit::TimedOut
        })
    }

    /// As [`Forked::wait`], but a child still running after `timeout` is described before it
    /// is killed: what each of its threads is doing ([`crate::proc::task_states`]), for the
    /// report of a child that hung.
    pub fn wait_or_describe(&mut self, timeout: Duration) -> Result<Exit, String> {
        self.ended_within(timeout).ok_or_else(|| {
            let states = crate::proc::task_states(self.pid);
            self.kill();
            states
        })
    }

    /// How the child ended, if it has (reaped); None if it still runs. Does not wait.
    pub fn try_ended(&mut self) -> Option<Exit> {
        if self.reaped {
            return None;
        }
        self.ended_within(Duration::ZERO)
    }

    /// How the child ended, if it did within `timeout` (reaped); None if it still runs.
    fn ended_within(&mut self, timeout: Duration) -> Option<Exit> {
        let deadline = Instant::now() + timeout;
        let mut status = 0;
        loop {
            // SAFETY: status is a valid int; pid is our unreaped child.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if rc == self.pid {
                self.reaped = true;
                return Some(Exit::from_wait_status(status));
            }
            if rc < 0 && last_errno() != libc::EINTR {
                self.reaped = true;
                return Some(Exit::Code(-1));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn kill(&mut self) {
        // SAFETY: pid is our unreaped child, so it cannot have been recycled; status may be
        // null.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
        self.reaped = true;
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill();
        }
    }
}

/// Forks. The child runs `body` with its end of a fresh [`Link`] and leaves with
/// `_exit(body's result)`, or `_exit(Exit::PANICKED)` if it panics; it never returns into the
/// test harness. The parent gets the child and its own end of the link.
pub fn fork_linked(body: impl FnOnce(&Link) -> i32) -> (Forked, Link) {
    let (ours, theirs) = Link::pair();
    // SAFETY: the child below only runs `body` (which the caller keeps to simple,
    // allocation-free work) and leaves with _exit, never returning into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        drop(ours);
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&theirs)))
            .unwrap_or(Exit::PANICKED);
        // SAFETY: _exit ends this process at once, without running the parent's atexit
        // handlers or destructors.
        unsafe { libc::_exit(code) };
    }
    drop(theirs);
    (Forked { pid, reaped: false }, ours)
}

/// Forks while another thread of this process is inside `hold`: `hold` takes whatever it must
/// hold (a lock) and calls the function it is given, which returns once the child has ended.
/// The child runs `child` (true: exit 0) and has `limit` to end; returns how it ended (a child
/// that waits for the other thread never ends: [`Exit::TimedOut`]).
pub fn fork_while(
    hold: impl FnOnce(&dyn Fn()) + Send + 'static,
    child: impl FnOnce() -> bool,
    limit: Duration,
) -> Exit {
    use std::sync::mpsc;
    let (held_tx, held) = mpsc::channel::<()>();
    let (release, release_rx) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        hold(&|| {
            let _ = held_tx.send(());
            let _ = release_rx.recv();
        })
    });
    held.recv().expect("the holding thread reached its wait");
    let (mut forked, _link) = fork_linked(|_| if child() { 0 } else { 1 });
    let exit = forked.wait(limit);
    let _ = release.send(());
    holder.join().expect("the holding thread");
    exit
}
