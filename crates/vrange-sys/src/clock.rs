//! The monotonic clock the managed path ages ranges by. CLOCK_MONOTONIC is read through the
//! vDSO (no system call, about 20 ns) and is system-wide, so processes sharing a region compare
//! their timestamps directly.

/// Nanoseconds of CLOCK_MONOTONIC. Async-signal-safe.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-parameter; CLOCK_MONOTONIC is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}
