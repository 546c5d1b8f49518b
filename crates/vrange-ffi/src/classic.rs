//! The classic calls on arbitrary memory (and on regions, following their policy): `vrange`,
//! `vrange_unmark`, `vrange_forget`, and `vrange_fill` for SIGBUS mode.

use crate::guard;
use libc::{c_int, size_t, ssize_t};
use vrange_core::{Error, Mode};

/// `mode` value: the system may discard the pages under memory pressure.
pub const VRANGE_VOLATILE: c_int = 0;
/// `mode` value: pin the pages again; `*purged` says whether anything was discarded.
pub const VRANGE_NOVOLATILE: c_int = 1;
/// `mode` bit with `VRANGE_VOLATILE` (and `vrange_alloc` flag): SIGBUS mode.
pub use crate::flags::VRANGE_SIGBUS;

/// Marks or unmarks `[start, start + length)`; see `vrange(2)` in include/vrange.h.
///
/// # Safety
/// `start` must be memory the caller owns; `purged` must be NULL or point to a writable int.
#[no_mangle]
pub unsafe extern "C" fn vrange(
    start: libc::c_ulong,
    length: size_t,
    mode: c_int,
    purged: *mut c_int,
) -> ssize_t {
    guard(-1, || {
        let mode = match mode {
            VRANGE_VOLATILE => Mode::Volatile,
            m if m == VRANGE_VOLATILE | VRANGE_SIGBUS => Mode::VolatileSigbus,
            VRANGE_NOVOLATILE => Mode::NoVolatile,
            _ => return Err(Error::BadMode),
        };
        // SAFETY: the caller owns the memory (documented contract of vrange()).
        let (n, report) = unsafe { vrange_core::vrange(start as usize as *mut u8, length, mode)? };
        if mode == Mode::NoVolatile && !purged.is_null() {
            // SAFETY: the caller passes NULL or a writable int.
            unsafe { *purged = c_int::from(report.was_purged()) };
        }
        Ok(n as ssize_t)
    })
}

/// Unmarks like `vrange(..., VRANGE_NOVOLATILE, ...)` and stores the number of purged pages.
///
/// # Safety
/// As [`vrange`]; `purged_pages` must be NULL or point to a writable size_t.
#[no_mangle]
pub unsafe extern "C" fn vrange_unmark(
    start: *mut libc::c_void,
    length: size_t,
    purged_pages: *mut size_t,
) -> ssize_t {
    guard(-1, || {
        // SAFETY: the caller owns the memory.
        let report = unsafe { vrange_core::unmark(start.cast(), length)? };
        if !purged_pages.is_null() {
            // SAFETY: the caller passes NULL or a writable size_t.
            unsafe { *purged_pages = report.purged };
        }
        Ok((report.pages * vrange_core::page_size()) as ssize_t)
    })
}

/// Drops vrange's state for `[start, start + length)` without touching the memory; returns 0 or
/// -1 with errno EINVAL. Async-signal-safe.
///
/// # Safety
/// Volatile pages of the range that stay mapped may still be discarded; the caller gives up
/// their content.
#[no_mangle]
pub unsafe extern "C" fn vrange_forget(start: *mut libc::c_void, length: size_t) -> c_int {
    guard(-1, || {
        // SAFETY: the caller gives up the range's content (documented contract).
        unsafe { vrange_core::forget(start.cast(), length)? };
        Ok(0)
    })
}

/// Places `len` bytes from `src` into the purged pages of `[dst, dst + len)` (SIGBUS-mode memory,
/// page-aligned), leaving present pages alone; returns 0 or -1 with errno (EINVAL: misaligned or
/// not SIGBUS-mode volatile memory; ENOMEM). Async-signal-safe.
///
/// # Safety
/// `src` must be readable for `len` bytes; `dst` memory the caller owns.
#[no_mangle]
pub unsafe extern "C" fn vrange_fill(
    dst: *mut libc::c_void,
    src: *const libc::c_void,
    len: size_t,
) -> c_int {
    guard(-1, || {
        if src.is_null() && len != 0 {
            return Err(Error::Os(libc::EFAULT));
        }
        // SAFETY: forwarded contract.
        unsafe { vrange_core::fill(dst.cast(), src.cast(), len)? };
        Ok(0)
    })
}
