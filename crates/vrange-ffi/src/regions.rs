//! Naming a C caller's region to the core: `vrange_alloc` gives up the Rust handle, and the
//! functions taking an address inside a region borrow a handle for the region that holds it,
//! found with the core's region table ([`vrange_core::region_containing`]).

use std::mem::ManuallyDrop;
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

/// Runs `f` on the region that holds `addr` (its handle borrowed, never dropped).
///
/// # Errors
/// [`Error::NotRegion`] if no region holds `addr`; `f`'s errors.
pub fn with_region<T>(
    addr: usize,
    f: impl FnOnce(&VolatileRegion) -> Result<T, Error>,
) -> Result<T, Error> {
    let (start, len) = vrange_core::region_containing(addr as *const u8).ok_or(Error::NotRegion)?;
    // SAFETY: the handle is never dropped (ManuallyDrop), so it frees nothing; from_raw checks
    // that start and len name a live region. Freeing it concurrently from another thread is the
    // caller's race, as for any use-after-free.
    let region = ManuallyDrop::new(unsafe { VolatileRegion::from_raw(start, len)? });
    f(&region)
}
