//! The allocator's settings, read once from `VRANGE_MALLOC_*` variables with `getenv` (no
//! allocation: the shim may be configured before anything else in the process runs).
//!
//! | variable                     | default  | meaning                                            |
//! |------------------------------|----------|----------------------------------------------------|
//! | `VRANGE_MALLOC_THRESHOLD`    | `64K`    | smallest request served (min 16K); smaller ones go to the system allocator |
//! | `VRANGE_MALLOC_MODE`         | `hybrid` | `hybrid`, `managed`, `lazy` (MADV_FREE at every free) or `off` |
//! | `VRANGE_MALLOC_THP`          | `auto`   | `auto`: chunks ask for huge pages where THP allows; `never` |
//! | `VRANGE_MALLOC_ARM_DELAY_MS` | core's   | sets `VRANGE_ARM_DELAY_MS` (hybrid: idle time before free memory goes to the kernel's lazy-free path) |
//! | `VRANGE_MALLOC_BUDGET`       | core's   | sets `VRANGE_BUDGET` (resident free bytes kept before the oldest are purged) |
//! | `VRANGE_MALLOC_STATS`        | `0`      | `1`: print a summary to stderr at exit             |

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};

/// How free memory is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Free spans are managed volatile ranges; idle ones are handed to the kernel's lazy-free
    /// path after the arm delay (whole chunks only where huge pages back them).
    Hybrid,
    /// Free spans are managed volatile ranges, purged only by the reclaimer.
    Managed,
    /// Every free advises the freed pages with MADV_FREE (the kernel alone decides).
    Lazy,
    /// The allocator serves nothing: every request goes to the system allocator.
    Off,
}

/// Smallest threshold accepted. Below it the allocator could be entered by the small
/// allocations vrange itself makes while it holds locks (thread creation, reports).
pub const MIN_THRESHOLD: usize = 16 << 10;
/// The default threshold.
pub const DEFAULT_THRESHOLD: usize = 64 << 10;

static THRESHOLD: AtomicUsize = AtomicUsize::new(DEFAULT_THRESHOLD);
static MODE: AtomicU8 = AtomicU8::new(0);
static THP: AtomicBool = AtomicBool::new(true);
static STATS: AtomicBool = AtomicBool::new(false);
/// 0: not read, 1: reading, 2: read.
static READ: AtomicU8 = AtomicU8::new(0);

/// Reads the environment once. Safe to call from any thread at any time; a thread that races
/// the first read sees the defaults until it is done.
pub fn init() {
    if READ.load(Acquire) == 2 || READ.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
        return;
    }
    if let Some(v) = var(b"VRANGE_MALLOC_THRESHOLD\0").and_then(parse_size) {
        THRESHOLD.store(v.max(MIN_THRESHOLD), Relaxed);
    }
    if let Some(v) = var(b"VRANGE_MALLOC_MODE\0") {
        let mode = match v {
            b"managed" => Mode::Managed,
            b"lazy" => Mode::Lazy,
            b"off" => Mode::Off,
            _ => Mode::Hybrid,
        };
        set_mode(mode);
    }
    if var(b"VRANGE_MALLOC_THP\0") == Some(b"never") {
        THP.store(false, Relaxed);
    }
    STATS.store(
        matches!(var(b"VRANGE_MALLOC_STATS\0"), Some(b"1" | b"on" | b"yes")),
        Relaxed,
    );
    for (ours, core) in [
        (&b"VRANGE_MALLOC_ARM_DELAY_MS\0"[..], "VRANGE_ARM_DELAY_MS"),
        (b"VRANGE_MALLOC_BUDGET\0", "VRANGE_BUDGET"),
    ] {
        if let Some(v) = var(ours).and_then(|v| std::str::from_utf8(v).ok()) {
            let _ = vrange::set_option(core, v);
        }
    }
    READ.store(2, Release);
}

/// The value of a variable; `name` ends with a NUL.
fn var(name: &[u8]) -> Option<&'static [u8]> {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: getenv reads the environment; the name is NUL-terminated. The returned string
    // stays valid unless the program changes that variable, which it has no reason to do.
    let p = unsafe { libc::getenv(name.as_ptr().cast()) };
    // SAFETY: getenv returned a NUL-terminated string (or null, handled).
    (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
}

/// Parses `123`, `64K`, `2M`, `1G` (binary units).
pub fn parse_size(v: &[u8]) -> Option<usize> {
    let (digits, shift) = match v.last()? {
        b'k' | b'K' => (&v[..v.len() - 1], 10),
        b'm' | b'M' => (&v[..v.len() - 1], 20),
        b'g' | b'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: usize = 0;
    for d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(usize::from(d - b'0'))?;
    }
    n.checked_mul(1 << shift)
}

/// The smallest request the allocator serves.
pub fn threshold() -> usize {
    THRESHOLD.load(Relaxed)
}

/// Sets the threshold (at least [`MIN_THRESHOLD`]).
pub fn set_threshold(bytes: usize) {
    THRESHOLD.store(bytes.max(MIN_THRESHOLD), Relaxed);
}

/// The mode.
pub fn mode() -> Mode {
    match MODE.load(Relaxed) {
        0 => Mode::Hybrid,
        1 => Mode::Managed,
        2 => Mode::Lazy,
        _ => Mode::Off,
    }
}

/// Sets the mode for free spans created from now on.
pub fn set_mode(mode: Mode) {
    MODE.store(mode as u8, Relaxed);
}

/// Whether chunks ask for transparent huge pages.
pub fn thp() -> bool {
    THP.load(Relaxed)
}

/// Whether a summary is printed at exit.
pub fn stats_at_exit() -> bool {
    STATS.load(Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size(b"64K"), Some(64 << 10));
        assert_eq!(parse_size(b"2m"), Some(2 << 20));
        assert_eq!(parse_size(b"1G"), Some(1 << 30));
        assert_eq!(parse_size(b"4096"), Some(4096));
        assert_eq!(parse_size(b"K"), None);
        assert_eq!(parse_size(b"12x"), None);
        assert_eq!(parse_size(b""), None);
        assert_eq!(parse_size(b"99999999999999999999"), None);
    }
}
