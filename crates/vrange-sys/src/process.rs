//! Process-wide hooks and facts: fork and exit handlers, the SIGBUS handler a program may ask
//! for, the CPU a thread runs on and the process's page faults. Owns `pthread_atfork`,
//! `atexit`, `sigaction`, `sched_getcpu` and `getrusage`, so that everything vrange installs in
//! a process is registered here (README, "A guest in your process", lists it).

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

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

/// Page faults of this process so far, over all its threads (getrusage(2) `RUSAGE_SELF`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// Served without I/O (`ru_minflt`): a fresh zero page, a page still in memory.
    pub minor: u64,
    /// That read a page in (`ru_majflt`).
    pub major: u64,
}

/// This process's page faults so far.
pub fn page_faults() -> Faults {
    // SAFETY: all-zero bytes are a valid `rusage`, which getrusage fills; RUSAGE_SELF cannot
    // fail with a valid pointer.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    Faults {
        minor: u.ru_minflt as u64,
        major: u.ru_majflt as u64,
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

/// Spawns a thread that never receives the process's asynchronous signals: every signal is
/// blocked in it from its first instruction (blocked in the caller around the spawn, which the
/// new thread inherits, then restored in the caller). A library's background thread must not
/// take a `kill(getpid(), SIG)` that the program blocked in its own threads to keep it pending
/// (`sigpending`, `sigwait`), nor run the program's handlers at unexpected moments.
///
/// # Errors
/// As `std::thread::Builder::spawn`.
pub fn spawn_without_signals<F>(name: &str, f: F) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    with_signals_blocked(|| std::thread::Builder::new().name(name.into()).spawn(f))
}

/// Runs `f` (which spawns threads) with every signal blocked in the calling thread, then
/// restores the caller's mask: threads created meanwhile start with every signal blocked.
pub fn with_signals_blocked<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: sigset_t is plain data; sigfillset initialises it.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigfillset and pthread_sigmask write only the sets, which live across the calls.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
    }
    let r = f();
    // SAFETY: restores the caller's own mask, saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

/// Raises SIGBUS in thread `tid` of this process for a fault at `addr`: `si_addr` is `addr`,
/// `si_code` SI_QUEUE (rt_tgsigqueueinfo(2) lets a thread give another a kernel-style code
/// only when it signals itself). For faults a vrange thread resolves on another thread's
/// behalf and cannot (a refill that failed): the handler finds the address where a fault puts
/// it.
///
/// # Errors
/// ESRCH if the thread is gone; the errno of rt_tgsigqueueinfo otherwise.
pub fn raise_sigbus(tid: i32, addr: usize) -> std::io::Result<()> {
    // siginfo_t for SIGBUS: si_signo, si_errno, si_code, then (x86-64 and arm64) the fault
    // union at byte 16, whose first field is si_addr.
    #[repr(C)]
    struct SigFault {
        signo: i32,
        errno: i32,
        code: i32,
        _pad: i32,
        addr: usize,
        _rest: [u64; 13],
    }
    const _: () =
        assert!(std::mem::size_of::<SigFault>() == std::mem::size_of::<libc::siginfo_t>());
    let info = SigFault {
        signo: libc::SIGBUS,
        errno: 0,
        code: libc::SI_QUEUE,
        _pad: 0,
        addr,
        _rest: [0; 13],
    };
    // SAFETY: getpid has no preconditions; info is a complete siginfo_t-sized value that the
    // kernel only reads.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            libc::getpid(),
            tid,
            libc::SIGBUS,
            &info as *const SigFault,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What vrange's SIGBUS handler asks first (see [`hook_sigbus`]): whether it resolved the
/// fault at this address, so that returning retries the access. Called in a signal handler.
pub type SigbusHook = fn(addr: usize) -> bool;

/// The hook and the action it was installed in front of.
struct Chain {
    hook: SigbusHook,
    previous: libc::sigaction,
}

/// The chain the handler follows: null until an install is attempted, then a leaked `Chain`
/// for the process's life (freed again only if that install failed, when no handler can read
/// it).
static CHAIN: AtomicPtr<Chain> = AtomicPtr::new(std::ptr::null_mut());
/// Set once sigaction(2) installed the handler: later calls return at once. A failed install
/// leaves it clear, so the next call tries again, with the program's action read afresh.
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Test seam: the next install fails as sigaction(2) would, with EINVAL.
#[cfg(test)]
static FAIL_NEXT_INSTALL: AtomicBool = AtomicBool::new(false);

/// Installs vrange's SIGBUS handler, once per process, in front of the program's action:
/// a SIGBUS raised by a fault (`si_code` > 0) whose address `hook` resolves returns at once
/// (the access is retried); every other SIGBUS goes to the action that was in place when this
/// was first called (its handler is called with the same arguments; the default action
/// terminates the process, as it would have; an ignored one is ignored, except for a fault,
/// which the kernel never lets a process ignore). Only for programs that asked for it (refill
/// regions filled on the faulting thread): vrange installs no signal handler otherwise. Later
/// calls keep the first hook. The handler runs on the faulting thread's own stack (no
/// SA_ONSTACK: an alternate signal stack is sized for a stack overflow's report, not for a
/// fill), with SIGBUS blocked and SA_RESTART.
///
/// # Errors
/// The errno of sigaction(2).
pub fn hook_sigbus(hook: SigbusHook) -> std::io::Result<()> {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: a zeroed sigaction is valid plain data; sigaction(2) with a null new action only
    // reads the current one.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Published before the handler is installed: a SIGBUS arriving in between finds the chain.
    let chain = Box::into_raw(Box::new(Chain { hook, previous }));
    CHAIN.store(chain, Ordering::Release);
    let installed = install();
    if installed.is_err() {
        CHAIN.store(std::ptr::null_mut(), Ordering::Release);
        // SAFETY: `chain` came from Box::into_raw above, and the handler that would read it was
        // never installed (INSTALLED is clear and this install failed), so nothing else holds it.
        drop(unsafe { Box::from_raw(chain) });
        return installed;
    }
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// Puts [`on_sigbus`] in place as SIGBUS's action.
fn install() -> std::io::Result<()> {
    #[cfg(test)]
    if FAIL_NEXT_INSTALL.swap(false, Ordering::Relaxed) {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a zeroed sigaction is valid plain data; the handler is a plain function for the
    // process's life.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigbus as *const () as usize;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: sigemptyset initialises the mask; sigaction(2) reads the new action.
    let rc = unsafe {
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// vrange's SIGBUS handler (see [`hook_sigbus`]). Async-signal-safe as far as the hook is.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: CHAIN is null or a `Chain` leaked for the process's life (it is freed only when
    // this handler was never installed).
    let Some(chain) = (unsafe { CHAIN.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    let fault = code > 0;
    if fault && (chain.hook)(addr) {
        return;
    }
    let previous = &chain.previous;
    match previous.sa_sigaction {
        libc::SIG_DFL => {
            // SAFETY: signal(2) is async-signal-safe. A fault happens again when the access
            // is retried, now with the default action; a sent signal is sent again (delivered
            // when this handler returns and SIGBUS is unblocked).
            unsafe {
                libc::signal(libc::SIGBUS, libc::SIG_DFL);
                if !fault {
                    libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), sig);
                }
            }
        }
        libc::SIG_IGN => {
            if fault {
                // SAFETY: as above: the kernel does not let a fault be ignored.
                unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
            }
        }
        handler if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the program installed this SA_SIGINFO handler for SIGBUS.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(handler) };
            f(sig, info, ctx);
        }
        handler => {
            // SAFETY: the program installed this plain handler for SIGBUS.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            f(sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_fresh_pages_counts_minor_faults() {
        const PAGES: usize = 64;
        let len = PAGES * crate::mem::page_size();
        let map = crate::mem::map_anon(len, crate::mem::page_size()).unwrap();
        // One huge page would serve the range in one fault.
        let _ = crate::mem::advise_huge(map.as_ptr(), len, false);
        let before = page_faults();
        for i in 0..PAGES {
            // SAFETY: inside the test's own fresh mapping.
            unsafe { map.as_ptr().add(i * crate::mem::page_size()).write(1) };
        }
        let after = page_faults();
        // SAFETY: the test's mapping, no longer used.
        unsafe { crate::mem::unmap(map, len) };
        assert!(
            after.minor >= before.minor + PAGES as u64,
            "{before:?} -> {after:?}"
        );
    }

    fn current_handler() -> usize {
        // SAFETY: a zeroed sigaction is valid plain data; a null new action only reads.
        let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let rc = unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut now) };
        assert_eq!(rc, 0);
        now.sa_sigaction
    }

    fn resolves_nothing(_addr: usize) -> bool {
        false
    }

    #[test]
    fn a_failed_install_is_tried_again_by_the_next_call() {
        let before = current_handler();
        assert_ne!(before, on_sigbus as *const () as usize);
        FAIL_NEXT_INSTALL.store(true, Ordering::Relaxed);
        let err = hook_sigbus(resolves_nothing).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(
            current_handler(),
            before,
            "a failed install leaves the program's action"
        );
        assert!(CHAIN.load(Ordering::Acquire).is_null());

        hook_sigbus(resolves_nothing).unwrap();
        assert_eq!(current_handler(), on_sigbus as *const () as usize);
        // SAFETY: installed, so CHAIN holds a chain leaked for the process's life.
        let chain = unsafe { &*CHAIN.load(Ordering::Acquire) };
        assert_eq!(
            chain.previous.sa_sigaction, before,
            "chained to the program's action"
        );
        hook_sigbus(resolves_nothing).unwrap();
        assert_eq!(current_handler(), on_sigbus as *const () as usize);
    }
}
