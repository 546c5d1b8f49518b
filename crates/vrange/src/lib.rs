//! Volatile ranges for Linux userspace.
//!
//! Mark memory volatile and the kernel may discard it when memory is short; unmark it and learn
//! exactly which pages were lost. The classic `vrange()` semantics of the 2014 volatile-range
//! work, delivered on stock kernels with MADV_FREE and a witness-word proof of survival.
//!
//! ```
//! let region = vrange::Region::new(1 << 20)?;
//! let page = vrange::page_size();
//! // SAFETY: no reference into the region is live while it is volatile.
//! unsafe {
//!     region.as_ptr().write_bytes(7, region.len());
//!     region.mark_volatile(0, region.len())?;
//! }
//! // ... later, before using the data again:
//! let report = region.unmark(0, region.len())?;
//! if report.purged > 0 {
//!     // regenerate: purged pages read as zero
//! }
//! assert_eq!(report.pages, region.len() / page);
//! # Ok::<(), vrange::Error>(())
//! ```
//!
//! # Safety
//! `unsafe` is confined to `sys` (the kernel boundary), `witness` (the atomic proof), `shadow`
//! (the page-state table) and the range operations that dereference caller memory; each block
//! names the check it relies on.

#![deny(unsafe_op_in_unsafe_fn)]

mod error;
mod lazy;
mod region;
mod shadow;
mod span;
pub mod sys;
mod witness;

pub use error::{Error, Result};
pub use lazy::{forget, mark_volatile, unmark, volatile_pages};
pub use region::{Huge, Region};
pub use sys::mem::page_size;
pub use sys::probe::{features, Features, ThpMode};

/// What an unmark found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unmarked {
    /// Pages in the range.
    pub pages: usize,
    /// Pages that were volatile.
    pub volatile: usize,
    /// Pages whose content the kernel discarded while they were volatile; they read as zero.
    pub purged: usize,
}

impl Unmarked {
    /// Whether any content was lost (the C API's `*purged`).
    pub fn was_purged(&self) -> bool {
        self.purged > 0
    }
}

/// The classic two modes of `vrange()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The system may discard the pages under memory pressure.
    Volatile,
    /// Pin the pages again and report whether anything was discarded.
    NoVolatile,
}

/// The classic call on arbitrary private anonymous memory: marks or unmarks, returning the
/// bytes processed and, for [`Mode::NoVolatile`], what was purged.
///
/// # Errors
/// See [`mark_volatile`] and [`unmark`].
///
/// # Safety
/// See [`mark_volatile`] and [`unmark`].
pub unsafe fn vrange(start: *mut u8, len: usize, mode: Mode) -> Result<(usize, Unmarked)> {
    match mode {
        // SAFETY: forwarded contract.
        Mode::Volatile => unsafe { mark_volatile(start, len) }.map(|n| (n, Unmarked::default())),
        // SAFETY: forwarded contract.
        Mode::NoVolatile => unsafe { unmark(start, len) }.map(|u| (u.pages * page_size(), u)),
    }
}
