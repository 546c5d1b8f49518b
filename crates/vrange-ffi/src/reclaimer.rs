//! Managed purging: `vrange_purge`, `vrange_stats` (with `vrange_source_name`),
//! `vrange_set_option` and `vrange_reclaimer_stop`.

use crate::{guard, set_errno};
use libc::{c_char, c_int, size_t};
use std::ffi::{CStr, CString};
use std::panic::catch_unwind;
use std::sync::OnceLock;
use vrange_core::{reclaimer as reclaim, Error, Source, SourceStats, Stats};

/// `VRANGE_SOURCE_COUNT`: the length of `struct vrange_stats::sources`.
const SOURCES: usize = Source::ALL.len();

/// `struct vrange_source_stats` of include/vrange.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VrangeSourceStats {
    pub events: u64,
    pub ranges: u64,
    pub bytes: u64,
    pub reaction_last_ns: u64,
    pub reaction_max_ns: u64,
    pub reaction_total_ns: u64,
    pub purging_events: u64,
}

/// `struct vrange_stats` of include/vrange.h. Later versions only append fields.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VrangeStats {
    pub size: u64,
    pub volatile_ranges: u64,
    pub volatile_bytes: u64,
    pub armed_ranges: u64,
    pub armed_bytes: u64,
    pub purged_ranges: u64,
    pub purged_bytes: u64,
    pub pinned_ranges: u64,
    pub pinned_bytes: u64,
    pub purged_total_bytes: u64,
    pub armed_total_bytes: u64,
    pub losses_reported: u64,
    pub reclaimer_running: u64,
    pub reclaimer_sources: u64,
    pub sources: [VrangeSourceStats; SOURCES],
    // Version 2 (appended): scratch and refill regions.
    pub scratch_regions: u64,
    pub scratch_bytes: u64,
    pub refill_fills: u64,
    pub refill_bytes: u64,
    pub refill_failures: u64,
    // Version 3 (appended).
    pub refill_recycled_bytes: u64,
    // Version 4 (appended).
    pub reserve_bytes: u64,
    pub refill_moved_bytes: u64,
}

/// The size of the first version of the struct (up to `sources`): the smallest `size` a caller
/// built against an older header passes.
const FIRST_VERSION_SIZE: usize = std::mem::offset_of!(VrangeStats, scratch_regions);

// The header's layout: 14 counters, then 7 sources of 7 counters, then 7 counters, no padding.
const _: () = assert!(std::mem::size_of::<VrangeStats>() == 8 * (14 + 7 * 7 + 8));
const _: () = assert!(FIRST_VERSION_SIZE == 8 * (14 + 7 * 7));
const _: () = assert!(SOURCES == 7);

impl From<&SourceStats> for VrangeSourceStats {
    fn from(s: &SourceStats) -> Self {
        VrangeSourceStats {
            events: s.events,
            ranges: s.ranges,
            bytes: s.bytes,
            reaction_last_ns: s.reaction_last_ns,
            reaction_max_ns: s.reaction_max_ns,
            reaction_total_ns: s.reaction_total_ns,
            purging_events: s.purging_events,
        }
    }
}

impl VrangeStats {
    fn new(s: &Stats, active: &[Source]) -> Self {
        VrangeStats {
            size: std::mem::size_of::<VrangeStats>() as u64,
            volatile_ranges: s.volatile_ranges,
            volatile_bytes: s.volatile_bytes,
            armed_ranges: s.armed_ranges,
            armed_bytes: s.armed_bytes,
            purged_ranges: s.purged_ranges,
            purged_bytes: s.purged_bytes,
            pinned_ranges: s.pinned_ranges,
            pinned_bytes: s.pinned_bytes,
            purged_total_bytes: s.purged_total_bytes,
            armed_total_bytes: s.armed_total_bytes,
            losses_reported: s.losses_reported,
            reclaimer_running: u64::from(s.reclaimer_running),
            reclaimer_sources: active.iter().fold(0, |acc, &src| acc | 1 << src as u8),
            sources: std::array::from_fn(|i| VrangeSourceStats::from(&s.sources[i])),
            scratch_regions: s.scratch_regions,
            scratch_bytes: s.scratch_bytes,
            refill_fills: s.refill_fills,
            refill_bytes: s.refill_bytes,
            refill_failures: s.refill_failures,
            refill_recycled_bytes: s.refill_recycled_bytes,
            reserve_bytes: s.reserve_bytes,
            refill_moved_bytes: s.refill_moved_bytes,
        }
    }
}

/// Purges up to `bytes` bytes of volatile managed ranges now (whole ranges, lowest class and
/// least recently used first); returns the bytes freed. 0 with errno ENOTRECOVERABLE on an
/// internal error.
#[no_mangle]
pub extern "C" fn vrange_purge(bytes: size_t) -> size_t {
    catch_unwind(|| vrange_core::purge(bytes)).unwrap_or_else(|_| {
        set_errno(libc::ENOTRECOVERABLE);
        0
    })
}

/// Fills `*out` with a snapshot of managed purging: `min(size, sizeof(struct vrange_stats))`
/// bytes, and zeros up to `size`; returns 0, or -1 with errno EINVAL for NULL or a `size`
/// smaller than the first version of the struct.
///
/// # Safety
/// `out` must be NULL or point to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn vrange_stats(out: *mut VrangeStats, size: size_t) -> c_int {
    guard(-1, || {
        if out.is_null() || size < FIRST_VERSION_SIZE {
            return Err(Error::BadFlags);
        }
        let ours = std::mem::size_of::<VrangeStats>();
        let written = size.min(ours);
        let mut snapshot = VrangeStats::new(&vrange_core::stats(), &reclaim::active_sources());
        snapshot.size = written as u64;
        // SAFETY: out points to size writable bytes (caller contract) and written <= size; the
        // copy is bytewise (no alignment assumed) from a local of ours >= written bytes; the
        // zeroed tail lies inside the caller's size bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&snapshot as *const VrangeStats).cast::<u8>(),
                out.cast::<u8>(),
                written,
            );
            out.cast::<u8>().add(written).write_bytes(0, size - written);
        }
        Ok(0)
    })
}

/// The short name of source `source` (a `VRANGE_SOURCE_*` value) as a static string, or NULL
/// with errno EINVAL.
#[no_mangle]
pub extern "C" fn vrange_source_name(source: c_int) -> *const c_char {
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    guard(std::ptr::null(), || {
        let names = NAMES.get_or_init(|| {
            Source::ALL
                .iter()
                .map(|s| CString::new(s.name()).expect("source names have no NUL"))
                .collect()
        });
        let i = usize::try_from(source).map_err(|_| Error::BadFlags)?;
        names.get(i).map(|n| n.as_ptr()).ok_or(Error::BadFlags)
    })
}

/// Sets reclaimer option `name` (a `VRANGE_*` environment variable name) to `value`; returns 0
/// or -1 with errno EINVAL.
///
/// # Safety
/// `name` and `value` must be NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn vrange_set_option(name: *const c_char, value: *const c_char) -> c_int {
    guard(-1, || {
        if name.is_null() || value.is_null() {
            return Err(Error::BadFlags);
        }
        // SAFETY: both are NUL-terminated strings (caller contract), not NULL (checked).
        let (name, value) = unsafe { (CStr::from_ptr(name), CStr::from_ptr(value)) };
        let (Ok(name), Ok(value)) = (name.to_str(), value.to_str()) else {
            return Err(Error::BadFlags);
        };
        vrange_core::set_option(name, value)?;
        Ok(0)
    })
}

/// Stops the reclaimer thread and waits for it to exit.
#[no_mangle]
pub extern "C" fn vrange_reclaimer_stop() {
    if catch_unwind(reclaim::stop).is_err() {
        set_errno(libc::ENOTRECOVERABLE);
    }
}
