//! [`ForkOnce`]: a value computed once per process, which a fork child computes again if a
//! thread of its parent was computing it at the fork.

use super::held::{ensure_installed, generation};
use crate::sync::backoff;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Release};

const EMPTY: u64 = 0;
const RUNNING: u64 = 1;
const DONE: u64 = 2;
const STATE: u64 = 3;

/// A one-time value, as `std::sync::OnceLock`, for what vrange computes on first use (the
/// kernel's features, the settings from the environment). A `OnceLock` whose initialisation
/// runs in one thread while another forks stays "running" forever in the child, and the child's
/// first use of vrange would wait for a thread it does not have. Here the state word records
/// the fork generation ([`generation`]) in which the computation started: a child that finds
/// one running from an earlier generation runs it again itself (the value that thread was
/// writing is overwritten, never dropped). Waiting spins, yields, then sleeps; never allocates
/// of its own. Values are never dropped (statics).
pub struct ForkOnce<T> {
    /// Bits 0–1: EMPTY, RUNNING or DONE; the bits above: the generation that started it.
    word: AtomicU64,
    value: UnsafeCell<MaybeUninit<T>>,
}

// SAFETY: the value is written by the one thread that won the state word (or took over from a
// thread the process does not have) and read only once the word says DONE (Release/Acquire).
unsafe impl<T: Send + Sync> Sync for ForkOnce<T> {}

impl<T> std::fmt::Debug for ForkOnce<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkOnce")
            .field("done", &(self.word.load(Acquire) & STATE == DONE))
            .finish()
    }
}

impl<T> Default for ForkOnce<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ForkOnce<T> {
    /// Not computed yet.
    pub const fn new() -> ForkOnce<T> {
        ForkOnce {
            word: AtomicU64::new(EMPTY),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// The value, once computed.
    pub fn get(&self) -> Option<&T> {
        (self.word.load(Acquire) & STATE == DONE).then(|| {
            // SAFETY: DONE is stored (Release) after the value is written, and never changes
            // after.
            unsafe { (*self.value.get()).assume_init_ref() }
        })
    }

    /// The value, computed by `init` if no thread has computed it yet; waits while a thread of
    /// this process computes it. `init` must not use this same value.
    pub fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
        if let Some(v) = self.get() {
            return v;
        }
        self.initialize(init)
    }

    #[cold]
    fn initialize(&self, init: impl FnOnce() -> T) -> &T {
        // The generations count only with the fork handlers in place.
        ensure_installed();
        let mut round = 0;
        loop {
            let word = self.word.load(Acquire);
            let mine = generation() << 2;
            let free = match word & STATE {
                DONE => break,
                EMPTY => true,
                // Started by a thread of a parent process, which this process does not have.
                _ => word & !STATE != mine,
            };
            if free
                && self
                    .word
                    .compare_exchange(word, mine | RUNNING, Acquire, Acquire)
                    .is_ok()
            {
                // A computation that panics leaves the value to the next caller, not RUNNING
                // for ever (which would make every later caller wait).
                let reset = Reset(&self.word);
                let v = init();
                std::mem::forget(reset);
                // SAFETY: this thread won the word: no other thread reads or writes the value
                // until DONE is stored.
                unsafe { (*self.value.get()).write(v) };
                self.word.store(mine | DONE, Release);
                break;
            }
            backoff(&mut round);
        }
        // SAFETY: DONE was seen (Acquire) or stored by this thread.
        unsafe { (*self.value.get()).assume_init_ref() }
    }
}

/// Puts a state word back to EMPTY when dropped (on unwinding out of a computation).
struct Reset<'a>(&'a AtomicU64);

impl Drop for Reset<'_> {
    fn drop(&mut self) {
        self.0.store(EMPTY, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;

    /// A computation in progress in another thread when the process forks: the child computes
    /// the value itself and does not wait; the parent gets the other thread's value.
    #[test]
    fn a_fork_child_computes_a_value_a_parent_thread_was_computing() {
        static VALUE: ForkOnce<u32> = ForkOnce::new();
        static STARTED: AtomicBool = AtomicBool::new(false);
        static FINISH: AtomicBool = AtomicBool::new(false);
        let computing = std::thread::spawn(|| {
            *VALUE.get_or_init(|| {
                STARTED.store(true, Relaxed);
                while !FINISH.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                1
            })
        });
        while !STARTED.load(Relaxed) {
            std::thread::yield_now();
        }
        // SAFETY: the child computes a value and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: alarm has no preconditions: a child that waits in vain is killed.
            unsafe { libc::alarm(20) };
            let v = *VALUE.get_or_init(|| 2);
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if v == 2 { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        FINISH.store(true, Relaxed);
        assert_eq!(computing.join().unwrap(), 1);
        assert_eq!(VALUE.get(), Some(&1));
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child computed its own value without waiting (status {status:#x})"
        );
    }

    /// A computation that panics leaves the value uncomputed: the next caller computes it.
    #[test]
    fn a_panicking_computation_lets_the_next_caller_compute() {
        static VALUE: ForkOnce<u32> = ForkOnce::new();
        let panicked = std::panic::catch_unwind(|| *VALUE.get_or_init(|| panic!("no value")));
        assert!(panicked.is_err());
        assert_eq!(VALUE.get(), None);
        assert_eq!(*VALUE.get_or_init(|| 3), 3);
    }

    /// Threads racing to compute: one computes, all see its value.
    #[test]
    fn one_thread_computes_and_all_see_it() {
        static VALUE: ForkOnce<usize> = ForkOnce::new();
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let threads: Vec<_> = (0..4)
            .map(|i| {
                std::thread::spawn(move || {
                    *VALUE.get_or_init(|| {
                        CALLS.fetch_add(1, Relaxed);
                        std::thread::sleep(Duration::from_millis(20));
                        i + 10
                    })
                })
            })
            .collect();
        let seen: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(CALLS.load(Relaxed), 1);
        assert!(seen.iter().all(|v| *v == seen[0]));
    }
}
