//! SIGBUS handlers for tests and benchmarks of SIGBUS mode and refill regions (vrange installs
//! none: the program, here the test or the benchmark's process, does).

/// A `SA_SIGINFO` handler.
pub type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// Installs `handler` for SIGBUS in this process: the program's own handler, in the tests
/// that play the program (outside the OS layer's fence on purpose).
#[allow(clippy::disallowed_methods)]
pub fn on_sigbus(handler: Handler) {
    // SAFETY: a zeroed sigaction is valid; the handler is an SA_SIGINFO function for the
    // process's lifetime; the mask is initialised empty.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()),
            0,
            "sigaction(SIGBUS)"
        );
    }
}

/// Restores SIGBUS's default action (death), from a handler too: async-signal-safe.
pub fn default_sigbus() {
    // SAFETY: signal(2) with SIG_DFL is async-signal-safe and has no memory effects.
    unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
}
