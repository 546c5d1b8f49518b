//! What the kernel offers: `vrange_features` (the report) and `vrange_feature_flags` (bits).

use crate::guard;
use libc::{c_char, size_t, ssize_t};
use std::panic::catch_unwind;

/// Writes the feature report (as `vrange features` prints it) into `buf`, NUL-terminated and
/// truncated to `len` bytes; returns the full length of the report (like snprintf).
///
/// # Safety
/// `buf` must be NULL (with `len` 0) or point to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn vrange_features(buf: *mut c_char, len: size_t) -> ssize_t {
    guard(-1, || {
        let text = vrange_core::features().to_string();
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
        let f = vrange_core::features();
        [
            f.madv_free,
            f.madv_pageout,
            f.madv_populate_write,
            matches!(
                f.thp,
                vrange_core::ThpMode::Always | vrange_core::ThpMode::Madvise
            ),
            f.pt_reclaim == Some(true),
            f.procmap_query,
            f.userfaultfd,
            f.map_droppable,
            f.process_madvise,
            f.psi,
            f.cgroup.is_some(),
            f.pagemap_scan,
            f.uffd_move,
        ]
        .iter()
        .enumerate()
        .fold(0u64, |acc, (bit, on)| acc | (u64::from(*on) << bit))
    })
    .unwrap_or(0)
}
