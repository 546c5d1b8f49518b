//! Caches: `vrange_cache_create`, `vrange_cache_put`, `vrange_cache_get`,
//! `vrange_cache_release`, `vrange_cache_remove`, `vrange_cache_stats`, `vrange_cache_destroy`,
//! over `vrange_cache::Cache` with byte-string keys.

use crate::{flags, guard};
use libc::{c_int, c_void, size_t};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{null, null_mut};
use vrange_cache::{Cache, ClassStats, Miss, Options};
use vrange_core::{Error, Policy};

/// Set in every live cache handle and cleared on destroy: a stale or foreign pointer is
/// refused with EINVAL rather than used (a cheap check, not a guarantee).
const MAGIC: u64 = 0x7672_6361_6368_6531; // "vrcache1"

/// `struct vrange_cache` (opaque in C).
pub struct VrangeCache {
    magic: u64,
    cache: Cache<Box<[u8]>>,
}

/// `struct vrange_cache_options` of include/vrange.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VrangeCacheOptions {
    pub size: u64,
    pub slab_bytes: u64,
    pub budget: u64,
    pub flags: u64,
}

/// `struct vrange_cache_class_stats` of include/vrange.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VrangeCacheClassStats {
    pub hits: u64,
    pub inserts: u64,
    pub purged_lookups: u64,
    pub purged_entries: u64,
    pub purged_bytes: u64,
    pub resident_bytes: u64,
    pub value_bytes: u64,
    pub slabs: u64,
}

/// `struct vrange_cache_stats` of include/vrange.h. Later versions only append fields.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VrangeCacheStats {
    pub size: u64,
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
    pub purged_lookups: u64,
    pub resident_bytes: u64,
    pub value_bytes: u64,
    pub overhead_bytes: u64,
    pub purged_bytes: u64,
    pub dropped_purged: u64,
    pub classes: [VrangeCacheClassStats; 4],
}

const _: () = assert!(std::mem::size_of::<VrangeCacheOptions>() == 8 * 4);
const _: () = assert!(std::mem::size_of::<VrangeCacheStats>() == 8 * (10 + 4 * 8));

impl From<&ClassStats> for VrangeCacheClassStats {
    fn from(c: &ClassStats) -> Self {
        VrangeCacheClassStats {
            hits: c.hits,
            inserts: c.inserts,
            purged_lookups: c.purged_lookups,
            purged_entries: c.purged_entries,
            purged_bytes: c.purged_bytes,
            resident_bytes: c.resident_bytes,
            value_bytes: c.value_bytes,
            slabs: c.slabs,
        }
    }
}

fn to_options(o: &VrangeCacheOptions) -> Result<Options, Error> {
    let policy = match o.flags {
        0 => Policy::Hybrid,
        f if f == flags::VRANGE_MANAGED as u64 => Policy::Managed,
        _ => return Err(Error::BadFlags),
    };
    let defaults = Options::default();
    Ok(Options {
        slab_bytes: match o.slab_bytes {
            0 => defaults.slab_bytes,
            n => usize::try_from(n).map_err(|_| Error::Overflow)?,
        },
        policy,
        budget: match o.budget {
            0 => None,
            n => Some(usize::try_from(n).map_err(|_| Error::Overflow)?),
        },
    })
}

/// The cache behind a C handle.
///
/// # Safety
/// `c` must be NULL or a pointer from `vrange_cache_create` not yet destroyed.
unsafe fn cache<'a>(c: *const VrangeCache) -> Result<&'a Cache<Box<[u8]>>, Error> {
    // SAFETY: forwarded: NULL or a live handle.
    match unsafe { c.as_ref() } {
        Some(h) if h.magic == MAGIC => Ok(&h.cache),
        _ => Err(Error::BadFlags),
    }
}

/// `len` bytes at `p` (NULL only for `len == 0`).
///
/// # Safety
/// `p` must be readable for `len` bytes when not NULL.
unsafe fn bytes<'a>(p: *const c_void, len: size_t) -> Result<&'a [u8], Error> {
    if p.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(Error::BadFlags)
        };
    }
    // SAFETY: forwarded: readable for len bytes.
    Ok(unsafe { std::slice::from_raw_parts(p.cast(), len) })
}

/// Creates a cache (`options` may be NULL: the defaults). Returns it, or NULL with errno.
///
/// # Safety
/// `options` must be NULL or point to at least `options->size` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_create(
    options: *const VrangeCacheOptions,
) -> *mut VrangeCache {
    guard(null_mut(), || {
        let mut o = VrangeCacheOptions::default();
        // SAFETY: forwarded: NULL or readable.
        if let Some(given) = unsafe { options.as_ref() } {
            let size = given.size as usize;
            if size < std::mem::size_of::<u64>() * 2 {
                return Err(Error::BadFlags);
            }
            let n = size.min(std::mem::size_of::<VrangeCacheOptions>());
            // SAFETY: the caller's struct holds `size` bytes; we copy the ones we know.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    options.cast::<u8>(),
                    (&mut o as *mut VrangeCacheOptions).cast::<u8>(),
                    n,
                )
            };
        }
        let cache = Cache::new(to_options(&o)?);
        Ok(Box::into_raw(Box::new(VrangeCache {
            magic: MAGIC,
            cache,
        })))
    })
}

/// Destroys a cache. Values still held (not released) stay readable and are leaked.
///
/// # Safety
/// `c` must be NULL or a live handle; no other thread may use it during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_destroy(c: *mut VrangeCache) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: forwarded: NULL or a live handle, ours to destroy.
        if unsafe { cache(c) }.is_ok() {
            // SAFETY: as above; cleared so that a second destroy is refused.
            unsafe { (*c).magic = 0 };
            // SAFETY: made by Box::into_raw in vrange_cache_create.
            drop(unsafe { Box::from_raw(c) });
        }
    }));
}

/// Inserts a copy of `val` under `key` with class `priority` (0 or a `VRANGE_DROP_*` value).
/// Returns 0 or -1 with errno.
///
/// # Safety
/// `c` a live handle; `key` and `val` readable for their lengths.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_put(
    c: *mut VrangeCache,
    key: *const c_void,
    klen: size_t,
    val: *const c_void,
    vlen: size_t,
    priority: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let (cache, key, val) = unsafe { (cache(c)?, bytes(key, klen)?, bytes(val, vlen)?) };
        let priority = flags::set_priority_value(priority)?;
        let absurd = |e| match e {
            Error::Overflow => Error::Os(libc::ENOMEM),
            e => e,
        };
        cache
            .insert(Box::from(key), val, priority)
            .map_err(absurd)?;
        Ok(0)
    })
}

/// The value under `key`, pinned until `vrange_cache_release`, its length in `*vlen`; NULL
/// with errno ENOENT (absent) or ESTALE (purged; the entry is dropped).
///
/// # Safety
/// `c` a live handle; `key` readable for `klen`; `vlen` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_get(
    c: *mut VrangeCache,
    key: *const c_void,
    klen: size_t,
    vlen: *mut size_t,
) -> *const c_void {
    guard(null(), || {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, klen)?) };
        match cache.lookup(key) {
            Ok(e) => {
                let (ptr, len) = e.into_raw();
                // SAFETY: forwarded: NULL or writable.
                if let Some(out) = unsafe { vlen.as_mut() } {
                    *out = len;
                }
                Ok(ptr.cast())
            }
            Err(Miss::Absent) => Err(Error::Os(libc::ENOENT)),
            Err(Miss::Purged) => Err(Error::Os(libc::ESTALE)),
        }
    })
}

/// Releases a value from `vrange_cache_get`. Returns 0, or -1 with errno EINVAL.
///
/// # Safety
/// `c` a live handle; `value` a pointer `vrange_cache_get` returned for it, released once.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_release(c: *mut VrangeCache, value: *const c_void) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let cache = unsafe { cache(c)? };
        // SAFETY: forwarded: a value of this cache, not yet released (a pointer in no slab
        // with an outstanding raw pin is refused).
        unsafe { cache.release_raw(value.cast()) }?;
        Ok(0)
    })
}

/// Removes the entry under `key`. Returns 0, or -1 with errno ENOENT if there was none.
///
/// # Safety
/// `c` a live handle; `key` readable for `klen`.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_remove(
    c: *mut VrangeCache,
    key: *const c_void,
    klen: size_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, klen)?) };
        if cache.remove(key) {
            Ok(0)
        } else {
            Err(Error::Os(libc::ENOENT))
        }
    })
}

/// Fills `*out` (`size` bytes) with the cache's statistics. Returns 0 or -1 with errno.
///
/// # Safety
/// `c` a live handle; `out` NULL or writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_stats(
    c: *mut VrangeCache,
    out: *mut VrangeCacheStats,
    size: size_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let cache = unsafe { cache(c)? };
        if out.is_null() || size < std::mem::size_of::<u64>() * 2 {
            return Err(Error::BadFlags);
        }
        let s = cache.stats();
        let mut full = VrangeCacheStats {
            size: 0,
            entries: s.entries,
            hits: s.hits(),
            misses: s.misses,
            purged_lookups: s.purged_lookups(),
            resident_bytes: s.resident_bytes(),
            value_bytes: s.value_bytes(),
            overhead_bytes: s.overhead_bytes(),
            purged_bytes: s.purged_bytes(),
            dropped_purged: s.dropped_purged,
            classes: std::array::from_fn(|i| (&s.classes[i]).into()),
        };
        let n = size.min(std::mem::size_of::<VrangeCacheStats>());
        full.size = n as u64;
        // SAFETY: `out` is writable for `size` bytes (the contract); we write `n` <= size and
        // zero the rest.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&full as *const VrangeCacheStats).cast::<u8>(),
                out.cast::<u8>(),
                n,
            );
            std::ptr::write_bytes(out.cast::<u8>().add(n), 0, size - n);
        }
        Ok(0)
    })
}
