//! The C ABI of vrange, declared in `include/vrange.h`. No logic of its own: every function
//! validates its C arguments, calls the core and turns the result into a return value and
//! errno. No panic crosses this boundary: each entry point catches unwinding and reports
//! ENOTRECOVERABLE (an internal bug) instead.
//!
//! - `classic`: `vrange`, `vrange_unmark`, `vrange_forget`;
//! - `features`: `vrange_features`, `vrange_feature_flags`;
//! - `alloc`: `vrange_alloc`, `vrange_free`, `vrange_set_priority`, `vrange_shared_fd`,
//!   `vrange_map_shared` (their flags are decoded in `flags`; `regions` finds the region
//!   holding an address);
//! - `reclaimer`: `vrange_purge`, `vrange_stats`, `vrange_source_name`, `vrange_set_option`,
//!   `vrange_reclaimer_stop`;
//! - `cache`: `vrange_cache_create`, `_put`, `_get`, `_release`, `_remove`, `_stats`,
//!   `_destroy` (over `vrange-cache`);
//! - `vrange_sqlite_pcache` (below: SQLite's page cache, whose unpinned pages are volatile,
//!   is the `vrange-sqlite` crate's);
//! - `version`: `vrange_version`.

#![deny(unsafe_op_in_unsafe_fn)]

mod alloc;
mod cache;
mod classic;
mod features;
mod flags;
mod reclaimer;
mod regions;
mod version;

use libc::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use vrange_core::Error;

/// A page cache for SQLite whose unpinned pages are volatile, a `const struct
/// sqlite3_pcache_methods2 *` for `sqlite3_config(SQLITE_CONFIG_PCACHE2, ...)`: the
/// `vrange-sqlite` crate's table (libvrange does not link SQLite).
#[no_mangle]
pub extern "C" fn vrange_sqlite_pcache() -> *const libc::c_void {
    vrange_sqlite::methods()
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`, mapping `Err` to `fail` with its errno and a panic to `fail` with ENOTRECOVERABLE.
fn guard<T>(fail: T, f: impl FnOnce() -> Result<T, Error>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e.errno());
            fail
        }
        Err(_) => {
            set_errno(libc::ENOTRECOVERABLE);
            fail
        }
    }
}
