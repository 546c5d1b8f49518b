//! Process-wide hooks and facts: fork and exit handlers, and the CPU a thread runs on. Owns
//! `pthread_atfork`, `atexit` and `sched_getcpu`, so that everything vrange installs in a
//! process is registered here (README, "A guest in your process", lists it).

/// A handler for [`at_fork`] or [`at_exit`]: a plain function, valid for the program's life.
pub type Handler = extern "C" fn();

/// Registers fork handlers: `prepare` runs in the forking thread before the fork (handlers
/// registered later run earlier), `parent` and `child` after it, in registration order.
///
/// # Errors
/// ENOMEM from pthread_atfork(3).
pub fn at_fork(prepare: Handler, parent: Handler, child: Handler) -> std::io::Result<()> {
    // SAFETY: the handlers are plain functions valid for the program's life.
    let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// Registers `handler` to run at `exit(3)` (not at `_exit(2)` or a fatal signal).
///
/// # Errors
/// ENOMEM when atexit(3) has no room.
pub fn at_exit(handler: Handler) -> std::io::Result<()> {
    // SAFETY: the handler is a plain function valid for the program's life.
    if unsafe { libc::atexit(handler) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(libc::ENOMEM))
    }
}

/// The CPU the calling thread runs on now (it may move at any moment), or `None`. No system call
/// on x86-64 (vDSO `getcpu` through glibc's `sched_getcpu`).
#[inline]
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}
