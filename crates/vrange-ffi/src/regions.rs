//! Naming a C caller's region to the core: `vrange_alloc` gives up the Rust handle, and
//! `vrange_free` hands it back (the functions taking an address inside a region call the
//! core's, which look it up once in its region table).

use vrange_core::{Error, VolatileRegion};

/// Gives up `region` to the C caller. Returns its start and length.
pub fn hand_out(region: VolatileRegion) -> (*mut u8, usize) {
    region.into_raw()
}

/// Frees the region (managed, lazy, hybrid, shared, scratch or refill) that `ptr` and `len` name
/// exactly (`len` rounded up to a page).
///
/// # Errors
/// [`Error::NotRegion`] (and the core's other errors for bad input) if they name no region.
///
/// # Safety
/// The caller gives up the region: nothing may use it afterwards.
pub unsafe fn free(ptr: *mut u8, len: usize) -> Result<(), Error> {
    // SAFETY: forwarded contract: the caller owns the region and gives it up.
    unsafe { vrange_core::free_region(ptr, len) }
}
