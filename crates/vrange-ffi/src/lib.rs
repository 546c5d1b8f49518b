//! The C ABI of vrange, declared in `include/vrange.h`. No logic of its own: every function
//! validates its C arguments, calls the core and turns the result into a return value and
//! errno. No panic crosses this boundary: each entry point catches unwinding and reports
//! ENOTRECOVERABLE (an internal bug) instead.

#![deny(unsafe_op_in_unsafe_fn)]

use libc::{c_char, c_int, size_t, ssize_t};
use std::panic::{catch_unwind, AssertUnwindSafe};
use vrange_core as core_api;
use vrange_core::Error;

/// `mode` value: the system may discard the pages under memory pressure.
pub const VRANGE_VOLATILE: c_int = 0;
/// `mode` value: pin the pages again; `*purged` says whether anything was discarded.
pub const VRANGE_NOVOLATILE: c_int = 1;

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`, mapping `Err` to -1 with errno and a panic to -1 with ENOTRECOVERABLE.
fn guard(f: impl FnOnce() -> Result<ssize_t, Error>) -> ssize_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            set_errno(e.errno());
            -1
        }
        Err(_) => {
            set_errno(libc::ENOTRECOVERABLE);
            -1
        }
    }
}

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
    guard(|| {
        let ptr = start as usize as *mut u8;
        match mode {
            VRANGE_VOLATILE => {
                // SAFETY: the caller owns the memory (documented contract of vrange()).
                let n = unsafe { core_api::mark_volatile(ptr, length)? };
                Ok(n as ssize_t)
            }
            VRANGE_NOVOLATILE => {
                // SAFETY: as above.
                let report = unsafe { core_api::unmark(ptr, length)? };
                if !purged.is_null() {
                    // SAFETY: the caller passes NULL or a writable int.
                    unsafe { *purged = c_int::from(report.was_purged()) };
                }
                Ok((report.pages * core_api::page_size()) as ssize_t)
            }
            _ => Err(Error::BadMode),
        }
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
    guard(|| {
        // SAFETY: the caller owns the memory.
        let report = unsafe { core_api::unmark(start.cast(), length)? };
        if !purged_pages.is_null() {
            // SAFETY: the caller passes NULL or a writable size_t.
            unsafe { *purged_pages = report.purged };
        }
        Ok((report.pages * core_api::page_size()) as ssize_t)
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
    // SAFETY: the caller gives up the range's content (documented contract).
    guard(|| unsafe { core_api::forget(start.cast(), length) }.map(|()| 0)) as c_int
}

/// Writes the feature report (as `vrange features` prints it) into `buf`, NUL-terminated and
/// truncated to `len` bytes; returns the full length of the report (like snprintf).
///
/// # Safety
/// `buf` must be NULL (with `len` 0) or point to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn vrange_features(buf: *mut c_char, len: size_t) -> ssize_t {
    guard(|| {
        let text = core_api::features().to_string();
        if !buf.is_null() && len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: buf has len >= n + 1 writable bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        Ok(text.len() as ssize_t)
    })
}

/// Feature bits; see `VRANGE_FEATURE_*` in include/vrange.h.
#[no_mangle]
pub extern "C" fn vrange_feature_flags() -> u64 {
    catch_unwind(|| {
        let f = core_api::features();
        [
            f.madv_free,
            f.madv_pageout,
            f.madv_populate_write,
            matches!(
                f.thp,
                core_api::ThpMode::Always | core_api::ThpMode::Madvise
            ),
            f.pt_reclaim == Some(true),
            f.procmap_query,
            f.userfaultfd,
            f.map_droppable,
            f.process_madvise,
            f.psi,
            f.cgroup.is_some(),
        ]
        .iter()
        .enumerate()
        .fold(0u64, |acc, (bit, on)| acc | (u64::from(*on) << bit))
    })
    .unwrap_or(0)
}
